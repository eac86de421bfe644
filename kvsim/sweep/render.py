"""Presenting a sweep: the rich table in the terminal and the JSON document."""
from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from kvsim.io.trace import Trace
from kvsim.sweep.curves import LRU_LIKE
from kvsim.sweep.run import SweepResult


def _tokens(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isinf(value)):
        return "inf"
    return f"{int(value):,}"


def _rate(value: Any) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2%}"


def _setting(row: dict[str, Any]) -> str:
    if row["policy"] == "apc":
        return f"apc b{row['block_size']}"
    if row["policy"] == "radix":
        return f"radix p{row['page_size']} {row['eviction_policy']}"
    return str(row["policy"])


def render_sweep(console: Console, result: SweepResult) -> None:
    """One table row per combination, then one line per one-pass curve."""
    frame = result.frame
    has_curve = "curve_hit_rate" in frame.columns
    has_opt = "optimal_hit_rate" in frame.columns
    title = "Sweep: token hit rate of exact replays (b = APC block, p = radix page); rej = rejected requests"
    if has_curve:
        title += "; 1-pass = one-pass curve, error = |1-pass - hit|"
    if has_opt:
        title += "; optimal = the most any cache of that size could hit (docs/optimal.md)"
    table = Table(title=title, title_justify="left")
    table.add_column("policy", no_wrap=True)
    for name in ("cap", "usable", "hit"):
        table.add_column(name, justify="right", no_wrap=True)
    if has_opt:
        table.add_column("optimal", justify="right", no_wrap=True)
    if has_curve:
        table.add_column("1-pass", justify="right", no_wrap=True)
        table.add_column("error", justify="right", no_wrap=True)
    table.add_column("rej", justify="right", no_wrap=True)
    table.add_column("s", justify="right", no_wrap=True)
    for row in frame.to_dict(orient="records"):
        cells = [_setting(row), str(row["capacity"]), _tokens(row["capacity_tokens"]),
                 _rate(row["token_hit_rate"])]
        if has_opt:
            cells.append(_rate(row.get("optimal_hit_rate")))
        if has_curve:
            est, err = row.get("curve_hit_rate"), row.get("curve_abs_error")
            cells += [_rate(est), "-" if err is None or math.isnan(err) else f"{err:.4f}"]
        cells += [f"{int(row['rejected']):,}", f"{row['replay_seconds']:.2f}"]
        table.add_row(*cells)
    console.print(table)
    for c in result.curves:
        what = ", ".join(f"{k} {v}" for k, v in c.settings.items() if k in ("block_size", "page_size", "granule"))
        console.print(f"[bold]one-pass curve[/] {c.policy} ({what}): max |error| {c.max_abs_error:.4f}, "
                      f"mean {c.mean_abs_error:.4f} over {c.points} point(s), {c.seconds:.2f} s; "
                      f"[dim]{c.exactness}[/]")
    skipped = [p for p in result.points if p.policy == "radix" and p.eviction_policy not in LRU_LIKE]
    if skipped and has_curve:
        console.print(f"[dim]No one-pass curve for radix eviction policies other than {', '.join(LRU_LIKE)}.[/]")
    for o in result.optimal:
        what = ", ".join(f"{k} {v}" for k, v in o.settings.items() if k in ("block_size", "page_size"))
        console.print(f"[bold]optimal curve[/] {o.engine} ({what}): {o.seconds:.2f} s; [dim]{o.exactness}[/]")
    if result.warmup is not None:
        console.print(f"[dim]Warm-up: the first {result.warmup['warmup_requests']:,} requests only warm the cache "
                      "and are left out of every figure.[/]")
    console.print(f"[dim]{len(frame)} combination(s) in {result.elapsed_s:.1f} s.[/]")


def sweep_json(trace: Trace, result: SweepResult, settings: dict[str, Any]) -> dict[str, Any]:
    """Everything the terminal shows, plus the smooth curves, as JSON (no prompt text)."""
    return {
        "trace": {"sources": trace.meta.sources, "formats": trace.meta.formats, "requests": len(trace),
                  "prompt_tokens": trace.num_prompt_tokens, "skipped_lines": trace.meta.skipped_lines},
        "settings": settings,
        **result.as_dict(),
    }
