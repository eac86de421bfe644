"""Per-file summary of a loaded trace (``kvsim inspect``): counts only, never text."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from kvsim.io.trace import NONE, Trace


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


def _distinct(col: np.ndarray) -> int:
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
            sessions=_distinct(trace.session[sl]), tenants=_distinct(trace.tenant[sl]),
            salts=_distinct(trace.cache_salt[sl]), adapters=_distinct(trace.lora[sl]), skipped=sk,
        ))
        start += n
    return out


def summary_table(trace: Trace) -> Group:
    """A rich table (one column per file, plus a total) and the meta lines under it."""
    rows = summarize(trace)
    table = Table(title="Input", title_justify="left")
    table.add_column("")
    names = [Path(r.source).name for r in rows]
    for name in names:
        table.add_column(name, justify="right", overflow="fold")
    cols: list[list[str]] = [[r.format, f"{r.requests:,}", f"{r.prompt_tokens:,}", f"{r.output_tokens:,}",
                              f"{r.known_outputs:,}", f"{r.sessions:,}", f"{r.tenants:,}", f"{r.salts:,}",
                              f"{r.adapters:,}", f"{r.skipped:,}"] for r in rows]
    if len(rows) > 1:
        table.add_column("total", justify="right", style="bold")
        cols.append(["", f"{len(trace):,}", f"{trace.num_prompt_tokens:,}",
                     f"{int(trace.output_lengths.sum()):,}", f"{int(trace.output_known.sum()):,}",
                     f"{_distinct(trace.session):,}", f"{_distinct(trace.tenant):,}",
                     f"{_distinct(trace.cache_salt):,}", f"{_distinct(trace.lora):,}",
                     f"{trace.meta.skipped_lines:,}"])
    labels = ("format", "requests", "prompt tokens", "output tokens", "known output ids", "sessions",
              "tenants", "cache salts", "LoRA adapters", "skipped lines")
    for k, label in enumerate(labels):
        table.add_row(label, *(c[k] for c in cols))
    meta = trace.meta
    lines = [
        f"tokenizer: {meta.tokenizer or '- (no text tokenized)'}",
        f"chat template: {meta.chat_template or '- (no messages rendered)'}",
    ]
    if meta.hash_block_size:
        lines.append(f"hash-id block size: {meta.hash_block_size} tokens (prompt tokens synthesized from the ids)")
    if not trace.has_tokens:
        lines.append("prefix information: NONE (lengths and arrival times only)")
    if meta.skipped_lines:
        lines.append(f"skipped: {meta.skipped_lines:,} bad line(s)")
    out: list = [table, *(Text(s) for s in lines)]
    out += [Text(f"note: {n}", style="yellow") for n in meta.notes]
    return Group(*out)
