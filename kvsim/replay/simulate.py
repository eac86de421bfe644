"""Run several policies on one trace and present the results (terminal, JSON, JSONL)."""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kvsim.cache.registry import get_replayer
from kvsim.io.trace import Trace
from kvsim.replay.metrics import breakdowns, per_request_frame, summarize
from kvsim.replay.options import SimOptions
from kvsim.replay.result import ReplayResult

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


def run_simulation(trace: Trace, policies: list[str], options: SimOptions,
                   progress: bool = False) -> dict[str, ReplayResult]:
    """Replay ``trace`` through each policy; a progress bar per policy when asked."""
    trace.require_tokens("simulate")
    results: dict[str, ReplayResult] = {}
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   transient=True) if progress and len(trace) >= 2000 else None
    with bar or nullcontext():
        for name in policies:
            replay = get_replayer(name)
            if bar is None:
                results[name] = replay(trace, options)
                continue
            task = bar.add_task(f"replaying ({name})", total=len(trace))
            # replays report progress(done, total)
            results[name] = replay(trace, options, progress=lambda done, total, t=task: bar.update(t, completed=done))
            bar.update(task, completed=len(trace))
    return results


def _fmt(value: Any, pattern: str) -> str:
    if value is None:
        return "unlimited" if pattern == "{:,}" else "-"
    try:
        return pattern.format(value)
    except (ValueError, TypeError):
        return str(value)


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
        console.print("[dim]No capacity given: the cache is unlimited (upper bound). Use --capacity-tokens, "
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
    import numpy as np

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
    import numpy as np

    pairs = np.unique(np.stack([a, b]), axis=1)
    return len(pairs[0]) == len(np.unique(a)) == len(np.unique(b))


def _policy_label(name: str, r: ReplayResult) -> str:
    if name == "apc":
        return f"vLLM APC (block {r.config.get('block_size', '?')})"
    if name == "radix":
        return f"SGLang radix (page {r.config.get('page_size', '?')}, {r.config.get('eviction_policy', 'lru')})"
    return name


def simulation_json(trace: Trace, runs: dict[str, ReplayResult], options: SimOptions,
                    calibration: Any = None) -> dict[str, Any]:
    """Everything the terminal shows, as JSON (no prompt text)."""
    return {
        "trace": {
            "sources": trace.meta.sources, "formats": trace.meta.formats, "requests": len(trace),
            "prompt_tokens": trace.num_prompt_tokens, "tokenizer": trace.meta.tokenizer,
            "chat_template": trace.meta.chat_template, "skipped_lines": trace.meta.skipped_lines,
        },
        "options": options.as_dict(),
        "policies": {
            name: {
                "summary": summarize(r, trace, calibration),
                "config": r.config,
                "breakdowns": {c: f.reset_index().to_dict(orient="records") for c, f in breakdowns(r, trace).items()},
                "extra": {k: v for k, v in r.extra.items() if _is_plain(v)},
            }
            for name, r in runs.items()
        },
    }


def per_request_rows(trace: Trace, runs: dict[str, ReplayResult]) -> Iterator[dict[str, Any]]:
    """One dict per request (per policy when several), in input order."""
    for name, r in runs.items():
        frame = per_request_frame(r, trace)
        for row in frame.to_dict(orient="records"):
            if len(runs) > 1:
                row = {"policy": name, **row}
            yield row


def _is_plain(value: Any) -> bool:
    import json

    from kvsim.outputs import _jsonable

    try:
        json.dumps(value, default=_jsonable)
        return True
    except TypeError:
        return False
