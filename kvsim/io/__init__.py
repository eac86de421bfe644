"""Reading prompt logs into a columnar :class:`~kvsim.io.trace.columns.Trace`, by stage.

``load.py`` is the entry point (``kvsim.load_trace``): ``source.py`` opens files,
``detect.py`` picks the format, ``readers/`` parse one module per input format (with the
compiled token-id scanner ``token_scan.py``), ``tokenize/`` turns chat messages
into the token ids a serving engine would prefill, and ``trace/`` assembles the columns and
stores them between commands.
"""
