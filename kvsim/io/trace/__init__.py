"""The columnar :class:`~kvsim.io.trace.columns.Trace`: its columns, how the readers' parts
are assembled into it, and how it is stored between commands (the trace cache, Parquet)."""
