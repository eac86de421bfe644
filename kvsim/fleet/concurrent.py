"""The concurrent fleet replay: ``kvsim simulate --replay steps|timed --replicas N --router NAME``.

Per policy: N scheduler models, each configured as ``--replay steps|timed`` configures one
engine today (:func:`kvsim.drive.concurrent.scheduler_settings`: capacity and scheduler
limits per replica), behind a fresh router, on the fleet clock (:mod:`kvsim.fleet.clock`).
A router fed by engine events gets engines that publish them (``EngineSpec.kv_events``:
vLLM's readable KV-cache manager, SGLang's tree as it is), or, where what the events would
leave can be read from the replicas exactly (Dynamo's index over vLLM's compiled pools,
``read_devices``), the compiled engines without events. Timed: TTFT and end-to-end
latency per request from its replica's timeline, and the same fleet (a fresh router)
without prefix caching for the time the cache saves. The result is a
:class:`~kvsim.drive.concurrent.ConcurrentRun`, so the single-engine summary, rows and
terminal view apply unchanged, plus the fleet's own figures.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from kvsim.drive.clock import Releases
from kvsim.drive.concurrent import (ConcurrentRun, ReplayMode, check_supported, engine_inputs, releases_for,
                                    scheduler_settings)
from kvsim.drive.side import Side
from kvsim.drive.timed import TimedResult, make_engine, without_prefix_caching
from kvsim.engines import registry
from kvsim.engines.base import StepResult
from kvsim.engines.options import SimOptions
from kvsim.fleet.base import Router
from kvsim.fleet.bounds import Bounds, bounds
from kvsim.fleet.clock import FleetTimeline, run_fleet
from kvsim.fleet.config import FleetSpec, RouteRequests, checked_router
from kvsim.fleet.summary import fleet_summary


@dataclass
class FleetRun(ConcurrentRun):
    """One policy's concurrent fleet replay: a ConcurrentRun plus the fleet's own record."""

    fleet: FleetSpec | None = None
    line: FleetTimeline | None = None
    router: Router | None = None
    bounds: Bounds | None = None

    @property
    def replica(self) -> np.ndarray:
        return self.line.replica

    def fleet_summary(self, trace) -> dict[str, Any]:
        s = self.steps
        served_ttft = None if self.timed is None else self.timed.ttft
        return fleet_summary(self.fleet, self.router, trace, self.line.replica, s.cached_tokens, s.rejected,
                             np.ones(len(trace), bool), self.bounds, _capacity_tokens(self.settings),
                             mode=self.mode, peaks=(self.line.peak_waiting, self.line.peak_running),
                             ttft=served_ttft, steps=self.line.steps)


def _capacity_tokens(settings) -> int | None:
    """A replica's KV capacity in tokens, from its scheduler settings."""
    for name, per in (("num_gpu_blocks", "block_size"), ("capacity", None)):
        value = getattr(settings, name, None)
        if value is not None:
            return int(value) if per is None else (int(value) - 1) * int(getattr(settings, per))
    return None


def fleet_replay_once(spec, settings, fleet: FleetSpec, options: SimOptions, trace, inputs: dict[str, Any],
                      requests: RouteRequests, releases: Releases, cost, mode: ReplayMode,
                      progress: Callable[[int], None] | None = None) -> tuple[StepResult, FleetTimeline, Router, Any]:
    """One pass of the fleet clock over fresh replicas and a fresh router; with the log's keys
    the replicas computed once, where their engine keeps them (``keyed_log``; else None)."""
    router = checked_router(fleet, spec, options, trace)
    drains = reads = None
    if router.needs_events:
        kv = spec.kv_events()
        reads = hasattr(router, "read_devices") and getattr(kv, "reads_devices", lambda s: False)(settings)
        if not reads:
            settings = kv.scheduler_settings(settings)
    engines = [make_engine(settings, **inputs) for _ in range(fleet.replicas)]
    if reads:                           # the index the events would build, read from the pools
        router.read_devices(kv.device_blocks(engines))
    elif router.needs_events:
        drains = [kv.record(e) for e in engines]
    result, line = run_fleet(engines, router, requests, releases, cost, mode.step_seconds, drains, progress)
    result.steps = max(line.clocks) if cost is None else sum(line.steps)
    return result, line, router, getattr(engines[0], "keyed_log", None)


def fleet_timed(result: StepResult, line: FleetTimeline) -> TimedResult:
    """Latencies of a timed fleet run: each request's steps on its replica's timeline."""
    n = len(result.rejected)
    first, finish = np.full(n, np.nan), np.full(n, np.nan)
    busy = 0.0
    for r, tl in enumerate(line.lines):
        idx = np.flatnonzero(line.replica == r)
        end = np.asarray(tl.step_end + [np.nan])        # index -1 (never) -> NaN
        first[idx] = end[result.first_token_step[idx]]
        finish[idx] = end[result.finish_step[idx]]
        busy += tl.busy_seconds()
    released = np.asarray(line.released, np.float64)
    served = ~result.rejected
    makespan = float(np.nanmax(finish) - np.nanmin(released)) if served.any() else 0.0
    return TimedResult(result, released, line.first_scheduled - released, first - released, finish - released,
                       line.prefill_tokens, line.decode_tokens, busy, makespan, int(result.output_tokens.sum()))


def run_fleet_concurrent(trace, policies: list[str], options: SimOptions, mode: ReplayMode, fleet: FleetSpec,
                         progress: Callable[[str, int], Callable[[int], None]] | None = None,
                         with_bounds: bool = True) -> dict[str, FleetRun]:
    """Replay ``trace`` through a fleet of each policy's scheduler model (and, ``with_bounds``,
    compute the fleet's bounds)."""
    from kvsim.drive.step_cost import step_cost

    trace.require_tokens(f"--replay {mode.mode}")
    check_supported(policies, options)
    cost = step_cost(options.model, options.gpu, mode.calibration) if mode.mode == "timed" else None
    releases = releases_for(trace, mode)
    inputs = engine_inputs(trace)
    requests = RouteRequests(trace)
    runs: dict[str, FleetRun] = {}
    for policy in policies:
        spec = registry.engine(policy)
        settings, note = scheduler_settings(policy, options, mode, trace)
        t0 = time.perf_counter()

        def once(s, label: str | None):
            update = (progress(f"{label} ({policy}, {fleet.replicas} replicas)", len(trace))
                      if progress and label else None)
            return fleet_replay_once(spec, s, fleet, options, trace, inputs, requests, releases, cost, mode, update)

        # the same fleet without prefix caching, beside the main replay (kvsim.drive.side); an
        # engine built and dropped first imports the engine's modules and computes what the
        # replicas share (the log's keys, on both cores) before the fork
        if cost is not None:
            getattr(make_engine(settings, **inputs), "prepare_fleet", lambda: None)()
        uncached = (Side(lambda here, s=without_prefix_caching(settings):
                         fleet_timed(*once(s, "without prefix caching" if here else None)[:2]))
                    if cost is not None else None)
        with uncached or nullcontext():   # (stopped if the main replay fails)
            result, line, router, keyed = once(settings, f"replaying {mode.mode}")
            r = FleetRun(policy, spec.family, mode.mode, settings, note, result, line.released, fleet=fleet,
                         line=line, router=router)
            if with_bounds:             # (while the replay without prefix caching may still run)
                r.bounds = bounds(policy, trace, options, line.replica, np.asarray(line.order, np.int64), keyed)
            if uncached is not None:
                r.timed = fleet_timed(result, line)
                r.uncached = uncached.result()
                r.cost = cost.describe()
        r.elapsed_s = time.perf_counter() - t0
        runs[policy] = r
    return runs


def fleet_frame(r: FleetRun, trace):
    """``concurrent_frame`` with each request's ``replica`` beside its ``request_id``."""
    from kvsim.drive.concurrent import concurrent_frame

    frame = concurrent_frame(r, trace)
    frame.insert(2, "replica", r.line.replica)
    return frame


def fleet_concurrent_rows(trace, runs: dict[str, FleetRun]):
    """Per-request rows with ``replica`` (and ``policy`` when several ran)."""
    for name, r in runs.items():
        for row in fleet_frame(r, trace).to_dict(orient="records"):
            row = {k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}  # NaN -> null
            yield {"policy": name, **row} if len(runs) > 1 else row
