"""The report's "Under load" section: the log replayed as it arrived through the scheduler models.

At the report's chosen capacity, per engine with a scheduler model: the hit rate of the
sequential replay beside the concurrent one, the TTFT distribution with and without prefix
caching (a timed replay, one step costing the roofline of its batch, or a ``kvsim
gpu-validate`` calibration), and the queue orders its spec compares (``orders``: SGLang's
``fcfs`` and ``lpm``). Data: :mod:`kvsim.drive.views`.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

import numpy as np

from kvsim.report import figures as F
from kvsim.report import text as T
from kvsim.report.document import Chart, Section, Table

DEFAULT_MODEL = "llama-3-8b"     # the roofline's model and GPU when the report names none
DEFAULT_GPU = "H100-80GB"

INTRO = ("Real traffic overlaps. Here the log is replayed as it arrived through faithful models of {schedulers} "
         "schedulers (batching, chunked prefill, preemption and retraction, queue order), at "
         "the same capacity as above. Under load, running requests pin their KV so less of the cache is "
         "evictable; requests prefilled together cannot share what neither has cached yet (SGLang inserts a "
         "prompt after its prefill, vLLM caches blocks as it allocates them); and a queue forms that SGLang's "
         "lpm order can sort by cached prefix.")
NO_ARRIVALS = ("No concurrent view: {why}, so the log can only be replayed one request at a time "
               "(the sections above).")
NO_SCHEDULER = "no engine in this report has a scheduler model"


def step_cost_for(opts: Any) -> tuple[Any, str]:
    """The timed replay's step cost: the calibration if given, else a roofline (defaults said)."""
    from kvsim.drive.step_cost import CalibratedStepCost, RooflineStepCost, step_cost

    if opts.calibration is not None:
        cost: Any = CalibratedStepCost(opts.calibration)
        return cost, cost.describe()
    model, gpu = opts.model or DEFAULT_MODEL, opts.sim.gpu or DEFAULT_GPU
    cost = step_cost(model, gpu)
    assert isinstance(cost, RooflineStepCost)
    given = [w for w, v in (("--model", opts.model), ("--gpu", opts.sim.gpu)) if v is None]
    why = f" ({' and '.join(given)} not given: the report's default)" if given else ""
    return cost, cost.describe() + why


def concurrent_section(trace: Any, sim: Any, runs: dict[str, Any], opts: Any,
                       chart: Callable[[str, Any, str, str], Chart],
                       say: Callable[[str], None]) -> tuple[Section, dict[str, Any] | None]:
    """The section and its figures (``ReportData.numbers['concurrent']``; None without arrivals).

    ``sim``/``runs``: the chosen options and the sequential replays at them; ``chart`` turns
    a figure into a :class:`Chart`.
    """
    from kvsim.drive.concurrent import ReplayMode
    from kvsim.drive.views import concurrent_view
    from kvsim.warmup import measured_mask

    section = Section("concurrent", "Under load: concurrent replay")
    if len(trace) == 0 or not np.isfinite(trace.arrival).all():
        section.paragraphs.append(NO_ARRIVALS.format(why="not every request has a timestamp"))
        return section, None
    policies = [p for p in runs if T.spec(p).has_scheduler()]
    if not policies:
        section.paragraphs.append(NO_ARRIVALS.format(why=NO_SCHEDULER))
        return section, None
    cost, cost_text = step_cost_for(opts)
    mode = ReplayMode("timed", "timestamp", speedup=opts.speedup)
    view_sim = sim if sim.gpu else replace(sim, gpu=DEFAULT_GPU)   # the scheduler budgets of that GPU
    measured = measured_mask(len(trace), opts.warmup)
    views = {}
    for p in policies:
        orders = T.spec(p).orders
        say(f"concurrent replay ({p}): timed, with and without prefix caching"
            + (f", {T.and_list(orders)}" if orders else "") + " (--no-concurrent skips it)")
        views[p] = concurrent_view(trace, view_sim, p, cost, mode=mode, sequential=runs[p], measured=measured,
                                   progress=True)
    pace = "as logged" if opts.speedup == 1 else f"{opts.speedup:g}x faster than logged (--speedup)"
    releases = dict.fromkeys(f"{T.spec(p).release}'s" for p in policies)
    section.paragraphs += [INTRO.format(schedulers=T.and_list(releases)),
                           f"Arrivals {pace}; step cost: {cost_text}; scheduler settings: "
                           + ", ".join(v.notes[0] for v in views.values()) + "; capacity as above ("
                           + ", ".join(f"{T.short(p)} {T.capacity_text(_cap(runs[p]))}" for p in policies) + ")."]
    colors = {p: T.spec(p).color for p in policies}
    section.charts.append(_hit_chart(views, chart, colors))
    section.charts.append(_ttft_chart(views, chart, colors))
    section.tables.append(_table(views))
    section.footer.append("The roofline is a lower bound on step time (no kernel reaches peak; scheduling overhead "
                          "is left out): compare the runs with and without prefix caching, not absolute latencies. "
                          "Rerun with --speedup to see the same log under more load.")
    return section, {p: _numbers(v) for p, v in views.items()} | {"step_cost": cost_text, "speedup": opts.speedup}


def _cap(result: Any) -> float:
    c = result.capacity_tokens
    return float("inf") if c is None else float(c)


def _others(view: Any) -> list[str]:
    """The queue orders compared besides the one of the concurrent run (its default)."""
    return [o for o in view.policy_hit_rates if o != view.schedule_policy]


def _bars(policy: str, view: Any) -> list[dict[str, Any]]:
    """One engine's bars: one at a time, then under load (in each queue order its spec compares)."""
    name = T.short(policy)
    bars = [{"policy": policy, "label": f"{name}\none at a time", "hit_rate": view.sequential_hit_rate,
             "sequential": True}]
    if not view.policy_hit_rates:
        return bars + [{"policy": policy, "label": f"{name}\nunder load", "hit_rate": view.concurrent_hit_rate}]
    default = view.schedule_policy
    bars.append({"policy": policy, "label": f"{name} under load\n{default} (default)",
                 "hit_rate": view.policy_hit_rates[default]})
    return bars + [{"policy": policy, "label": f"{name} under load\n{o}", "hit_rate": view.policy_hit_rates[o]}
                   for o in _others(view)]


def _hit_words(policy: str, view: Any) -> str:
    """"SGLang radix 60.0% → 55.0% with its default fcfs queue, 58.0% with lpm"."""
    text = f"{T.spec(policy).label} {T.pct(view.sequential_hit_rate)} → {T.pct(view.concurrent_hit_rate)}"
    if not view.policy_hit_rates:
        return text
    return (text + f" with its default {view.schedule_policy} queue"
            + "".join(f", {T.pct(view.policy_hit_rates[o])} with {o}" for o in _others(view)))


def _hit_chart(views: dict[str, Any], chart: Callable, colors: dict[str, str]) -> Chart:
    bars = [b for p, v in views.items() for b in _bars(p, v)]
    caption = ("Token hit rate at the same capacity, one request at a time and as the log arrived: "
               + ", ".join(_hit_words(p, v) for p, v in views.items()) + ".")
    return chart("load_hit_rate", F.load_hit_chart(bars, colors=colors), caption,
                 "Bar chart of token hit rate, sequential and concurrent replay, per policy")


def _ttft_chart(views: dict[str, Any], chart: Callable, colors: dict[str, str]) -> Chart:
    series = []
    for p, v in views.items():
        name = T.spec(p).label
        series.append({"policy": p, "label": f"{name}, prefix caching on", "ttft": v.ttft_cached})
        series.append({"policy": p, "label": f"{name}, prefix caching off", "ttft": v.ttft_uncached, "dashed": True})
    med = {p: (v.ttft_percentiles(True)[50], v.ttft_percentiles(False)[50]) for p, v in views.items()}
    caption = ("TTFT of every request, timed replay of the same load with prefix caching on (solid) and off "
               "(dashed). Median: " + "; ".join(f"{T.spec(p).label} {_ms(a)} with the cache, {_ms(b)} without"
                                                for p, (a, b) in med.items()) + ".")
    return chart("ttft", F.ttft_cdf_chart(series, colors=colors), caption,
                 "Cumulative distribution of time to first token, with and without prefix caching, per policy")


def _table(views: dict[str, Any]) -> Table:
    rows = []
    for p, v in views.items():
        on, off = v.ttft_percentiles(True), v.ttft_percentiles(False)
        label = T.spec(p).label + (f" ({v.schedule_policy})" if v.policy_hit_rates else "")
        rows.append([label, T.pct(v.sequential_hit_rate), T.pct(v.concurrent_hit_rate),
                     *(f"{_ms(on[q])} ({_ms(off[q])})" for q in (50, 90, 99)), f"{v.preemptions:,}",
                     f"{v.served:,}" + (f" ({v.rejected:,} never fit)" if v.rejected else "")])
    for p, v in views.items():   # the other queue orders, at the end
        rows += [[f"{T.spec(p).label} ({o})", T.pct(v.sequential_hit_rate), T.pct(v.policy_hit_rates[o]),
                  "", "", "", "", ""] for o in _others(v)]
    return Table("Sequential vs concurrent replay at the same capacity; TTFT with prefix caching (without)",
                 ["policy", "hit rate, one at a time", "hit rate, under load", "TTFT p50", "TTFT p90", "TTFT p99",
                  "preemptions / retractions", "requests"], rows)


def _numbers(view: Any) -> dict[str, Any]:
    return {"sequential_hit_rate": view.sequential_hit_rate, "concurrent_hit_rate": view.concurrent_hit_rate,
            "policy_hit_rates": dict(view.policy_hit_rates), "preemptions": view.preemptions,
            "served": view.served, "rejected": view.rejected,
            "ttft_s": {"cached": view.ttft_percentiles(True), "uncached": view.ttft_percentiles(False)}}


def _ms(seconds: float) -> str:
    if not np.isfinite(seconds):
        return "-"
    if seconds >= 10:
        return f"{seconds:,.1f} s"
    ms = seconds * 1e3
    return f"{ms:,.0f} ms" if ms >= 100 else f"{ms:.1f} ms"
