"""`kvsim simulate` in the terminal: the policies side by side, per-group hit rates, the tree."""
from __future__ import annotations

from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from kvsim.render.cells import cell

from kvsim.io.trace.columns import Trace
from kvsim.drive.metrics import breakdowns, summarize
from kvsim.engines.options import SimOptions
from kvsim.drive.result import ReplayResult

#: rows of the side-by-side table: (summary key, label, format)
ROWS = [
    ("requests", "requests", "{:,}"),
    ("rejected", "rejected (never fit)", "{:,}"),
    ("prompt_tokens", "prompt tokens", "{:,}"),
    ("cached_tokens", "cached (saved) tokens", "{:,}"),
    ("computed_tokens", "computed prefill tokens", "{:,}"),
    ("token_hit_rate", "token hit rate", "{:.2%}"),
    ("vllm_logged_hit_rate", "vLLM logged hit rate", "{:.2%}"),
    ("sglang_logged_hit_rate", "SGLang logged hit rate", "{:.2%}"),
    ("cache_reads_skipped", "cache reads skipped (logprobs)", "{:,}"),
    ("request_hit_rate", "request hit rate", "{:.2%}"),
    ("mean_cached_fraction", "mean cached fraction", "{:.2%}"),
    ("evictions", "evictions (blocks / leaves)", "{:,}"),
    ("evicted_tokens", "evicted tokens", "{:,}"),
    ("capacity_tokens", "capacity (tokens)", "{:,}"),
    ("peak_used_tokens", "peak KV held (tokens)", "{:,}"),
    ("prefill_gpu_seconds_saved", "prefill GPU-s saved (est.)", "{:,.2f}"),
    ("mean_ttft_prefill_seconds", "mean prefill TTFT (est., s)", "{:.4f}"),
    ("replay_seconds", "replay time (s)", "{:.3f}"),
]


def _fmt(value: Any, pattern: str) -> str:
    return cell(value, pattern, "unlimited" if pattern == "{:,}" else "-")


def render_simulation(console: Console, trace: Trace, runs: dict[str, ReplayResult], options: SimOptions,
                      calibration: Any = None) -> None:
    """Print the side-by-side summary and the per-group breakdowns."""
    summaries = {name: summarize(r, trace, calibration) for name, r in runs.items()}
    table = Table(title="Simulated prefix caching", title_justify="left")
    table.add_column("")
    for name, r in runs.items():
        table.add_column(_policy_label(name, r), justify="right")
    for key, label, pattern in ROWS:
        if not any(key in s for s in summaries.values()):
            continue
        table.add_row(label, *[_fmt(s.get(key), pattern) if key in s else "-" for s in summaries.values()])
    console.print(table)
    if all(r.capacity_tokens is None for r in runs.values()):
        console.print("[dim]No capacity given: the cache is unlimited (upper bound). Use --capacity, "
                      "--num-gpu-blocks, --max-total-tokens, --kv-cache-memory or --model with --gpu.[/]")
    if options.gpu and not (options.num_gpu_blocks or options.max_total_tokens or options.capacity_tokens
                            or options.kv_cache_memory):
        console.print("[dim]Capacity derived from --model and --gpu is an estimate: both engines measure the "
                      "memory left for KV with a profiling pass at start-up.[/]")
    if trace.meta.skipped_lines:
        console.print(f"[yellow]{trace.meta.skipped_lines} bad input line(s) skipped[/]")
    _render_breakdowns(console, trace, runs)
    for name, r in runs.items():
        tree = r.extra.get("tree")
        if isinstance(tree, dict):
            console.print(f"[bold]{name} tree at the end:[/] " + ", ".join(
                f"{k.replace('_', ' ')} {v:,}" for k, v in tree.items() if isinstance(v, int)))


def _render_breakdowns(console: Console, trace: Trace, runs: dict[str, ReplayResult]) -> None:
    """One table per grouping (tenant, salt, adapter), policies side by side."""
    shown: list[np.ndarray] = []
    per_policy = {name: breakdowns(r, trace) for name, r in runs.items()}
    for column in ("tenant", "cache_salt", "lora"):
        frames = {name: b[column] for name, b in per_policy.items() if column in b}
        if not frames:
            continue
        codes = getattr(trace, column)
        if any(_same_grouping(codes, other) for other in shown):
            continue  # e.g. one salt per tenant: the table would repeat the tenant table
        shown.append(codes)
        first = next(iter(frames.values()))
        t = Table(title=f"By {column.replace('_', ' ')}", title_justify="left")
        t.add_column(column, overflow="fold")
        t.add_column("requests", justify="right")
        t.add_column("prompt tokens", justify="right")
        for name in frames:
            t.add_column(f"{name} hit rate", justify="right")
        for group in first.index:
            t.add_row(str(group), f"{int(first.loc[group, 'requests']):,}",
                      f"{int(first.loc[group, 'prompt_tokens']):,}",
                      *[f"{f.loc[group, 'token_hit_rate']:.2%}" for f in frames.values()])
        console.print(t)


def _same_grouping(a, b) -> bool:
    """True when two code columns split the requests into exactly the same groups."""
    pairs = np.unique(np.stack([a, b]), axis=1)
    return len(pairs[0]) == len(np.unique(a)) == len(np.unique(b))


def _policy_label(name: str, r: ReplayResult) -> str:
    from kvsim.engines import registry

    return registry.engine(name).describe(r.config)
