"""The concurrent view of a log with arrival times: what changes under load (data for reports).

For one policy at one capacity: the hit rate of the sequential replay (one request at a
time) beside the hit rate when requests overlap as they arrived; with a step-cost model,
the TTFT distribution with and without prefix caching on the same load; for radix, the
hit rates of ``lpm`` and ``fcfs`` (SGLang 0.5.23's default is ``fcfs``). Hit rate here is
cached prompt tokens over prompt tokens of the requests served (and measured, when a
warm-up window leaves the first requests out).

The replays are ``kvsim simulate --replay steps|timed``'s (:mod:`kvsim.drive.concurrent`):
the same releases (``ReplayMode``: ``--arrival-from``, ``--step-seconds``, ``--speedup``,
``--arrivals``), scheduler settings and per-request inputs.
"""
from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvsim.errors import ConfigError
from kvsim.io.trace.columns import Trace
from kvsim.drive.concurrent import ReplayMode, engine_inputs, releases_for, scheduler_settings
from kvsim.engines import registry
from kvsim.engines.options import SimOptions
from kvsim.drive.clock import run
from kvsim.drive.timed import PERCENTILES, make_engine, timed_result, without_prefix_caching
from kvsim.drive.percentiles import percentile

DEFAULT_STEP_SECONDS = 0.05
PROGRESS_FROM = 1000            # requests: below this, a replay takes about a second, no bar


@dataclass
class ConcurrentView:
    policy: str
    mode: str                                   # "timed" (a step-cost model) or "steps"
    sequential_hit_rate: float
    concurrent_hit_rate: float
    ttft_cached: np.ndarray | None = None       # seconds, per served (measured) request, timed mode
    ttft_uncached: np.ndarray | None = None
    policy_hit_rates: dict[str, float] = field(default_factory=dict)   # per queue order compared (radix: fcfs / lpm)
    schedule_policy: str | None = None          # the queue order of the concurrent run (engines that compare them)
    preemptions: int = 0                        # vLLM preemptions / SGLang retractions, concurrent run
    served: int = 0
    rejected: int = 0
    notes: list[str] = field(default_factory=list)

    def ttft_percentiles(self, cached: bool = True) -> dict[int, float]:
        v = self.ttft_cached if cached else self.ttft_uncached
        if v is None or len(v) == 0:
            return {p: float("nan") for p in PERCENTILES}
        return {p: percentile(v, p) for p in PERCENTILES}


def hit_rate(cached: np.ndarray, prompt_lengths: np.ndarray, served: np.ndarray) -> float:
    total = int(prompt_lengths[served].sum())
    return float(cached[served].sum()) / total if total else 0.0


def describe(mode: ReplayMode, cost: Any = None) -> str:
    """One line: the clock, where arrivals come from, and the step cost."""
    what = f"arrivals from {mode.describe_arrivals()}"
    return f"timed replay, {what}, step cost: {cost.describe()}" if cost is not None else f"step clock, {what}"


class _Workload:
    """The trace as the scheduler models take it (as ``kvsim simulate --replay`` builds it)."""

    def __init__(self, trace: Trace, mode: ReplayMode, cost: Any, measured: np.ndarray | None) -> None:
        if mode.mode == "timed" and cost is None:
            raise ConfigError("--replay timed needs a step-cost model (--model and --gpu, or --calibration)")
        self.mode, self.cost = mode, (cost if mode.mode == "timed" else None)
        self.releases = releases_for(trace, mode)
        self.inputs = engine_inputs(trace)
        self.lengths = trace.prompt_lengths
        self.measured = np.ones(len(trace), bool) if measured is None else np.asarray(measured, bool)

    def run(self, settings, progress=None):
        """One replay: a StepResult (steps) or a TimedResult (timed)."""
        engine = make_engine(settings, **self.inputs)
        steps, line = run(engine, self.releases, self.cost, progress=progress)
        engine.result.steps = steps
        return timed_result(engine.result, line) if self.cost is not None else engine.result

    def counted(self, steps) -> np.ndarray:
        return ~steps.rejected & self.measured

    def hit_rate(self, steps) -> float:
        return hit_rate(steps.cached_tokens, self.lengths, self.counted(steps))


def concurrent_view(trace: Trace, options: SimOptions, policy: str, cost=None,
                    step_seconds: float = DEFAULT_STEP_SECONDS, speedup: float = 1.0, *,
                    mode: ReplayMode | None = None, sequential: Any = None, measured: np.ndarray | None = None,
                    progress: bool = False) -> ConcurrentView | None:
    """The view for ``policy`` ("apc" or "radix"), or None when the log has no timestamps.

    ``mode`` (default: timed when ``cost`` is given, else a step clock of ``step_seconds``
    over the timestamps, both sped up ``speedup`` times); ``sequential``: the ReplayResult of
    ``policy`` at ``options``, when already computed; ``measured``: bool (n,), the requests
    counted (a warm-up window left out); ``progress``: a bar per replay on long logs.
    """
    if mode is None:
        if len(trace) == 0 or not np.isfinite(trace.arrival).all():
            return None
        mode = ReplayMode("timed" if cost is not None else "steps", "timestamp",
                          None if cost is not None else step_seconds, speedup=speedup)
    if sequential is None:
        from kvsim.drive.sequential import replay

        sequential = replay(policy, trace, options)
    work = _Workload(trace, mode, cost, measured)
    settings, note = scheduler_settings(policy, options, mode, trace)
    seq_rate = hit_rate(sequential.cached_tokens, work.lengths, ~sequential.rejected & work.measured)
    timed = work.cost is not None
    view = ConcurrentView(policy, mode.mode, seq_rate, 0.0, notes=[note, describe(mode, work.cost)])
    runs = [("concurrent", settings)]
    if timed:
        runs.append(("without prefix caching", without_prefix_caching(settings)))
    orders = registry.engine(policy).orders     # queue orders the view compares (SGLang: fcfs, lpm)
    if orders:
        runs += [(f"schedule policy {o}", dataclasses.replace(settings, schedule_policy=o))
                 for o in orders if o != settings.schedule_policy]
    bars = None
    if progress and len(trace) >= PROGRESS_FROM:
        from kvsim.progress import bars as display

        bars = display("count")
    results = {}
    with (bars or nullcontext()) as bars:
        for label, s in runs:
            update = bars.task(f"{policy}, {mode.mode} replay: {label}", len(trace)) if bars else None
            results[label] = work.run(s, update)
    first = results["concurrent"]
    steps = first.steps if timed else first
    served = work.counted(steps)
    view.concurrent_hit_rate = work.hit_rate(steps)
    view.served, view.rejected = int(served.sum()), int(steps.rejected.sum())
    view.preemptions = int(steps.preemptions[served].sum())
    if timed:
        view.ttft_cached = first.ttft[served]
        view.ttft_uncached = results["without prefix caching"].ttft[served]
    if orders:
        view.schedule_policy = settings.schedule_policy
        for o in orders:
            r = results["concurrent" if o == settings.schedule_policy else f"schedule policy {o}"]
            view.policy_hit_rates[o] = work.hit_rate(r.steps if timed else r)
    return view


def concurrent_columns(trace: Trace, options: SimOptions, policy: str, mode: ReplayMode, cost: Any = None,
                       measured: np.ndarray | None = None) -> dict[str, Any]:
    """The sweep's concurrent columns for one row: one scheduler replay at ``options``.

    ``concurrent_hit_rate``, ``concurrent_preemptions`` and, timed, ``ttft_p50_s`` /
    ``ttft_p90_s``.
    """
    work = _Workload(trace, mode, cost, measured)
    settings, _ = scheduler_settings(policy, options, mode, trace)
    result = work.run(settings)
    timed = work.cost is not None
    steps = result.steps if timed else result
    served = work.counted(steps)
    out: dict[str, Any] = {"concurrent_hit_rate": work.hit_rate(steps),
                           "concurrent_preemptions": int(steps.preemptions[served].sum())}
    if timed:
        ttft = result.ttft[served]
        for p in (50, 90):
            out[f"ttft_p{p}_s"] = percentile(ttft, p) if len(ttft) else float("nan")
    return out
