"""Timed replay: the step clock in seconds, and what users ask of it (``--replay timed``).

Each step lasts what the step-cost model (``step_cost.py``) says for its batch; a request's
first token is out when the step that produced it ends. Per request: queueing delay (from
release to the start of the first step that computes for it), TTFT, end-to-end latency,
prefill tokens computed (recomputation after a preemption or retraction included).
Summary: TTFT and end-to-end percentiles, throughput, GPU busy time — and, run on the
same load with prefix caching off, the time the cache saves.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from kvsim.drive.clock import Releases, Timeline, run
from kvsim.engines.base import StepResult
from kvsim.drive.percentiles import percentile

PERCENTILES = (50, 90, 99)


def make_engine(settings, prompts, outputs, priorities=None, loras=None, salts=None, prompt_logprobs=None,
                logprob_starts=None):
    """The stepped engine of these scheduler settings (each engine's settings build its own);
    ``loras`` / ``salts`` are namespaces.

    ``prompt_logprobs`` (vLLM: the request skips reading the cache) and ``logprob_starts``
    (SGLang: ``logprob_start_len`` caps the match, -1 none) are the logprob arguments per request.
    """
    return settings.engine(prompts, outputs, priorities=priorities, loras=loras, salts=salts,
                           prompt_logprobs=prompt_logprobs, logprob_starts=logprob_starts)


def without_prefix_caching(settings):
    """The same engine with prefix caching off (the comparison run), and no offload tier."""
    if hasattr(settings, "without_tier"):
        settings = settings.without_tier()
    return dataclasses.replace(settings, enable_prefix_caching=False)


def replay_steps(settings, prompts, outputs, releases: Releases, priorities=None, loras=None,
                 salts=None, **logprobs) -> StepResult:
    """Step-clock replay (``--replay steps``); releases are step numbers."""
    engine = make_engine(settings, prompts, outputs, priorities, loras, salts, **logprobs)
    engine.result.steps, _ = run(engine, releases)
    return engine.result


@dataclass
class TimedResult:
    """Per-request latencies (seconds, NaN for rejected requests) and the run's totals."""

    steps: StepResult
    released: np.ndarray
    queueing: np.ndarray
    ttft: np.ndarray
    e2e: np.ndarray
    prefill_tokens: np.ndarray
    decode_tokens: np.ndarray
    busy_s: float                 # time some batch was running
    makespan_s: float             # first release to last finish
    output_tokens: int

    def summary(self) -> dict:
        """Percentiles of TTFT and end-to-end latency, throughput, busy time."""
        served = ~self.steps.rejected
        out = {"requests": int(served.sum()), "rejected": int((~served).sum()),
               "busy_s": self.busy_s, "makespan_s": self.makespan_s,
               "output_tokens_per_s": self.output_tokens / self.makespan_s if self.makespan_s > 0 else 0.0,
               "prefill_tokens": int(self.prefill_tokens.sum()),
               "cached_tokens": int(self.steps.cached_tokens[served].sum()),
               "preemptions": int(self.steps.preemptions.sum())}
        for name, values in (("ttft", self.ttft), ("e2e", self.e2e), ("queueing", self.queueing)):
            v = values[served]
            for p in PERCENTILES:
                out[f"{name}_p{p}_s"] = percentile(v, p) if len(v) else float("nan")
        return out


def replay_timed(settings, prompts, outputs, releases: Releases, cost, priorities=None, loras=None,
                 salts=None, **logprobs) -> TimedResult:
    """Timed replay (``--replay timed``); releases are seconds (already divided by ``--speedup``)."""
    engine = make_engine(settings, prompts, outputs, priorities, loras, salts, **logprobs)
    nsteps, line = run(engine, releases, cost)
    result = engine.result
    result.steps = nsteps
    return timed_result(result, line)


def timed_result(result: StepResult, line: Timeline) -> TimedResult:
    """Latencies of a finished timed run, from its step results and timeline."""
    end = np.asarray(line.step_end + [np.nan])              # index -1 (never) -> NaN
    first = end[result.first_token_step]
    finish = end[result.finish_step]
    served = ~result.rejected
    busy = line.busy_seconds()
    makespan = float(np.nanmax(finish) - np.nanmin(line.released)) if served.any() else 0.0
    return TimedResult(result, line.released, line.first_scheduled - line.released, first - line.released,
                       finish - line.released, line.prefill_tokens, line.decode_tokens, busy, makespan,
                       int(result.output_tokens.sum()))


def compare_prefix_caching(settings, prompts, outputs, releases: Releases, cost, priorities=None,
                           loras=None, salts=None, **logprobs) -> tuple[TimedResult, TimedResult]:
    """The same load with and without prefix caching: the saving is their difference."""
    return (replay_timed(settings, prompts, outputs, releases, cost, priorities, loras, salts, **logprobs),
            replay_timed(without_prefix_caching(settings), prompts, outputs, releases, cost, priorities, loras,
                         salts, **logprobs))
