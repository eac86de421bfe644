"""One thread pool for reading work that runs outside the GIL (compiled scanning, tokenization)."""
from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor


def workers() -> int:
    """Threads to use: one per core (at most 8)."""
    return max(1, min(os.cpu_count() or 1, 8))


@functools.lru_cache(maxsize=1)
def executor() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers(), thread_name_prefix="kvsim-io")
