"""The report's Fleet section: N replicas behind a router (``kvsim.fleet``; docs/fleet.md).

From each engine's ``fleet`` summary (:func:`kvsim.fleet.summary.fleet_summary`): the
attribution as one stacked bar per engine (delivered, lost to memory, lost to routing: the
three add up to the fleet bound), per-replica bars (hit rate and routed bound, requests), a
table of the replicas and the sentence that names the larger gap.
"""
from __future__ import annotations

from typing import Any, Callable

from kvsim.report.document import Chart, Section, Table
from kvsim.report.figures import _figure, _style

DELIVERED, MEMORY, ROUTING = "#2563a8", "#d9661f", "#9ca3af"


def attribution_chart(fleets: dict[str, dict[str, Any]], labels: dict[str, str]):
    """One horizontal stacked bar per engine: delivered + lost to memory + lost to routing = fleet bound."""
    from matplotlib.ticker import PercentFormatter

    fig = _figure((8.6, 1.2 + 0.6 * len(fleets)))
    ax = fig.add_subplot()
    names = list(fleets)
    for y, name in enumerate(names):
        f = fleets[name]
        parts = ((f["token_hit_rate"], DELIVERED, "delivered"), (f["memory_gap"], MEMORY, "lost to memory"),
                 (f["routing_gap"], ROUTING, "lost to routing"))
        left = 0.0
        for width, color, label in parts:
            ax.barh(y, width, left=left, color=color, label=label if y == 0 else None)
            left += width
    ax.set_yticks(range(len(names)), [labels.get(n, n) for n in names])
    ax.set_xlim(0, 1)
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    _style(ax, "Where the fleet's hit rate goes", "token hit rate (the bar's end: the fleet bound)", "")
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    return fig


def replicas_chart(name: str, f: dict[str, Any], label: str):
    """Per replica: delivered hit rate and routed bound (bars), requests (a line on the right axis)."""
    import numpy as np
    from matplotlib.ticker import PercentFormatter

    per = f["per_replica"]
    x = np.arange(len(per))
    fig = _figure()
    ax = fig.add_subplot()
    ax.bar(x - 0.2, [r["token_hit_rate"] for r in per], 0.4, color=DELIVERED, label="delivered")
    ax.bar(x + 0.2, [r["routed_bound_hit_rate"] for r in per], 0.4, color=ROUTING, label="routed bound")
    ax.set_ylim(0, 1)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xticks(x, [str(r["replica"]) for r in per])
    _style(ax, f"Replicas of {label} behind {f['router']}", "replica", "token hit rate")
    right = ax.twinx()
    right.plot(x, [r["requests"] for r in per], "o-", color="#111111", lw=1, label="requests")
    right.set_ylabel("requests")
    right.set_ylim(0, max(1, max(r["requests"] for r in per)) * 1.15)
    handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="lower right", fontsize=8, frameon=False)
    return fig


def fleet_section(fleets: dict[str, dict[str, Any]], labels: dict[str, str],
                  chart: Callable[[str, Any, str, str], Chart]) -> Section:
    """The section for the engines' fleet summaries; ``chart(name, figure, caption, alt)`` makes a Chart."""
    first = next(iter(fleets.values()))
    section = Section("fleet", f"Fleet: {first['replicas']} replicas behind {first['router']}")
    section.paragraphs.append(
        "Each replica is one engine with the capacity above. The fleet bound is one unlimited cache shared by every "
        "replica (the most any routing could give), the routed bound an unlimited cache per replica under this "
        "routing (what the router captured), delivered the replay with the real capacities: the gap between the "
        "first two is lost to routing, between the last two to memory.")
    section.charts.append(chart("fleet_attribution", attribution_chart(fleets, labels),
                                "Delivered, lost to memory and lost to routing add up to the fleet bound.",
                                "Stacked bar chart of the fleet's hit rate per engine: delivered, lost to memory, "
                                "lost to routing."))
    for name, f in fleets.items():
        label = labels.get(name, name)
        section.charts.append(chart(f"fleet_replicas_{name}", replicas_chart(name, f, label),
                                    f"{label}: each replica's hit rate beside its routed bound, and its requests.",
                                    f"Bar chart of the hit rate of each replica of {label}."))
        larger = f["larger_gap"]
        section.paragraphs.append(
            f"{label}: fleet bound {f['fleet_bound_hit_rate']:.1%}, routed bound {f['routed_bound_hit_rate']:.1%}, "
            f"delivered {f['token_hit_rate']:.1%}; "
            + ("neither gap is over half a point." if larger == "neither" else f"the larger gap is {larger}.")
            + f" Load imbalance {f['load_imbalance']['requests']:.2f}x (max / mean requests per replica).")
        section.tables.append(Table(
            f"Replicas of {label}", ["replica", "requests", "prompt tokens", "hit rate", "routed bound"],
            [[str(r["replica"]), f"{r['requests']:,}", f"{r['prompt_tokens']:,}", f"{r['token_hit_rate']:.1%}",
              f"{r['routed_bound_hit_rate']:.1%}"] for r in f["per_replica"]]))
    return section
