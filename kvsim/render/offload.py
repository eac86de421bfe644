"""An offload tier in the terminal: where the cached tokens came from, what moved, whether it paid.

Printed after the summary of ``kvsim simulate --offload ...``, one section per policy, from its
``offload`` summary (:meth:`kvsim.tiers.report.TierRun.summary`, plus the load-against-recompute
figures and, in ``--replay timed``, the TTFT without the tier).
"""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from kvsim.render.cells import cell

ROWS = [
    ("capacity_tokens", "capacity (tokens)", "{:,}"),
    ("hit_tokens", "cached tokens from it", "{:,}"),
    ("hit_rate", "share of prompt tokens", "{:.2%}"),
    ("hit_requests", "requests it served", "{:,}"),
    ("stored_tokens", "tokens stored", "{:,}"),
    ("stored_bytes", "bytes stored", "{:,}"),
    ("loaded_tokens", "tokens loaded", "{:,}"),
    ("loaded_bytes", "bytes loaded", "{:,}"),
    ("evicted_tokens", "tokens evicted", "{:,}"),
    ("store_failures", "store failures (tier full)", "{:,}"),
    ("skipped_by_threshold_tokens", "not stored (store threshold)", "{:,}"),
]
NAMES = {"gpu": "GPU", "cpu": "CPU", "disk": "disk"}


def render_offload(console: Console, label: str, o: dict[str, Any]) -> None:
    """One policy's tier section: per tier hits and transfers, the verdicts, timed TTFT without the tier."""
    console.print(f"[bold]Offload tier ({label}):[/] {o['description']}.")
    tiers = o["tiers"]
    table = Table(title_justify="left")
    table.add_column("")
    for t in tiers:
        table.add_column(NAMES.get(t, t), justify="right")
    for key, heading, pattern in ROWS:
        if any(key in row for row in tiers.values()):
            table.add_row(heading, *[cell(row.get(key), pattern) for row in tiers.values()])
    console.print(table)
    console.print(f"  {o['offloaded_hit_rate']:.2%} of the prompt tokens came from the tier "
                  f"({o['offloaded_hit_tokens']:,} tokens).")
    if not o.get("bytes_per_token"):
        console.print("[dim]  Bytes and transfer times need --model (KV bytes per token).[/]")
    costs = o.get("transfer")
    if costs:
        console.print(f"  Loading took {costs['load_seconds']:.3g} s over the link against {costs['recompute_seconds']:.3g} s "
                      f"to recompute the same tokens ({costs['requests_loading']:,} requests; "
                      f"{costs['loads_slower_than_recompute']:,} slower than recompute).")
    notes = list(o.get("notes", [])) + ([costs["note"]] if costs and costs.get("note") else [])
    for note in notes:
        console.print(f"  [yellow]{note}[/]")
    with_, without = o.get("with_tier"), o.get("without_tier")
    if with_ and without:
        console.print(f"  TTFT with the tier: mean {with_['ttft_mean_s']:.3f} s, p50 {with_['ttft_p50_s']:.3f} s, "
                      f"p90 {with_['ttft_p90_s']:.3f} s; without it: mean {without['ttft_mean_s']:.3f} s, "
                      f"p50 {without['ttft_p50_s']:.3f} s, p90 {without['ttft_p90_s']:.3f} s.")
        if without["ttft_mean_s"] > 0:
            change = with_["ttft_mean_s"] / without["ttft_mean_s"] - 1
            console.print(f"  The tier changes mean TTFT by {change:+.1%}.")
