"""Per-file summary of a loaded trace (``kvsim inspect``): counts only, never text."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvsim.io.trace.columns import NONE, Trace


@dataclass
class SourceSummary:
    source: str
    format: str
    requests: int
    prompt_tokens: int
    output_tokens: int
    known_outputs: int
    sessions: int
    tenants: int
    salts: int
    adapters: int
    skipped: int


def distinct(col: np.ndarray) -> int:
    """Distinct named values (tenants, salts, ...) in a code column."""
    return int(np.unique(col[col != NONE]).size)


def summarize(trace: Trace) -> list[SourceSummary]:
    """One summary per input file (requests are stored file after file, in order)."""
    meta = trace.meta
    counts = meta.source_requests or [len(trace)]
    sources = meta.sources or ["(trace)"]
    formats = meta.formats or ["?"] * len(sources)
    skipped = meta.source_skipped or [meta.skipped_lines] + [0] * (len(sources) - 1)
    out, start = [], 0
    for src, fmt, n, sk in zip(sources, formats, counts, skipped):
        sl = slice(start, start + n)
        out.append(SourceSummary(
            source=src, format=fmt, requests=n,
            prompt_tokens=int(trace.offsets[start + n] - trace.offsets[start]),
            output_tokens=int(trace.output_lengths[sl].sum()),
            known_outputs=int(trace.output_known[sl].sum()),
            sessions=distinct(trace.session[sl]), tenants=distinct(trace.tenant[sl]),
            salts=distinct(trace.cache_salt[sl]), adapters=distinct(trace.lora[sl]), skipped=sk,
        ))
        start += n
    return out
