"""Concurrent replay of a trace: ``kvsim simulate --replay steps|timed`` (docs/concurrency.md).

The scheduler models (``kvsim.sched``) take plain per-request arrays; this module turns a
:class:`Trace` and the command's options into them, decides when each request is released
(logged ``arrival_step``, timestamps on a step clock, timestamps in seconds, or closed-loop
sessions), runs each policy's engine and collects per-request results and the summary.
"""
from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from kvsim.errors import ConfigError
from kvsim.io.trace.columns import Trace
from kvsim.engines.options import SimOptions
from kvsim.drive.requests import Ragged, output_token_arrays
from kvsim.drive.clock import Releases
from kvsim.engines.base import StepResult
from kvsim.drive.timed import PERCENTILES, TimedResult, make_engine, without_prefix_caching
from kvsim.drive.percentiles import percentile
from kvsim.engines import registry

MODES = ("sequential", "steps", "timed")
ARRIVALS = ("logged", "closed-loop")
ARRIVAL_FROM = ("step", "timestamp")


@dataclass
class ReplayMode:
    """How a concurrent replay releases requests and what it models (the CLI's options)."""

    mode: str = "steps"                    # steps | timed
    arrival_from: str | None = None        # step | timestamp (default: step for steps, timestamp for timed)
    step_seconds: float | None = None      # log seconds per step (timestamps on the step clock), or
                                           # seconds per logged step (timed replay of arrival_step)
    arrivals: str = "logged"               # logged | closed-loop
    speedup: float = 1.0                   # arrival times divided by this
    calibration: str | None = None         # gpu-validate calibration (timed): the step cost
    vllm: dict[str, Any] = field(default_factory=dict)     # VllmSchedSettings overrides (given options only)
    sglang: dict[str, Any] = field(default_factory=dict)   # SglangSchedSettings overrides

    def __post_init__(self) -> None:
        if self.mode not in ("steps", "timed"):
            raise ConfigError(f"unknown --replay {self.mode!r}; choose {', '.join(MODES)}")
        if self.arrival_from is None:
            self.arrival_from = "step" if self.mode == "steps" else "timestamp"
        if self.arrival_from not in ARRIVAL_FROM:
            raise ConfigError(f"unknown --arrival-from {self.arrival_from!r}; choose step or timestamp")
        if self.arrivals not in ARRIVALS:
            raise ConfigError(f"unknown --arrivals {self.arrivals!r}; choose logged or closed-loop")
        if not self.speedup > 0:
            raise ConfigError(f"--speedup must be positive, got {self.speedup}")
        if self.step_seconds is not None and not self.step_seconds > 0:
            raise ConfigError(f"--step-seconds must be positive, got {self.step_seconds}")
        if self.mode == "steps":
            if self.calibration is not None:
                raise ConfigError("--calibration sets the step cost of --replay timed; --replay steps has no "
                                  "time model")
            if self.arrival_from == "timestamp" and self.step_seconds is None:
                raise ConfigError("--arrival-from timestamp needs --step-seconds S (log seconds per engine step)")
            if self.arrival_from == "step" and self.speedup != 1.0:
                raise ConfigError("--speedup scales logged timestamps; with --arrival-from step there are none")
        elif self.arrival_from == "step" and self.step_seconds is None:
            raise ConfigError("--replay timed --arrival-from step needs --step-seconds S (seconds per logged step)")

    def overrides(self, family: str) -> dict[str, Any]:
        """The scheduler options given for the engines of ``family`` (vllm | sglang)."""
        return dict(getattr(self, family, None) or {})

    def describe_arrivals(self) -> str:
        if self.arrival_from == "step":
            what = "arrival_step" if self.mode == "steps" else f"arrival_step x {self.step_seconds} s"
        elif self.mode == "steps":
            what = f"timestamps, {self.step_seconds} s per step"
        else:
            what = "timestamps"
        if self.speedup != 1.0:
            what += f", sped up {self.speedup:g}x"
        return what + (", closed-loop sessions" if self.arrivals == "closed-loop" else "")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ConcurrentRun:
    """One policy's concurrent replay: per-request results, settings, and for timed the latencies."""

    policy: str
    engine: str                       # vllm | sglang
    mode: str
    settings: Any                     # VllmSchedSettings | SglangSchedSettings
    defaults: str                     # which scheduler defaults were taken
    steps: StepResult
    released: np.ndarray              # release step (steps) or second (timed) per request
    timed: TimedResult | None = None
    uncached: TimedResult | None = None   # the same load without prefix caching (timed)
    untiered: TimedResult | None = None   # the same load without the offload tier (timed, --offload)
    cost: str | None = None           # the step-time model (timed)
    elapsed_s: float = 0.0


# -- releases ------------------------------------------------------------------------------
def releases_for(trace: Trace, mode: ReplayMode) -> Releases:
    """When each request reaches the engine (steps or seconds), per ``mode``; clear errors when
    the log lacks what the mode needs."""
    n = len(trace)
    where = ", ".join(trace.meta.sources) or "the log"
    if mode.arrival_from == "step":
        steps = np.asarray(trace.arrival_step, np.int64)
        missing = int((steps < 0).sum())
        if missing:
            hint = (" (it has timestamps: try --arrival-from timestamp --step-seconds S)"
                    if np.isfinite(trace.arrival).all() and n else "")
            raise ConfigError(f"--replay {mode.mode} --arrival-from step needs arrival_step on every request; "
                              f"{missing:,} of {n:,} in {where} have none{hint}")
        at = steps if mode.mode == "steps" else steps * float(mode.step_seconds)
    else:
        seconds = np.asarray(trace.arrival, np.float64)
        missing = int((~np.isfinite(seconds)).sum())
        if missing:
            hint = " (it has arrival_step: try --arrival-from step)" if n and (trace.arrival_step >= 0).all() else ""
            raise ConfigError(f"--replay {mode.mode} with --arrival-from timestamp needs a timestamp on every "
                              f"request; {missing:,} of {n:,} in {where} have none{hint}")
        seconds = (seconds - (seconds.min() if n else 0.0)) / mode.speedup
        at = Releases.steps_from_seconds(seconds, mode.step_seconds) if mode.mode == "steps" else seconds
    if mode.arrivals == "closed-loop":
        return Releases.closed_loop(at, trace.session)
    return Releases.logged(at)


# -- settings ------------------------------------------------------------------------------
def scheduler_settings(policy: str, options: SimOptions, mode: ReplayMode, trace: Trace | None = None):
    """(settings, which defaults were taken) of ``policy``'s scheduler for these options.

    Without a capacity, the "unlimited" pool is sized to hold every request of ``trace`` at once.
    """
    spec = registry.engine(policy)
    return spec.scheduler_settings(options, mode.overrides(spec.family), trace)


def check_supported(policies: list[str], options: SimOptions) -> None:
    """Settings only the sequential replay models: a clear error rather than a silent ignore."""
    for policy in policies:
        registry.engine(policy).check_concurrent(options)


# -- running ---------------------------------------------------------------------------------
def engine_inputs(trace: Trace) -> dict[str, Any]:
    """Per-request arrays the scheduler models take, from the trace."""
    out, off = output_token_arrays(trace)
    return {
        "prompts": Ragged(trace.require_tokens(), trace.offsets),
        "outputs": Ragged(out, off),
        "loras": trace.names("lora"),
        "salts": trace.names("cache_salt"),
        "prompt_logprobs": np.asarray(trace.prompt_logprobs, bool),
        "logprob_starts": np.asarray(trace.logprob_start_len, np.int64),
    }


def run_concurrent(trace: Trace, policies: list[str], options: SimOptions, mode: ReplayMode,
                   progress: Callable[[str, int], Callable[[int], None]] | None = None) -> dict[str, ConcurrentRun]:
    """Replay ``trace`` through each policy's scheduler model.

    ``progress(description, total)`` returns an ``update(done)`` callback (a progress bar).
    """
    from kvsim.drive.clock import run
    from kvsim.drive.step_cost import step_cost

    trace.require_tokens(f"--replay {mode.mode}")
    check_supported(policies, options)
    cost = step_cost(options.model, options.gpu, mode.calibration) if mode.mode == "timed" else None
    releases = releases_for(trace, mode)
    inputs = engine_inputs(trace)
    runs: dict[str, ConcurrentRun] = {}
    for policy in policies:
        settings, note = scheduler_settings(policy, options, mode, trace)
        t0 = time.perf_counter()

        def replay(s, label: str | None, engine=None):
            engine = engine or make_engine(s, **inputs)
            update = progress(f"{label} ({policy})", len(trace)) if progress and label else None
            steps, line = run(engine, releases, cost, progress=update)
            engine.result.steps = steps
            return engine.result, line

        main = make_engine(settings, **inputs)   # (its modules imported before a side replay forks)
        sides = _side_replays(settings, replay) if cost is not None else {}
        with ExitStack() as beside:   # (a side replay still running if this fails is stopped)
            for side in sides.values():
                beside.enter_context(side)
            result, line = replay(settings, f"replaying {mode.mode}", main)
            r = ConcurrentRun(policy, registry.engine(policy).family, mode.mode, settings, note, result,
                              line.released)
            if cost is not None:
                from kvsim.drive.timed import timed_result

                r.timed = timed_result(result, line)
                r.uncached = sides["uncached"].result()
                if "untiered" in sides:    # --offload: TTFT with and without the tier
                    r.untiered = sides["untiered"].result()
                r.cost = cost.describe()
        r.elapsed_s = time.perf_counter() - t0
        runs[policy] = r
    return runs


def _side_replays(settings, replay: Callable) -> dict[str, Any]:
    """The timed replays beside the main one (without prefix caching; with an offload tier,
    without the tier), started now on another core where one is free (kvsim.drive.side)."""
    from kvsim.drive.side import Side
    from kvsim.drive.timed import timed_result

    def side(s, label: str) -> Side:
        return Side(lambda here: timed_result(*replay(s, label if here else None)))

    sides = {"uncached": side(without_prefix_caching(settings), "without prefix caching")}
    if hasattr(settings, "without_tier"):
        sides["untiered"] = side(settings.without_tier(), "without the offload tier")
    return sides


# -- results ---------------------------------------------------------------------------------
def concurrent_summary(r: ConcurrentRun, trace: Trace) -> dict[str, Any]:
    """Headline figures of one policy's concurrent replay (JSON-ready)."""
    s = r.steps
    served = ~s.rejected
    prompt = trace.prompt_lengths
    p_ok, c_ok = int(prompt[served].sum()), int(s.cached_tokens[served].sum())
    out: dict[str, Any] = {
        "policy": r.policy, "mode": r.mode, "requests": len(trace), "admitted": int(served.sum()),
        "rejected": int(s.rejected.sum()), "prompt_tokens": p_ok, "cached_tokens": c_ok,
        "computed_tokens": p_ok - c_ok, "token_hit_rate": c_ok / p_ok if p_ok else 0.0,
        "request_hit_rate": float((s.cached_tokens[served] > 0).mean()) if served.any() else 0.0,
        "preemptions": int(s.preemptions.sum()),
        "preempted_requests": int((s.preemptions > 0).sum()),
        "steps": int(s.steps), "replay_seconds": r.elapsed_s,
    }
    if r.timed is not None:
        out.update(_timed_figures(r.timed))
        out["step_cost"] = r.cost
        off = _timed_figures(r.uncached)
        out["without_prefix_caching"] = off
        out["saved"] = {k: off[k] - out[k] for k in off if k.endswith("_s") or k == "prefill_tokens_computed"}
    if "offload" in s.extra:   # the tier's hits and transfers (kvsim.tiers.report)
        out["offload"] = s.extra["offload"].summary(prompt, served)
        if r.untiered is not None:
            out["offload"]["without_tier"] = _timed_figures(r.untiered)
    return out


def _timed_figures(t: TimedResult) -> dict[str, Any]:
    served = ~t.steps.rejected
    out: dict[str, Any] = {}
    for name, values in (("ttft", t.ttft), ("e2e", t.e2e), ("queueing", t.queueing)):
        v = values[served]
        for p in PERCENTILES:
            out[f"{name}_p{p}_s"] = percentile(v, p) if len(v) else float("nan")
        out[f"{name}_mean_s"] = float(v.mean()) if len(v) else float("nan")
    out["gpu_busy_s"] = t.busy_s
    out["makespan_s"] = t.makespan_s
    out["output_tokens_per_s"] = t.output_tokens / t.makespan_s if t.makespan_s > 0 else 0.0
    out["requests_per_s"] = float(served.sum()) / t.makespan_s if t.makespan_s > 0 else 0.0
    out["prefill_tokens_computed"] = int(t.prefill_tokens[served].sum())
    return out


def concurrent_frame(r: ConcurrentRun, trace: Trace):
    """One row per request, in input order (``--per-request``)."""
    import pandas as pd

    from kvsim.drive.metrics import category_columns

    s = r.steps
    prompt = trace.prompt_lengths
    cached = np.where(s.rejected, 0, s.cached_tokens)
    cols: dict[str, Any] = {
        "index": np.arange(len(trace)),
        "request_id": pd.Series([trace.request_id(i) for i in range(len(trace))], dtype=object),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "output_tokens": np.where(s.rejected, 0, s.output_tokens),
        "rejected": s.rejected,
        ("arrival_step" if r.mode == "steps" else "arrival_s"): r.released,
        "first_token_step": s.first_token_step,
        "finish_step": s.finish_step,
        "preemptions": s.preemptions,
    }
    if r.timed is not None:
        t = r.timed
        cols.update(queueing_delay_s=t.queueing, ttft_s=t.ttft, e2e_s=t.e2e,
                    prefill_tokens_computed=np.where(s.rejected, 0, t.prefill_tokens),
                    ttft_without_prefix_caching_s=r.uncached.ttft)
        if r.untiered is not None:
            cols["ttft_without_offload_s"] = r.untiered.ttft
    if "offload" in s.extra:   # cached tokens by tier (gpu, cpu, disk)
        tier = s.extra["offload"].snapshot() if hasattr(s.extra["offload"], "snapshot") else s.extra["offload"]
        cols["cached_by_tier"] = pd.Series([tier.cached_by_tier(i) for i in range(len(trace))], dtype=object)
    frame = pd.DataFrame(cols)
    for name, column in category_columns(trace).items():
        frame[name] = column
    return frame


def concurrent_json(trace: Trace, runs: dict[str, ConcurrentRun], options: SimOptions,
                    mode: ReplayMode) -> dict[str, Any]:
    """The summary as JSON (no prompt text)."""
    return {
        "mode": mode.mode,
        "trace": {"sources": trace.meta.sources, "formats": trace.meta.formats, "requests": len(trace),
                  "prompt_tokens": trace.num_prompt_tokens, "tokenizer": trace.meta.tokenizer},
        "options": options.as_dict(),
        "replay": {**mode.as_dict(), "arrivals_from": mode.describe_arrivals()},
        "policies": {name: {"summary": concurrent_summary(r, trace), "engine": r.engine,
                            "scheduler": asdict(r.settings), "defaults": r.defaults}
                     for name, r in runs.items()},
    }


def concurrent_rows(trace: Trace, runs: dict[str, ConcurrentRun]):
    """Per-request rows (with a ``policy`` column when several policies ran)."""
    for name, r in runs.items():
        for row in concurrent_frame(r, trace).to_dict(orient="records"):
            row = {k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}  # NaN -> null
            yield {"policy": name, **row} if len(runs) > 1 else row
