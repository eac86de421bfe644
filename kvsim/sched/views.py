"""The concurrent view of a log with arrival times: what changes under load (data for reports).

For one policy at one capacity: the hit rate of the sequential replay (one request at a
time) beside the hit rate when requests overlap as they arrived; with a step-cost model,
the TTFT distribution with and without prefix caching on the same load; for radix, the
hit rates of ``lpm`` and ``fcfs`` (SGLang 0.5.23's default is ``fcfs``). Hit rate here is
cached prompt tokens over prompt tokens of the requests served (and measured, when a
warm-up window leaves the first requests out).

Arrivals follow ``kvsim simulate``'s options: ``--replay steps`` releases request *i* at
step ``arrival_step[i]`` (``--arrival-from step``) or at ``floor((t_i - t_0) / S)`` from its
timestamp (``--arrival-from timestamp --step-seconds S``); ``--replay timed`` releases it
at its timestamp in seconds; ``--speedup X`` divides timestamps by X.
"""
from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvsim.errors import ConfigError
from kvsim.io.trace import Trace
from kvsim.models import apc_num_gpu_blocks, radix_max_total_tokens
from kvsim.replay.options import SimOptions
from kvsim.sched.clock import Releases
from kvsim.sched.settings import sglang_settings, vllm_settings
from kvsim.sched.timed import PERCENTILES, replay_steps, replay_timed, without_prefix_caching

DEFAULT_STEP_SECONDS = 0.05
REPLAYS = ("steps", "timed")
ARRIVALS_FROM = ("step", "timestamp")
RADIX_ORDERS = ("fcfs", "lpm")
PROGRESS_FROM = 1000            # requests: below this, a replay takes about a second, no bar


@dataclass(frozen=True)
class Arrivals:
    """How the log's arrivals become releases, as ``kvsim simulate``'s options say.

    ``arrival_from`` (``--arrival-from``; None: ``step`` for steps, ``timestamp`` for timed):
    ``step`` reads each request's ``arrival_step`` (timed: times ``step_seconds``),
    ``timestamp`` its logged time (steps: one step per ``step_seconds`` of log time).
    ``speedup`` divides the arrival times; ``cost`` is the step-cost model of ``--replay timed``.
    """

    replay: str = "timed"
    arrival_from: str | None = None
    step_seconds: float | None = None
    speedup: float = 1.0
    cost: Any = None

    def __post_init__(self) -> None:
        if self.replay not in REPLAYS:
            raise ConfigError(f"--replay must be one of {', '.join(REPLAYS)} here, got {self.replay!r}")
        if self.arrival_from is None:
            object.__setattr__(self, "arrival_from", "step" if self.replay == "steps" else "timestamp")
        if self.arrival_from not in ARRIVALS_FROM:
            raise ConfigError(f"--arrival-from must be step or timestamp, got {self.arrival_from!r}")
        if not self.speedup > 0:
            raise ConfigError(f"--speedup must be positive, got {self.speedup}")
        if self.step_seconds is not None and not self.step_seconds > 0:
            raise ConfigError(f"--step-seconds must be positive, got {self.step_seconds}")
        if self.converts and self.step_seconds is None:
            raise ConfigError(f"--replay {self.replay} --arrival-from {self.arrival_from} needs --step-seconds")
        if self.replay == "timed" and self.cost is None:
            raise ConfigError("--replay timed needs a step-cost model (--model and --gpu, or --calibration)")

    @property
    def converts(self) -> bool:
        """Whether arrivals change unit (seconds to steps, or steps to seconds) by ``step_seconds``."""
        return (self.replay == "steps") != (self.arrival_from == "step")

    def missing(self, trace: Trace) -> str | None:
        """Why the log cannot be replayed this way (one line), or None when it can."""
        if len(trace) == 0:
            return "the log is empty"
        if self.arrival_from == "step":
            steps = getattr(trace, "arrival_step", None)
            if steps is None or (np.asarray(steps) < 0).any():
                return ("not every request has an arrival_step "
                        "(use --arrival-from timestamp for logged timestamps)")
            return None
        if not np.isfinite(trace.arrival).all():
            return "not every request has a timestamp"
        return None

    def releases(self, trace: Trace) -> Releases:
        if self.arrival_from == "step":
            steps = np.asarray(trace.arrival_step, np.int64)
            if self.replay == "steps":
                return Releases.logged(steps if self.speedup == 1 else np.floor(steps / self.speedup).astype(np.int64))
            return Releases.logged(steps * self.step_seconds / self.speedup)
        seconds = trace.arrival / self.speedup
        if self.replay == "timed":
            return Releases.logged(seconds)
        return Releases.logged(Releases.steps_from_seconds(seconds, self.step_seconds))

    def describe(self) -> str:
        pace = "" if self.speedup == 1 else f", {self.speedup:g}x faster than logged"
        source = ("arrival_step" if self.arrival_from == "step" else "timestamps")
        unit = f" ({self.step_seconds:g} s per step)" if self.converts else ""
        if self.replay == "timed":
            return f"timed replay, arrivals from {source}{unit}{pace}, step cost: {self.cost.describe()}"
        return f"step clock, arrivals from {source}{unit}{pace}"


@dataclass
class ConcurrentView:
    policy: str
    mode: str                                   # "timed" (a step-cost model) or "steps"
    sequential_hit_rate: float
    concurrent_hit_rate: float
    ttft_cached: np.ndarray | None = None       # seconds, per served (measured) request, timed mode
    ttft_uncached: np.ndarray | None = None
    policy_hit_rates: dict[str, float] = field(default_factory=dict)   # radix: fcfs / lpm
    schedule_policy: str | None = None          # radix: the queue order of the concurrent run
    preemptions: int = 0                        # vLLM preemptions / SGLang retractions, concurrent run
    served: int = 0
    rejected: int = 0
    notes: list[str] = field(default_factory=list)

    def ttft_percentiles(self, cached: bool = True) -> dict[int, float]:
        v = self.ttft_cached if cached else self.ttft_uncached
        if v is None or len(v) == 0:
            return {p: float("nan") for p in PERCENTILES}
        return {p: float(np.percentile(v, p)) for p in PERCENTILES}


def hit_rate(cached: np.ndarray, prompt_lengths: np.ndarray, served: np.ndarray) -> float:
    total = int(prompt_lengths[served].sum())
    return float(cached[served].sum()) / total if total else 0.0


class _Workload:
    """The trace as the scheduler models take it: prompts, outputs, namespaces, releases."""

    def __init__(self, trace: Trace, arrivals: Arrivals, measured: np.ndarray | None) -> None:
        from kvsim.replay.requests import output_token_arrays

        n = len(trace)
        out, off = output_token_arrays(trace)
        self.prompts = [trace.prompt(i) for i in range(n)]
        self.outputs = [out[off[i]:off[i + 1]] for i in range(n)]
        self.names = {"loras": [trace.name_of("lora", int(c)) for c in trace.lora],
                      "salts": [trace.name_of("cache_salt", int(c)) for c in trace.cache_salt]}
        self.lengths = trace.prompt_lengths
        self.releases = arrivals.releases(trace)
        self.arrivals = arrivals
        self.measured = np.ones(n, bool) if measured is None else np.asarray(measured, bool)

    def run(self, settings, progress=None):
        """One replay: a StepResult (steps) or a TimedResult (timed)."""
        if self.arrivals.replay == "timed":
            return replay_timed(settings, self.prompts, self.outputs, self.releases, self.arrivals.cost,
                                progress=progress, **self.names)
        return replay_steps(settings, self.prompts, self.outputs, self.releases, progress=progress, **self.names)

    def counted(self, steps) -> np.ndarray:
        return ~steps.rejected & self.measured

    def hit_rate(self, steps) -> float:
        return hit_rate(steps.cached_tokens, self.lengths, self.counted(steps))


def scheduler_settings(policy: str, options: SimOptions, trace: Trace | None = None):
    """The scheduler model's settings for ``policy`` at ``options``' capacity, and where the defaults come from.

    With an unlimited capacity and ``trace`` given, the pool is sized to hold every request of
    the trace at once (nothing is ever evicted or short, as unlimited), not the models' nominal
    64M tokens, whose allocation alone takes seconds.
    """
    if policy not in ("apc", "radix"):
        raise ConfigError(f"no scheduler model for policy {policy!r} (apc or radix)")
    unlimited = (apc_num_gpu_blocks(options) if policy == "apc" else radix_max_total_tokens(options)) is None
    if policy == "apc":
        if unlimited and trace is not None:
            options = dataclasses.replace(options, num_gpu_blocks=_footprint(trace, options.block_size) // options.block_size + 1)
        return vllm_settings(options)
    if unlimited and trace is not None:
        nominal = sglang_settings(options)[0]
        options = dataclasses.replace(options, max_total_tokens=_footprint(trace, options.page_size))
        return sglang_settings(options, max_running_requests=nominal.max_running_requests)
    return sglang_settings(options)


def _footprint(trace: Trace, unit: int) -> int:
    """Tokens of every request's prompt and reply together, each rounded up to whole ``unit``s."""
    total = trace.prompt_lengths.astype(np.int64) + np.maximum(trace.output_lengths.astype(np.int64), 1)
    return int((-(-total // unit) * unit).sum()) + unit


def concurrent_view(trace: Trace, options: SimOptions, policy: str, cost=None,
                    step_seconds: float = DEFAULT_STEP_SECONDS, speedup: float = 1.0, *,
                    arrivals: Arrivals | None = None, sequential: Any = None, measured: np.ndarray | None = None,
                    progress: bool = False) -> ConcurrentView | None:
    """The view for ``policy`` ("apc" or "radix"), or None when the log has no arrival times.

    ``arrivals`` (default: timed when ``cost`` is given, else a step clock of ``step_seconds``
    over the timestamps); ``sequential``: the ReplayResult of ``policy`` at ``options``, when
    already computed; ``measured``: bool (n,), the requests counted (a warm-up window left
    out); ``progress``: a bar per replay on long logs.
    """
    if arrivals is None:
        arrivals = Arrivals("timed" if cost is not None else "steps", "timestamp",
                            None if cost is not None else step_seconds, speedup, cost)
    if arrivals.missing(trace) is not None:
        return None
    if sequential is None:
        from kvsim.replay.driver import replay

        sequential = replay(policy, trace, options)
    work = _Workload(trace, arrivals, measured)
    settings, note = scheduler_settings(policy, options, trace)
    seq_rate = hit_rate(sequential.cached_tokens, work.lengths, ~sequential.rejected & work.measured)
    timed = arrivals.replay == "timed"
    view = ConcurrentView(policy, arrivals.replay, seq_rate, 0.0, notes=[note, arrivals.describe()])
    runs = [("concurrent", settings)]
    if timed:
        runs.append(("without prefix caching", without_prefix_caching(settings)))
    if policy == "radix":
        runs += [(f"schedule policy {o}", dataclasses.replace(settings, schedule_policy=o))
                 for o in RADIX_ORDERS if o != settings.schedule_policy]
    bars = None
    if progress and len(trace) >= PROGRESS_FROM:
        from kvsim.render.progress import Bars

        bars = Bars("count")
    results = {}
    with bars or nullcontext():
        for label, s in runs:
            update = bars.task(f"{policy}, {arrivals.replay} replay: {label}", len(trace)) if bars else None
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
    if policy == "radix":
        view.schedule_policy = settings.schedule_policy
        for o in RADIX_ORDERS:
            r = results["concurrent" if o == settings.schedule_policy else f"schedule policy {o}"]
            view.policy_hit_rates[o] = work.hit_rate(r.steps if timed else r)
    return view


def concurrent_columns(trace: Trace, options: SimOptions, policy: str, arrivals: Arrivals,
                       measured: np.ndarray | None = None) -> dict[str, Any]:
    """The sweep's concurrent columns for one row: one scheduler replay at ``options``.

    ``concurrent_hit_rate``, ``concurrent_preemptions`` and, timed, ``ttft_p50_s`` /
    ``ttft_p90_s``; NaN where the log has no arrival times.
    """
    out: dict[str, Any] = {"concurrent_hit_rate": float("nan"), "concurrent_preemptions": None}
    if arrivals.replay == "timed":
        out.update({f"ttft_p{p}_s": float("nan") for p in (50, 90)})
    if arrivals.missing(trace) is not None:
        return out
    work = _Workload(trace, arrivals, measured)
    settings, _ = scheduler_settings(policy, options, trace)
    result = work.run(settings)
    steps = result.steps if arrivals.replay == "timed" else result
    served = work.counted(steps)
    out["concurrent_hit_rate"] = work.hit_rate(steps)
    out["concurrent_preemptions"] = int(steps.preemptions[served].sum())
    if arrivals.replay == "timed":
        ttft = result.ttft[served]
        for p in (50, 90):
            out[f"ttft_p{p}_s"] = float(np.percentile(ttft, p)) if len(ttft) else float("nan")
    return out
