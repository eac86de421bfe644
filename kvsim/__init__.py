"""kvsim: prefix-cache workload analyzer and faithful vLLM APC / SGLang RadixAttention simulator."""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["Trace", "__version__", "load_trace"]

from kvsim.kernels import compile_cache as _compile_cache  # noqa: E402

_compile_cache.install()  # numba caches kvsim's kernels in the user cache folder (before numba loads)


def __getattr__(name: str):
    # Lazy public API: importing kvsim (and `kvsim --help`) does not import numpy.
    if name == "load_trace":
        from kvsim.io.load import load_trace

        return load_trace
    if name == "Trace":
        from kvsim.io.trace.columns import Trace

        return Trace
    raise AttributeError(name)
