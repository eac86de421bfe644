"""Reading prompt logs into a columnar :class:`~kvsim.io.trace.Trace`.

``load.py`` is the entry point (``kvsim.load_trace``); ``readers/`` holds one module per
input format; ``tokenizers.py`` and ``templates.py`` turn chat messages into the token ids a
serving engine would prefill; ``builder.py`` assembles the columns.
"""
