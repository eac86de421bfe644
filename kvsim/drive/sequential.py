"""The sequential replay: one driver for every cache design and both implementations.

Each request is admitted, prefilled, decoded to its output length and finished before the
next one starts, as an engine serves requests sent one at a time. The driver resolves the
design's settings once (``from_options``), flattens the trace into a
:class:`~kvsim.engines.base.Workload`, lets the engine serve it and packs the per-request
columns and the design's own figures into a :class:`ReplayResult`. A concurrent scheduler
plugs in here, in place of :meth:`SequentialCache.replay`.
"""
from __future__ import annotations

import time

from kvsim.engines.base import Progress, SequentialCache, Workload
from kvsim.engines import registry
from kvsim.io.trace.columns import Trace
from kvsim.engines.options import SimOptions
from kvsim.drive.requests import workload
from kvsim.drive.result import ReplayResult


#: a replay of at most this many tokens (prompts and outputs) is served by the readable model,
#: which gives the fast engine's results without loading its compiled kernels (a command on a
#: small log starts in a fraction of a second)
SMALL_REPLAY_TOKENS = 1 << 15


def replay(policy: str, trace: Trace, options: SimOptions | None = None, progress: Progress | None = None,
           implementation: str = "fast") -> ReplayResult:
    """Replay ``trace`` sequentially through ``policy`` ("apc" or "radix").

    ``implementation="reference"`` runs the readable model, which gives identical results,
    slowly. ``progress(done, total)`` is called now and then.
    """
    if implementation == "fast" and small_replay(trace):
        return replay_detailed(policy, trace, options, progress, "reference", reported_as="fast")[0]
    return replay_detailed(policy, trace, options, progress, implementation)[0]


def small_replay(trace: Trace) -> bool:
    """Is the trace small enough for the readable model to serve as fast as the kernels load?"""
    return trace.num_prompt_tokens + int(trace.output_lengths.sum()) <= SMALL_REPLAY_TOKENS


def replay_detailed(policy: str, trace: Trace, options: SimOptions | None = None,
                    progress: Progress | None = None, implementation: str = "fast",
                    reported_as: str | None = None) -> tuple[ReplayResult, SequentialCache]:
    """:func:`replay`, plus the engine in its final state (APC: ``final_state()``; radix: ``tree``).
    ``reported_as`` names the implementation in the result (default: ``implementation``)."""
    spec = registry.engine(policy)
    engine_class = spec.implementation(implementation)
    settings = spec.settings(options or SimOptions())
    trace.require_tokens(f"the {policy} simulation")
    return _replay(policy, spec, engine_class, settings, workload(trace), progress, reported_as or implementation)


def replay_workload(policy: str, work: Workload, options: SimOptions | None = None,
                    implementation: str = "fast", reported_as: str | None = None) -> ReplayResult:
    """:func:`replay_detailed`'s result for a workload already built (a fleet replica's share of a log)."""
    spec = registry.engine(policy)
    return _replay(policy, spec, spec.implementation(implementation), spec.settings(options or SimOptions()), work,
                   None, reported_as or implementation)[0]


def _replay(policy: str, spec, engine_class, settings, work: Workload, progress: Progress | None,
            reported_as: str) -> tuple[ReplayResult, SequentialCache]:
    cache = engine_class.for_workload(settings, work)
    t0 = time.perf_counter()
    cols = cache.replay(work, progress)
    elapsed = time.perf_counter() - t0
    config, extra, read_cache = spec.replay_report()(settings, reported_as, cache, work, cols)
    result = ReplayResult(
        policy=policy, config=config, cached_tokens=cols.cached_tokens, rejected=cols.rejected,
        read_cache=read_cache, evictions=cols.evictions, evicted_tokens=cols.evicted_tokens,
        capacity_tokens=settings.capacity_tokens, peak_used_tokens=int(cache.peak_used_tokens),
        elapsed_s=elapsed, extra=extra)
    return result, cache
