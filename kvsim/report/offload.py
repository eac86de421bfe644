"""The report's Memory tiers section: ``kvsim report LOG --offload BACKEND --offload-size S``.

Per engine of the backend's family (native and LMCache sit under vLLM, HiCache under SGLang),
at the report's chosen capacity: the replay with the tier (``kvsim simulate --offload``'s, the
same summary as its ``summary.offload``, :meth:`kvsim.tiers.report.TierRun.summary`), one
stacked bar of the prompt tokens served from the GPU, CPU memory and disk against the misses,
a table per tier (capacity, hits, share, stores, loads, evictions) and, where the report runs
its timed replay (the Under load section: timestamps on every request, ``--concurrent``), the
TTFT with and without the tier on the same load. The rest of the report stays tier-less.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable

import numpy as np

from kvsim.errors import ConfigError
from kvsim.drive.percentiles import percentile
from kvsim.report.document import Chart, Section, Table
from kvsim.report.figures import _figure, _style

GPU, CPU, DISK, MISS = "#2563a8", "#d9661f", "#7c3aed", "#d1d5db"
NAMES = {"gpu": "GPU", "cpu": "CPU memory", "disk": "disk"}
COLORS = {"gpu": GPU, "cpu": CPU, "disk": DISK}
PLACEHOLDER_CAPACITY = 1e6     # tokens: the settings check before the report has chosen its capacity


def _backend(offload: dict[str, Any]) -> str:
    """The backend of the tier options; a tier option without --offload, or an unknown one, fails."""
    from kvsim.engines.offload import BACKENDS, OPTIONS

    if "offload" not in offload:
        flags = ", ".join(OPTIONS[k][0] for k in offload if k in OPTIONS)
        raise ConfigError(f"{flags} need(s) --offload native|lmcache|hicache")
    backend = str(offload["offload"]).lower()
    if backend not in BACKENDS:
        raise ConfigError(f"unknown --offload {offload['offload']!r}; choose native, lmcache or hicache")
    return backend


def tier_engines(sim: Any, offload: dict[str, Any] | None, policies: Any) -> list[str]:
    """The report's engines that take the tier, its settings checked for each ([] without one):
    none of them of the backend's family, or a bad tier setting, is a ConfigError."""
    from kvsim.engines import registry
    from kvsim.engines.offload import FAMILY

    if not offload:
        return []
    backend = _backend(offload)
    names = [p for p in policies if registry.engine(p).family == FAMILY[backend]]
    if not names:   # the engines' own words: which --policy takes this backend
        from kvsim.engines.offload import requested

        requested(with_tier(sim, offload), registry.engine(policies[0]).family)
    from kvsim.report.build import has_capacity

    probe = sim if has_capacity(sim) else replace(sim, capacity_tokens=PLACEHOLDER_CAPACITY)
    for p in names:
        registry.engine(p).settings(with_tier(probe, offload))
    return names


def with_tier(sim: Any, offload: dict[str, Any]) -> Any:
    return replace(sim, extra={**(sim.extra or {}), **offload})


def step_cost(opts: Any, sim: Any):
    """The step cost for loading against recomputing, as ``kvsim simulate`` finds it: the
    calibration, or the roofline of --model on --gpu; None when neither is given."""
    from kvsim.drive.step_cost import CalibratedStepCost, step_cost as roofline

    if opts.calibration is not None:
        return CalibratedStepCost(opts.calibration)
    if sim.model and sim.gpu:
        try:
            return roofline(sim.model, sim.gpu)
        except ConfigError:
            return None
    return None


def tier_summaries(trace: Any, names: list[str], sim: Any, offload: dict[str, Any], opts: Any) -> dict[str, dict]:
    """Each engine's ``summary.offload`` at ``sim`` with the tier (``kvsim simulate --json``'s)."""
    from kvsim.drive.metrics import counted
    from kvsim.drive.simulate import run_simulation
    from kvsim.warmup import apply_warmup

    runs = run_simulation(trace, names, with_tier(sim, offload))
    apply_warmup(runs, len(trace), opts.warmup)
    cost = step_cost(opts, sim)
    out = {}
    for name, r in runs.items():
        tier = r.extra["offload"]
        tier = tier.snapshot() if hasattr(tier, "snapshot") else tier
        mask = ~r.rejected & counted(r)
        summary = tier.summary(trace.prompt_lengths, mask)
        if cost is not None:
            summary["transfer"] = tier.transfer_costs(cost.seconds, mask)
        out[name] = summary
    return out


def timed_tiers(trace: Any, names: list[str], sim: Any, offload: dict[str, Any], opts: Any) -> dict[str, dict]:
    """The report's timed replay (the Under load section's arrivals and step cost) with the tier and
    without it, per engine with a scheduler model: TTFT mean / p50 / p90 and the hit rate under
    load; {} where the report runs none (no timestamps, ``--no-concurrent``)."""
    from kvsim.drive.clock import run
    from kvsim.drive.concurrent import ReplayMode, engine_inputs, releases_for, scheduler_settings
    from kvsim.drive.timed import make_engine, timed_result
    from kvsim.engines import registry
    from kvsim.report.concurrent import DEFAULT_GPU, DEFAULT_MODEL, step_cost_for
    from kvsim.warmup import measured_mask

    names = [p for p in names if registry.engine(p).has_scheduler()]
    if not (opts.concurrent and names and len(trace) and np.isfinite(trace.arrival).all()):
        return {}
    cost, cost_text = step_cost_for(opts)
    mode = ReplayMode("timed", "timestamp", speedup=opts.speedup)
    tsim = replace(with_tier(sim, offload), gpu=sim.gpu or DEFAULT_GPU, model=sim.model or DEFAULT_MODEL)
    releases, inputs = releases_for(trace, mode), engine_inputs(trace)
    measured = measured_mask(len(trace), opts.warmup)
    prompt = trace.prompt_lengths
    out: dict[str, dict] = {}
    for p in names:
        settings, _ = scheduler_settings(p, tsim, mode, trace)
        figures = {}
        for label, s in (("with_tier", settings), ("without_tier", settings.without_tier())):
            engine = make_engine(s, **inputs)
            steps, line = run(engine, releases, cost)
            engine.result.steps = steps
            t = timed_result(engine.result, line)
            ok = ~t.steps.rejected & measured
            v = t.ttft[ok]
            p_ok = int(prompt[ok].sum())
            figures[label] = {"ttft_mean_s": float(v.mean()) if len(v) else math.nan,
                              **{f"ttft_p{q}_s": percentile(v, q) if len(v) else math.nan for q in (50, 90)},
                              "hit_rate": int(t.steps.cached_tokens[ok].sum()) / p_ok if p_ok else 0.0}
        out[p] = {**figures, "step_cost": cost_text, "model": tsim.model, "gpu": tsim.gpu}
    return out


def hits_chart(summaries: dict[str, dict[str, Any]], labels: dict[str, str]):
    """One horizontal stacked bar per engine: GPU + CPU + disk hits, then the misses (= 100%)."""
    from matplotlib.ticker import PercentFormatter

    fig = _figure((8.6, 1.9 + 0.6 * len(summaries)))
    ax = fig.add_subplot()
    shown: set[str] = set()
    for y, (name, o) in enumerate(summaries.items()):
        left = 0.0
        for t, row in o["tiers"].items():
            ax.barh(y, row["hit_rate"], 0.6, left=left, color=COLORS.get(t, MISS),
                    label=f"hits from {NAMES.get(t, t)}" if t not in shown else None)
            shown.add(t)
            left += row["hit_rate"]
        ax.barh(y, max(0.0, 1.0 - left), 0.6, left=left, color=MISS, label="computed (miss)" if y == 0 else None)
    ax.set_yticks(range(len(summaries)), [labels.get(n, n) for n in summaries])
    ax.set_xlim(0, 1)
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    _style(ax, "Where the prompt tokens come from", "share of the prompt tokens", "")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=4, fontsize=8, frameon=False)
    return fig


def _tokens(value: Any) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "unlimited" if value is not None else "-"
    return f"{int(value):,}"


def _ms(seconds: float) -> str:
    return "-" if seconds is None or not math.isfinite(seconds) else f"{seconds * 1e3:,.1f} ms"


def tier_table(label: str, o: dict[str, Any], gpu_capacity: Any) -> Table:
    """One engine's tiers: capacity, hits, their share, the requests served, stores, loads, evictions."""
    rows = []
    for t, row in o["tiers"].items():
        gpu = t == "gpu"
        rows.append([NAMES.get(t, t), _tokens(gpu_capacity if gpu else row.get("capacity_tokens")),
                     f"{row['hit_tokens']:,}", f"{row['hit_rate']:.1%}", f"{row['hit_requests']:,}",
                     "-" if gpu else f"{row['stored_tokens']:,}", "-" if gpu else f"{row['loaded_tokens']:,}",
                     "-" if gpu else f"{row['evicted_tokens']:,}"])
    return Table(f"Tiers of {label}: {o['description']}",
                 ["tier", "capacity (tokens)", "cached tokens from it", "share of prompt tokens", "requests served",
                  "tokens stored", "tokens loaded", "tokens evicted"], rows)


def offload_section(summaries: dict[str, dict[str, Any]], labels: dict[str, str], capacities: dict[str, Any],
                    plain: dict[str, float], chart: Callable[[str, Any, str, str], Chart],
                    timed: dict[str, dict] | None = None) -> Section:
    """The section for the engines' tier summaries. ``capacities``: each engine's GPU capacity;
    ``plain``: its hit rate without the tier (the report's own replay); ``timed``: TTFT with and
    without the tier (:func:`timed_tiers`); ``chart(name, figure, caption, alt)`` makes a Chart."""
    first = next(iter(summaries.values()))
    section = Section("offload", f"Memory tiers: --offload {first['backend']}")
    section.paragraphs.append(
        "The same engine at the chosen GPU capacity with a KV tier beside it (kvsim simulate --offload): what the "
        "GPU evicts is kept in host memory (and, for LMCache, on disk) and loaded back instead of recomputed. "
        "Shares are of the prompt tokens of the counted requests; the other sections are without the tier.")
    words = []
    for name, o in summaries.items():
        words.append(f"{labels.get(name, name)}: {sum(r['hit_rate'] for r in o['tiers'].values()):.1%} of the "
                     f"prompt tokens cached with the tier against {plain.get(name, 0.0):.1%} without it, "
                     f"{o['offloaded_hit_rate']:.1%} from the tier")
    section.charts.append(chart("offload_tiers", hits_chart(summaries, labels), "; ".join(words) + ".",
                                "Stacked bar chart of the share of the prompt tokens served from the GPU, from CPU "
                                "memory and from disk, and computed, per engine."))
    for name, o in summaries.items():
        label = labels.get(name, name)
        section.tables.append(tier_table(label, o, capacities.get(name)))
        costs = o.get("transfer")
        if costs:
            section.footer.append(
                f"{label}: loading took {costs['load_seconds']:.3g} s over the link against "
                f"{costs['recompute_seconds']:.3g} s to recompute the same tokens ({costs['requests_loading']:,} "
                f"requests; {costs['loads_slower_than_recompute']:,} slower than recompute).")
        for note in list(o.get("notes", [])) + ([costs["note"]] if costs and costs.get("note") else []):
            section.footer.append(f"{label}: {note}.")
        if not o.get("bytes_per_token"):
            section.footer.append(f"{label}: bytes and transfer times need --model (KV bytes per token).")
    if timed:
        rows = []
        for name, f in timed.items():
            w, wo = f["with_tier"], f["without_tier"]
            rows.append([labels.get(name, name), f"{w['hit_rate']:.1%} ({wo['hit_rate']:.1%})",
                         *(f"{_ms(w[k])} ({_ms(wo[k])})" for k in ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s"))])
        section.tables.append(Table("Timed replay of the same load with the tier (without it)",
                                    ["engine", "hit rate under load", "TTFT mean", "TTFT p50", "TTFT p90"], rows))
        f = next(iter(timed.values()))
        section.footer.append(f"Timed replay as in the Under load section; step cost: {f['step_cost']}; the tier's "
                              f"transfers over the host link of {f['gpu']} with the KV bytes of {f['model']}.")
    return section
