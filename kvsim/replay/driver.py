"""The sequential replay: one driver for every cache design and both implementations.

Each request is admitted, prefilled, decoded to its output length and finished before the
next one starts, as an engine serves requests sent one at a time. The driver resolves the
design's settings once (``from_options``), flattens the trace into a
:class:`~kvsim.cache.base.Workload`, lets the engine serve it and packs the per-request
columns and the design's own figures into a :class:`ReplayResult`. A concurrent scheduler
plugs in here, in place of :meth:`SequentialCache.replay`.
"""
from __future__ import annotations

import time

from kvsim.cache.base import Progress, SequentialCache
from kvsim.cache.registry import get_design
from kvsim.io.trace import Trace
from kvsim.replay.options import SimOptions
from kvsim.replay.requests import workload
from kvsim.replay.result import ReplayResult


def replay(policy: str, trace: Trace, options: SimOptions | None = None, progress: Progress | None = None,
           implementation: str = "fast") -> ReplayResult:
    """Replay ``trace`` sequentially through ``policy`` ("apc" or "radix").

    ``implementation="reference"`` runs the readable model, which gives identical results,
    slowly. ``progress(done, total)`` is called now and then.
    """
    return replay_detailed(policy, trace, options, progress, implementation)[0]


def replay_detailed(policy: str, trace: Trace, options: SimOptions | None = None,
                    progress: Progress | None = None,
                    implementation: str = "fast") -> tuple[ReplayResult, SequentialCache]:
    """:func:`replay`, plus the engine in its final state (APC: ``final_state()``; radix: ``tree``)."""
    design = get_design(policy)
    engine_class = design.implementation(implementation)
    settings = design.settings_type().from_options(options or SimOptions())
    trace.require_tokens(f"the {policy} simulation")
    work = workload(trace)
    cache = engine_class.for_workload(settings, work)
    t0 = time.perf_counter()
    cols = cache.replay(work, progress)
    elapsed = time.perf_counter() - t0
    config, extra, read_cache = design.reporter()(settings, implementation, cache, work, cols)
    result = ReplayResult(
        policy=policy, config=config, cached_tokens=cols.cached_tokens, rejected=cols.rejected,
        read_cache=read_cache, evictions=cols.evictions, evicted_tokens=cols.evicted_tokens,
        capacity_tokens=settings.capacity_tokens, peak_used_tokens=int(cache.peak_used_tokens),
        elapsed_s=elapsed, extra=extra)
    return result, cache
