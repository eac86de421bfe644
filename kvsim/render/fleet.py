"""A fleet replay in the terminal: the attribution (routing or memory?), the replicas side by side.

Printed after the usual summary table of ``kvsim simulate``, one section per policy, from
its ``fleet`` summary (:func:`kvsim.fleet.summary.fleet_summary`); and the fleet table of
``kvsim sweep --replicas``.
"""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from kvsim.render.cells import cell

#: per-replica columns: (key, heading, format)
REPLICA_COLUMNS = [
    ("requests", "reqs", "{:,}"),
    ("prompt_tokens", "tokens", "{:,}"),
    ("token_hit_rate", "hit", "{:.1%}"),
    ("routed_bound_hit_rate", "bound", "{:.1%}"),
    ("peak_running", "run", "{:,}"),
    ("peak_waiting", "wait", "{:,}"),
    ("ttft_p50_s", "p50 s", "{:.3f}"),
    ("ttft_p90_s", "p90 s", "{:.3f}"),
    ("ttft_p99_s", "p99 s", "{:.3f}"),
]
#: what the short headings mean, said under the table
LEGEND = {"hit": "delivered hit rate", "bound": "routed bound", "run": "peak running", "wait": "peak waiting",
          "p50 s": "TTFT percentiles"}


def verdict(f: dict[str, Any]) -> str:
    """Which gap is larger, in words, and what it points at."""
    routing, memory = f["routing_gap"], f["memory_gap"]
    if f["larger_gap"] == "neither":
        return "Neither routing nor memory loses more than half a point: the fleet delivers its bound."
    if f["larger_gap"] == "routing":
        return (f"The larger gap is [bold]routing[/] ({routing:.1%} lost to requests landing away from their "
                f"prefix, {memory:.1%} to memory): a prefix-aware router (or session affinity) would recover more "
                "than more KV memory would.")
    return (f"The larger gap is [bold]memory[/] ({memory:.1%} lost to eviction, {routing:.1%} to routing): more KV "
            "capacity per replica (or fewer, larger replicas) would recover more than a better router would.")


def render_fleet(console: Console, name: str, label: str, f: dict[str, Any]) -> None:
    """One policy's fleet section: the three rates, the verdict, the replicas, the imbalance."""
    opts = ", ".join(f"{k}={v}" for k, v in f["router_options"].items())
    router = f["router"] + (f" ({opts})" if opts else "") + (" (the default; --router to choose)"
                                                              if f.get("router_defaulted") else "")
    cap, total = f["capacity_tokens_per_replica"], f["capacity_tokens_total"]
    capacity = "unlimited" if cap is None else f"{cap:,} tokens per replica, {total:,} in all"
    console.print(f"[bold]Fleet ({label}):[/] {f['replicas']} replicas behind {router}; KV capacity {capacity}.")
    console.print(f"  fleet bound {f['fleet_bound_hit_rate']:.2%} (one unlimited cache for the fleet) -> "
                  f"routed bound {f['routed_bound_hit_rate']:.2%} (an unlimited cache per replica) -> "
                  f"delivered {f['token_hit_rate']:.2%}")
    console.print("  " + verdict(f))
    per = f["per_replica"]
    columns = [c for c in REPLICA_COLUMNS if any(c[0] in row for row in per)]
    table = Table(title=f"Replicas ({name})", title_justify="left")
    table.add_column("#", justify="right")
    for _, heading, _ in columns:
        table.add_column(heading, justify="right")
    for row in per:
        table.add_row(str(row["replica"]), *[cell(row.get(key), pattern) for key, _, pattern in columns])
    console.print(table)
    legend = "; ".join(f"{h}: {LEGEND[h]}" for _, h, _ in columns if h in LEGEND)
    imb = f["load_imbalance"]
    console.print(f"[dim]{legend}.[/]")
    console.print(f"[dim]Load imbalance (max / mean per replica): {imb['requests']:.2f}x requests, "
                  f"{imb['prompt_tokens']:.2f}x prompt tokens.[/]")
    if "note" in f:
        console.print(f"[yellow]Note:[/] {f['note']}.")


#: the fleet columns of ``kvsim sweep --replicas`` in the terminal: (column, heading, format); the CSV has all
SWEEP_COLUMNS = [
    ("replicas", "N", "{}"),
    ("router", "router", "{}"),
    ("fleet_bound_hit_rate", "fleet", "{:.1%}"),
    ("routed_bound_hit_rate", "routed", "{:.1%}"),
    ("token_hit_rate", "deliv", "{:.1%}"),
    ("concurrent_hit_rate", "load", "{:.1%}"),
    ("ttft_p90_s", "p90 s", "{:.3f}"),
    ("larger_gap", "gap", "{}"),
]


def render_fleet_sweep(console: Console, frame) -> None:
    """The fleet rows of a sweep: per setting and capacity, one table of each fleet size and router."""
    columns = [c for c in SWEEP_COLUMNS if c[0] in frame.columns and frame[c[0]].notna().any()]
    rows = frame.to_dict(orient="records")
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row.get("setting", row.get("policy", "")), row.get("capacity_tokens")), []).append(row)
    console.print("[bold]Fleets[/]: hit rates of the fleet bound >= routed bound >= delivered")
    for (setting, cap), members in groups.items():
        cap_text = "unlimited" if cap is None or cap == float("inf") else f"{cap:,.0f} tokens per replica"
        table = Table(title=f"{setting}, capacity {cap_text}", title_justify="left")
        for key, heading, _ in columns:
            table.add_column(heading, no_wrap=True, justify="left" if key == "router" else "right")
        for row in members:
            table.add_row(*[cell(row.get(key), pattern) for key, _, pattern in columns])
        console.print(table)
    legend = {"N": "replicas", "deliv": "delivered (sequential)", "load": "delivered under load",
              "p90 s": "TTFT p90 under load", "gap": "the larger loss (sequential), routing or memory"}
    console.print("[dim]" + "; ".join(f"{h}: {legend[h]}" for _, h, _ in columns if h in legend)
                  + " (--csv for every column).[/]")
