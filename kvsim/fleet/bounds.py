"""The fleet's hit-rate attribution: what any routing could give, what this routing captured.

- ``fleet_bound``: one unlimited cache shared by every replica: the log, in the order the
  replicas took its requests, replayed sequentially through the engine's rules with an
  unlimited capacity: each distinct prefix is computed once in the whole fleet.
- ``routed_bound``: an unlimited cache per replica, under this routing: each replica's
  sub-log, in the order it took them, replayed the same way: each distinct prefix is
  computed once per replica that sees it.
- ``delivered``: the replay itself, with the real capacities, eviction and (``steps`` /
  ``timed``) batching.

Per request, the fleet bound >= the routed bound (a replica's unlimited cache holds a
subset of the fleet's, everything else equal) >= delivered (a limited cache holds a
subset of the unlimited one's; requests sent concurrently only see less, with a queue
order that keeps arrival order: vLLM's fcfs and priority-0 queues, SGLang's fcfs). The
rates are over the requests the delivered replay admitted, so the ordering carries over.
The gaps name the fix: fleet - routed is lost to routing, routed - delivered to memory.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from kvsim.drive.requests import workload
from kvsim.engines.options import SimOptions
from kvsim.fleet.config import replica_replay


@dataclass(frozen=True)
class Bounds:
    """Per request, the cached tokens of the two unlimited replays."""

    fleet: np.ndarray        # int64 (n,): one unlimited cache for the whole fleet
    routed: np.ndarray       # int64 (n,): an unlimited cache per replica


def unlimited(options: SimOptions) -> SimOptions:
    """The same options with an unlimited capacity (every capacity source cleared; an offload
    tier dropped: an unlimited GPU cache evicts nothing it could keep)."""
    from kvsim.engines.offload import KEYS

    extra = {k: v for k, v in (options.extra or {}).items() if k not in KEYS}
    return dataclasses.replace(options, capacity_tokens=math.inf, num_gpu_blocks=None, max_total_tokens=None,
                               kv_cache_memory=None, extra=extra)


def _cached(policy: str, trace, work, order: np.ndarray, options: SimOptions) -> np.ndarray:
    """Cached tokens per request of an unlimited sequential replay of ``trace[order]``, in log order."""
    out = np.zeros(len(trace), np.int64)
    if len(order):
        r = replica_replay(policy, trace, work, order, options)
        out[order] = np.where(r.rejected, 0, r.cached_tokens)
    return out


def _unlimited_replayer(policy: str, work, options: SimOptions, keyed=None):
    """The engine's own replay of orders of ``work`` on an unlimited cache, the log keyed once
    (``unlimited_replayer`` of its compiled sequential model; ``keyed``: the keys the fleet's
    replay computed, where it kept them), or None where it has none."""
    from kvsim.engines import registry

    spec = registry.engine(policy)
    engine = spec.implementation("fast")
    if not hasattr(engine, "unlimited_replayer"):
        return None
    return engine(spec.settings(options)).unlimited_replayer(work, keyed)


def bounds(policy: str, trace, options: SimOptions, replica: np.ndarray, order: np.ndarray,
           keyed=None) -> Bounds:
    """Both bounds for a routing (``replica`` per request) and the order the replicas took them
    (the replicas' replays beside the fleet's, on another core where one is free:
    :mod:`kvsim.drive.side`); ``keyed``: the log's keys from the fleet's replay (the engine's
    ``keyed_log``), used where they are the keys the bounds' replays need."""
    from kvsim.drive.side import Side

    opts = unlimited(options)
    order = np.asarray(order, np.int64)
    work = workload(trace)
    of = replica[order]
    fast = _unlimited_replayer(policy, work, opts, keyed)     # (keyed here, before the child forks)

    def cached(share: np.ndarray) -> np.ndarray:
        return fast(share) if fast is not None else _cached(policy, trace, work, share, opts)

    def routed(here: bool) -> np.ndarray:
        out = np.zeros(len(trace), np.int64)
        for r in np.flatnonzero(np.bincount(of)):     # (np.unique would import numpy.ma, 8 ms)
            out += cached(order[of == r])
        return out
    with Side(routed) as per_replica:
        return Bounds(cached(order), per_replica.result())


def rate(cached: np.ndarray, prompt: np.ndarray, counted: np.ndarray) -> float:
    """Σ cached / Σ prompt over the ``counted`` requests."""
    p = int(prompt[counted].sum())
    return int(cached[counted].sum()) / p if p else 0.0
