"""The sequential fleet replay: one request at a time through the router and its replica.

Each request reaches the router at its logged time (seconds after the first; 0 when the
log has no timestamps), is routed with every replica idle (:data:`~kvsim.fleet.base.IDLE`:
nothing else is running), served whole by its replica, and finished before the next one
arrives. Two ways, the same result:

- routers fed by no engine event (every router but ``dynamo`` in events mode and
  ``llmd_precise``) decide from their own state only, so every request is routed first and
  each replica's sub-log is then replayed by the engine's fast sequential implementation,
  exactly as ``kvsim simulate`` replays a log (:func:`kvsim.drive.sequential.replay`);
- routers fed by events are served request by request: the replica's engine publishes the
  blocks it stores and evicts (``EngineSpec.kv_events``) and the router reads them before
  the next request.

With one replica, either way gives today's single-engine replay, request for request.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsim.drive.requests import workload
from kvsim.drive.result import ReplayResult
from kvsim.engines import registry
from kvsim.engines.base import ServedColumns
from kvsim.engines.options import SimOptions
from kvsim.fleet.base import IDLE, Router
from kvsim.fleet.bounds import Bounds, bounds
from kvsim.fleet.config import FleetSpec, RouteRequests, checked_router, log_seconds, replica_replay, sub_workload
from kvsim.fleet.events import from_engine
from kvsim.fleet.summary import fleet_summary


@dataclass
class FleetReplay:
    """One policy's sequential fleet replay."""

    policy: str
    fleet: FleetSpec
    result: ReplayResult                      # the fleet's, per request in log order
    replica: np.ndarray                       # int64 (n,): the replica of each request
    replicas: list[ReplayResult | None]       # each replica's replay of its sub-log (None: no request)
    order: np.ndarray                         # the order requests reached the replicas
    router: Router                            # in its final state
    routing_s: float = 0.0                    # time spent routing
    bounds: Bounds | None = None
    servers: list | None = None               # event routers: each replica's engine, in its final state

    def fleet_summary(self, trace) -> dict[str, Any]:
        """The ``fleet`` summary (over the counted requests: a warm-up window is left out)."""
        from kvsim.drive.metrics import counted

        r = self.result
        return fleet_summary(self.fleet, self.router, trace, self.replica, r.cached_tokens, r.rejected, counted(r),
                             self.bounds, r.capacity_tokens)


def run_fleet_simulation(trace, policies: list[str], options: SimOptions, fleet: FleetSpec,
                         progress: bool = False) -> dict[str, FleetReplay]:
    """Each policy's sequential fleet replay, with its bounds; a progress bar per policy when asked."""
    from contextlib import nullcontext

    trace.require_tokens("simulate")
    bars = None
    if progress and len(trace) >= 2000:
        from kvsim.progress import bars as display

        bars = display("count")
    runs: dict[str, FleetReplay] = {}
    with (bars or nullcontext()) as bars:
        for name in policies:
            update = None if bars is None else bars.task(f"replaying ({name}, {fleet.replicas} replicas)", len(trace))
            run = fleet_replay(name, trace, options, fleet, update)
            run.bounds = bounds(name, trace, options, run.replica, run.order)
            runs[name] = run
    return runs


def fleet_rows(trace, runs: dict[str, FleetReplay]):
    """One dict per request (per policy when several), each with its ``replica``, in input order."""
    from kvsim.drive.metrics import counted, per_request_frame

    for name, run in runs.items():
        frame = per_request_frame(run.result, trace)
        frame.insert(2, "replica", run.replica[counted(run.result)])
        for row in frame.to_dict(orient="records"):
            yield {"policy": name, **row} if len(runs) > 1 else row


def route_all(router: Router, requests: RouteRequests, times: np.ndarray) -> np.ndarray:
    """Route every request of a sequential replay (idle replicas, each finished before the next)."""
    n = len(requests)
    idle = [IDLE] * router.num_replicas
    replica = np.empty(n, np.int64)
    for i in range(n):
        t = float(times[i])
        req = requests.request(i, t)
        r = router.route(req, idle, t)
        replica[i] = r
        router.prefill_done(req, r, t)
        router.finished(req, r, t)
    return replica


def fleet_replay(policy: str, trace, options: SimOptions, fleet: FleetSpec, progress=None) -> FleetReplay:
    """Replay ``trace`` sequentially through ``fleet.replicas`` replicas of ``policy`` behind its router."""
    spec = registry.engine(policy)
    trace.require_tokens("the fleet replay")
    router = checked_router(fleet, spec, options, trace)
    requests = RouteRequests(trace)
    times = log_seconds(trace)
    t0 = time.perf_counter()
    servers = None
    if router.needs_events:
        replica, subs, servers = _served_with_events(spec, trace, options, router, requests, times, progress)
        routing = 0.0
    else:
        replica = route_all(router, requests, times)
        routing = time.perf_counter() - t0
        subs = []
        work = None
        for r in range(fleet.replicas):
            idx = np.flatnonzero(replica == r)
            sub = None
            if len(idx):
                work = workload(trace) if work is None else work
                sub = replica_replay(policy, trace, work, idx, options)
            subs.append((idx, sub))
            if progress is not None:
                progress(int(sum(len(i) for i, _ in subs)), len(trace))
    result = combine(policy, len(trace), subs)
    result.elapsed_s = time.perf_counter() - t0
    return FleetReplay(policy, fleet, result, replica, [s for _, s in subs], np.arange(len(trace)), router,
                       routing, servers=servers)


def _served_with_events(spec, trace, options, router: Router, requests: RouteRequests, times, progress):
    """Serve request by request; the router reads each replica's KV events as they happen."""
    kv = spec.kv_events()
    settings = spec.settings(options)
    N = router.num_replicas
    servers = [kv.sequential(spec, settings) for _ in range(N)]
    work = workload(trace)
    idle = [IDLE] * N
    n = len(trace)
    replica = np.empty(n, np.int64)
    served: list[list] = [[] for _ in range(N)]
    elapsed = [0.0] * N
    for i in range(n):
        t = float(times[i])
        req = requests.request(i, t)
        r = router.route(req, idle, t)
        replica[i] = r
        t0 = time.perf_counter()
        served[r].append(servers[r].serve_at(work, i))
        elapsed[r] += time.perf_counter() - t0
        for ev in servers[r].drain():
            router.kv_event(r, from_engine(ev), t)
        router.prefill_done(req, r, t)
        router.finished(req, r, t)
        if progress is not None and (i + 1) % 1024 == 0:
            progress(i + 1, n)
    subs = []
    report = spec.replay_report()
    for r in range(N):
        idx = np.flatnonzero(replica == r)
        if not len(idx):
            subs.append((idx, None))
            continue
        cols = ServedColumns.empty(len(idx))
        for k, s in enumerate(served[r]):
            cols.set(k, s)
        sub_work = work if len(idx) == n else sub_workload(work, idx)
        config, extra, read = report(settings, servers[r].implementation, servers[r].report_cache(), sub_work, cols)
        subs.append((idx, ReplayResult(
            policy=spec.name, config=config, cached_tokens=cols.cached_tokens, rejected=cols.rejected,
            read_cache=read, evictions=cols.evictions, evicted_tokens=cols.evicted_tokens,
            capacity_tokens=settings.capacity_tokens, peak_used_tokens=int(servers[r].peak_used_tokens),
            elapsed_s=elapsed[r], extra=extra)))
    if progress is not None:
        progress(n, n)
    return replica, subs, servers


def combine(policy: str, n: int, subs: list[tuple[np.ndarray, ReplayResult | None]]) -> ReplayResult:
    """The fleet's replay from its replicas': per-request columns back in log order; the
    capacity is one replica's, the peak the largest replica's."""
    done = [(idx, s) for idx, s in subs if s is not None]
    if len(done) == 1 and len(done[0][0]) == n:
        return done[0][1]                   # one replica took everything: its replay is the fleet's
    cached, evicted_tokens, evictions = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    rejected, read = np.zeros(n, bool), np.zeros(n, bool)
    for idx, s in done:
        cached[idx], rejected[idx], read[idx] = s.cached_tokens, s.rejected, s.read_cache
        evictions[idx], evicted_tokens[idx] = s.evictions, s.evicted_tokens
    first = done[0][1] if done else None
    return ReplayResult(
        policy=policy, config=dict(first.config) if first else {}, cached_tokens=cached, rejected=rejected,
        read_cache=read, evictions=evictions, evicted_tokens=evicted_tokens,
        capacity_tokens=first.capacity_tokens if first else None,
        peak_used_tokens=max((s.peak_used_tokens for _, s in done), default=0),
        elapsed_s=sum(s.elapsed_s for _, s in done), extra=merged_extra([s.extra for _, s in done]))


def merged_extra(extras: list[dict[str, Any]]) -> dict[str, Any]:
    """The replicas' own figures: summed counters, SGLang's logged rate over their sums, each
    replica's figures (without its tree) under ``replicas``."""
    if len(extras) == 1:
        return dict(extras[0])
    out: dict[str, Any] = {"engine": extras[0].get("engine") if extras else None,
                           "replicas": [{k: v for k, v in e.items() if k != "tree"} for e in extras]}
    for key in ("evicted_blocks", "sglang_cached_token_sum", "sglang_new_token_sum", "clipped_requests",
                "vllm_prefix_cache_queries", "vllm_prefix_cache_hits"):
        if extras and all(isinstance(e.get(key), (int, np.integer)) for e in extras):
            out[key] = int(sum(e[key] for e in extras))
    hit, new = out.get("sglang_cached_token_sum"), out.get("sglang_new_token_sum")
    if hit is not None and new is not None:
        out["sglang_logged_hit_rate"] = hit / (hit + new) if hit + new else 0.0
    return out
