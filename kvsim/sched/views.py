"""The concurrent view of a log with timestamps: what changes under load (data for reports).

For one policy at one capacity: the hit rate of the sequential replay (one request at a
time) beside the hit rate when requests overlap as they arrived; with a step-cost model,
the TTFT distribution with and without prefix caching on the same load; for radix, the
hit rates of ``lpm`` and ``fcfs``. Hit rate here is cached prompt tokens over prompt
tokens of the requests served.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from kvsim.io.trace import Trace
from kvsim.replay.options import SimOptions
from kvsim.replay.requests import output_token_arrays
from kvsim.sched.clock import Releases
from kvsim.sched.settings import sglang_settings, vllm_settings
from kvsim.sched.timed import compare_prefix_caching, replay_steps, replay_timed

DEFAULT_STEP_SECONDS = 0.05


@dataclass
class ConcurrentView:
    policy: str
    mode: str                                   # "timed" (a step-cost model) or "steps"
    sequential_hit_rate: float
    concurrent_hit_rate: float
    ttft_cached: np.ndarray | None = None       # seconds, per served request (timed mode)
    ttft_uncached: np.ndarray | None = None
    policy_hit_rates: dict[str, float] = field(default_factory=dict)   # radix: fcfs / lpm
    notes: list[str] = field(default_factory=list)


def hit_rate(cached: np.ndarray, prompt_lengths: np.ndarray, served: np.ndarray) -> float:
    total = int(prompt_lengths[served].sum())
    return float(cached[served].sum()) / total if total else 0.0


def concurrent_view(trace: Trace, options: SimOptions, policy: str, cost=None,
                    step_seconds: float = DEFAULT_STEP_SECONDS, speedup: float = 1.0) -> ConcurrentView | None:
    """The view for ``policy`` ("apc" or "radix"), or None when the log has no timestamps."""
    if len(trace) == 0 or not np.isfinite(trace.arrival).all():
        return None
    from kvsim.cache.registry import get_replayer

    out, off = output_token_arrays(trace)
    prompts = [trace.prompt(i) for i in range(len(trace))]
    outputs = [out[off[i]:off[i + 1]] for i in range(len(trace))]
    names = {"loras": [trace.name_of("lora", int(c)) for c in trace.lora],
             "salts": [trace.name_of("cache_salt", int(c)) for c in trace.cache_salt]}
    lengths = trace.prompt_lengths
    sequential = get_replayer(policy)(trace, options)
    seq_rate = hit_rate(sequential.cached_tokens, lengths, ~sequential.rejected)
    make = vllm_settings if policy == "apc" else sglang_settings
    settings, note = make(options)
    view = ConcurrentView(policy, "timed" if cost is not None else "steps", seq_rate, 0.0, notes=[note])

    def run(s):
        if cost is not None:
            return replay_timed(s, prompts, outputs, Releases.logged(trace.arrival / speedup), cost, **names)
        return replay_steps(s, prompts, outputs, Releases.logged(Releases.steps_from_seconds(
            trace.arrival / speedup, step_seconds)), **names)

    if cost is not None:
        cached, uncached = compare_prefix_caching(settings, prompts, outputs,
                                                  Releases.logged(trace.arrival / speedup), cost, **names)
        steps = cached.steps
        served = ~steps.rejected
        view.ttft_cached, view.ttft_uncached = cached.ttft[served], uncached.ttft[served]
    else:
        steps = run(settings)
        view.notes.append(f"step clock: {step_seconds} s of log time per step")
    view.concurrent_hit_rate = hit_rate(steps.cached_tokens, lengths, ~steps.rejected)
    if policy == "radix":
        for name in ("fcfs", "lpm"):
            r = run(_with_policy(settings, name))
            r = r.steps if cost is not None else r
            view.policy_hit_rates[name] = hit_rate(r.cached_tokens, lengths, ~r.rejected)
    return view


def _with_policy(settings, name: str):
    return dataclasses.replace(settings, schedule_policy=name)
