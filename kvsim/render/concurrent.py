"""`kvsim simulate --replay steps|timed` in the terminal: the policies side by side, and for
timed replays the latencies with and without prefix caching on the same load."""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from kvsim.render.cells import cell

from kvsim.io.trace.columns import Trace
from kvsim.drive.concurrent import ConcurrentRun, ReplayMode, concurrent_summary
from kvsim.engines import registry

#: (summary key, label, format)
ROWS = [
    ("requests", "requests", "{:,}"),
    ("rejected", "rejected (never fit)", "{:,}"),
    ("prompt_tokens", "prompt tokens", "{:,}"),
    ("cached_tokens", "cached tokens (first admission)", "{:,}"),
    ("token_hit_rate", "token hit rate", "{:.2%}"),
    ("request_hit_rate", "request hit rate", "{:.2%}"),
    ("preemptions", "preemptions / retractions", "{:,}"),
    ("preempted_requests", "requests preempted", "{:,}"),
    ("steps", "scheduler steps", "{:,}"),
]
TIMED_ROWS = [
    ("ttft_p50_s", "TTFT p50 (s)", "{:.4f}"),
    ("ttft_p90_s", "TTFT p90 (s)", "{:.4f}"),
    ("ttft_p99_s", "TTFT p99 (s)", "{:.4f}"),
    ("e2e_p50_s", "E2E p50 (s)", "{:.4f}"),
    ("e2e_p90_s", "E2E p90 (s)", "{:.4f}"),
    ("e2e_p99_s", "E2E p99 (s)", "{:.4f}"),
    ("queueing_p99_s", "queueing p99 (s)", "{:.4f}"),
    ("output_tokens_per_s", "throughput (output tok/s)", "{:,.0f}"),
    ("gpu_busy_s", "GPU busy (s)", "{:,.3f}"),
    ("makespan_s", "makespan (s)", "{:,.3f}"),
    ("prefill_tokens_computed", "prefill tokens computed", "{:,}"),
]
#: the comparison with prefix caching off: (key, label, format)
SAVING_ROWS = [
    ("ttft_p50_s", "TTFT p50 (s)", "{:.4f}"),
    ("ttft_p99_s", "TTFT p99 (s)", "{:.4f}"),
    ("e2e_p50_s", "E2E p50 (s)", "{:.4f}"),
    ("e2e_p99_s", "E2E p99 (s)", "{:.4f}"),
    ("gpu_busy_s", "GPU busy (s)", "{:,.3f}"),
    ("prefill_tokens_computed", "prefill tokens computed", "{:,}"),
]


def render_concurrent(console: Console, trace: Trace, runs: dict[str, ConcurrentRun], mode: ReplayMode) -> None:
    """Print the side-by-side summary, the prefix-caching comparison (timed) and the settings used."""
    summaries = {name: concurrent_summary(r, trace) for name, r in runs.items()}
    table = Table(title=f"Concurrent replay ({mode.mode})", title_justify="left")
    table.add_column("")
    for name in runs:
        table.add_column(registry.engine(name).scheduler_label(), justify="right")
    rows = ROWS + (TIMED_ROWS if mode.mode == "timed" else [])
    for key, label, pattern in rows:
        table.add_row(label, *[cell(s.get(key), pattern) for s in summaries.values()])
    console.print(table)
    if mode.mode == "timed":
        _render_saving(console, summaries)
    console.print(f"[dim]Replay: {mode.mode} ({'engine-step clock' if mode.mode == 'steps' else 'modelled time'}); "
                  f"arrivals from {mode.describe_arrivals()}.[/]")
    for name, r in runs.items():
        console.print(f"[dim]{name}: {_settings_line(r)}; defaults: {r.defaults}.[/]")
        if r.cost:
            console.print(f"[dim]{name}: step cost = {r.cost}.[/]")
    if trace.meta.skipped_lines:
        console.print(f"[yellow]{trace.meta.skipped_lines} bad input line(s) skipped[/]")


def _render_saving(console: Console, summaries: dict[str, dict[str, Any]]) -> None:
    t = Table(title="Prefix caching on vs off (same load)", title_justify="left")
    t.add_column("")
    for name in summaries:
        for head in ("on", "off", "saved"):
            t.add_column(f"{name} {head}", justify="right")
    for key, label, pattern in SAVING_ROWS:
        cells = []
        for s in summaries.values():
            off = s["without_prefix_caching"][key]
            cells += [cell(s[key], pattern), cell(off, pattern), cell(off - s[key], pattern)]
        t.add_row(label, *cells)
    console.print(t)


def _settings_line(r: ConcurrentRun) -> str:
    return r.settings.describe()
