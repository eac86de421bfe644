"""`kvsim inspect` in the terminal: one column per input file, counts only, never text."""
from __future__ import annotations

from pathlib import Path

from rich.console import Group
from rich.table import Table
from rich.text import Text

from kvsim.io.summary import distinct, summarize
from kvsim.io.trace.columns import Trace


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
                     f"{distinct(trace.session):,}", f"{distinct(trace.tenant):,}",
                     f"{distinct(trace.cache_salt):,}", f"{distinct(trace.lora):,}",
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
