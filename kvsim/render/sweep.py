"""A sweep in the terminal: one row per combination, one line per one-pass curve."""
from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from kvsim.sweep.run import SweepResult


def _tokens(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isinf(value)):
        return "inf"
    return f"{int(value):,}"


def _rate(value: Any) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2%}"


LOAD_HEADERS = {"concurrent_hit_rate": "under load", "ttft_p50_s": "TTFT p50", "ttft_p90_s": "TTFT p90"}


def _load_cell(name: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if name == "concurrent_hit_rate":
        return _rate(value)
    return f"{value * 1e3:,.1f} ms"


def _setting(row: dict[str, Any]) -> str:
    from kvsim.engines import registry

    return registry.engine(row["policy"]).setting_label(row)


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
    load = [c for c in LOAD_HEADERS if c in frame.columns]   # preemptions: in the CSV and JSON
    if load:
        title += "; under load = hit rate of the scheduler model replaying the log as it arrived"
    table = Table(title=title, title_justify="left")
    table.add_column("policy", no_wrap=True)
    for name in ("cap", "usable", "hit"):
        table.add_column(name, justify="right", no_wrap=True)
    if has_opt:
        table.add_column("optimal", justify="right", no_wrap=True)
    if has_curve:
        table.add_column("1-pass", justify="right", no_wrap=True)
        table.add_column("error", justify="right", no_wrap=True)
    for name in load:
        table.add_column(LOAD_HEADERS[name], justify="right", no_wrap=True)
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
        cells += [_load_cell(name, row.get(name)) for name in load]
        cells += [f"{int(row['rejected']):,}", f"{row['replay_seconds']:.2f}"]
        table.add_row(*cells)
    console.print(table)
    for c in result.curves:
        what = ", ".join(f"{k} {v}" for k, v in c.settings.items() if k in ("block_size", "page_size", "granule"))
        console.print(f"[bold]one-pass curve[/] {c.policy} ({what}): max |error| {c.max_abs_error:.4f}, "
                      f"mean {c.mean_abs_error:.4f} over {c.points} point(s), {c.seconds:.2f} s; "
                      f"[dim]{c.exactness}[/]")
    from kvsim.engines import registry

    skipped = sorted({p.policy for p in result.points if not registry.engine(p.policy).curve_applies(p.label())})
    if skipped and has_curve:
        console.print(f"[dim]No one-pass curve for {' or '.join(registry.engine(p).curve_gap() for p in skipped)}.[/]")
    for o in result.optimal:
        what = ", ".join(f"{k} {v}" for k, v in o.settings.items() if k in ("block_size", "page_size"))
        console.print(f"[bold]optimal curve[/] {o.engine} ({what}): {o.seconds:.2f} s; [dim]{o.exactness}[/]")
    if result.warmup is not None:
        console.print(f"[dim]Warm-up: the first {result.warmup['warmup_requests']:,} requests only warm the cache "
                      "and are left out of every figure.[/]")
    console.print(f"[dim]{len(frame)} combination(s) in {result.elapsed_s:.1f} s.[/]")


#: the tier columns of ``kvsim sweep --offload-size`` in the terminal: (column, heading, format); the CSV has all
OFFLOAD_COLUMNS = [
    ("offload_size", "size", "{}"),
    ("offload_size_tokens", "CPU tokens", "{:,}"),
    ("disk_size_tokens", "disk tokens", "{:,}"),
    ("gpu_hit_rate", "GPU", "{:.1%}"),
    ("cpu_hit_rate", "CPU", "{:.1%}"),
    ("disk_hit_rate", "disk", "{:.1%}"),
    ("token_hit_rate", "hit", "{:.1%}"),
    ("tier_gain", "gain", "{:+.1%}"),
    ("concurrent_hit_rate", "load", "{:.1%}"),
    ("ttft_p90_s", "p90 s", "{:.3f}"),
    ("ttft_p90_without_tier_s", "p90 w/o", "{:.3f}"),
]


def render_offload_sweep(console: Console, frame) -> None:
    """The tier rows of a sweep: per setting and capacity, one table of the tier sizes."""
    from kvsim.render.cells import cell

    columns = [c for c in OFFLOAD_COLUMNS if c[0] in frame.columns and frame[c[0]].notna().any()]
    if "disk_size_tokens" in frame.columns and not (frame["disk_size_tokens"] > 0).any():
        columns = [c for c in columns if c[0] not in ("disk_size_tokens", "disk_hit_rate")]
    rows = frame.to_dict(orient="records")
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row.get("setting", row.get("policy", "")), row.get("capacity_tokens")), []).append(row)
    backend = rows[0]["offload"] if rows else ""
    console.print(f"[bold]Memory tiers[/] (--offload {backend}): token shares of the prompt tokens served from each "
                  "tier; hit = their sum")
    for (setting, cap), members in groups.items():
        table = Table(title=f"{setting}, GPU capacity {_tokens(cap)} tokens", title_justify="left")
        for key, heading, _ in columns:
            table.add_column(heading, no_wrap=True, justify="left" if key == "offload_size" else "right")
        for row in members:
            table.add_row(*[cell(row.get(key), pattern) for key, _, pattern in columns])
        console.print(table)
    legend = {"size": "--offload-size as given (0: no tier)", "CPU tokens": "the CPU tier the engine derived",
              "gain": "hit rate over the row without a tier", "load": "hit rate under load (with the tier)",
              "p90 s": "TTFT p90 with the tier", "p90 w/o": "without it"}
    console.print("[dim]" + "; ".join(f"{h}: {legend[h]}" for _, h, _ in columns if h in legend)
                  + " (--csv for every column).[/]")
