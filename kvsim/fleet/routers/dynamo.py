"""NVIDIA Dynamo's KV router (ai-dynamo-runtime 1.6.1), events and approximate modes.

Re-stated in ``docs/engines/routers.md §3``. A request's life in the router:

1. ``candidates``: for each replica, ``dev`` = consecutive prefix blocks of the request
   held on its device tier; cost = prefill_load_scale * max((active_prefill_tokens +
   prompt_len) / B - overlap_score_credit * dev, 0) + |active_blocks ∪ request_blocks|
   (+ decode_active_request_weight * active_requests); the min-cost set, ties at random
   (``docs/engines/routers.md §3.3``).
2. ``route`` books the request on its replica: prompt_len - dev * B tokens of active prefill
   (what is left to compute there), its full blocks as active blocks (shared ones once),
   and in approximate mode inserts those blocks for the replica, expiring
   ``router_ttl_secs`` later (``docs/engines/routers.md §3.2``).
3. ``prefill_done`` drops the prefill tokens; ``finished`` drops the request.
4. In events mode ``kv_event`` keeps each replica's device blocks: keys computed from the
   event's tokens under its parent, removals through the engine-hash map. Where the replicas
   can say exactly what those events would leave (``read_devices``: vLLM's compiled pools,
   ``kvsim.engines.vllm.events.DeviceBlocks``) the router reads them instead, keyed by the
   pools' own keys.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvsim.fleet.base import ReplicaLoad, RouteRequest, Router
from kvsim.fleet.events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from kvsim.fleet.keys import block_keys, chain_keys, root_key
from kvsim.fleet.options import check, choice

if TYPE_CHECKING:
    from kvsim.kernels.multiset import KeyMultiset


@dataclass(frozen=True)
class DynamoSettings:
    """``KvRouterConfig`` of ai-dynamo-runtime 1.6.1 (``docs/engines/routers.md §3.4``); ``mode`` is kvsim's."""

    mode: str = choice("events", "approx")
    router_ttl_secs: float = 120.0
    overlap_score_credit: float = 1.0
    prefill_load_scale: float = 1.0
    host_cache_hit_weight: float = 0.75
    disk_cache_hit_weight: float = 0.25
    router_temperature: float = 0.0
    decode_active_request_weight: float = 0.0

    def __post_init__(self) -> None:
        check(self.router_ttl_secs > 0, "router_ttl_secs must be positive")
        check(self.overlap_score_credit >= 0, "overlap_score_credit must be non-negative")
        check(self.prefill_load_scale >= 0, "prefill_load_scale must be non-negative")
        check(self.router_temperature == 0.0,
              "router_temperature: only 0 (argmin with random ties, the default) is modelled")


@dataclass
class _Booking:
    replica: int
    prefill_tokens: int         # left in active prefill until prefill_done
    keys: np.ndarray            # full-block keys (uint64) counted as active blocks until finished


def booked_prefix(active: KeyMultiset, keys: np.ndarray) -> int:
    """How many of a request's ``keys`` are in ``active`` (Dynamo counts them one by one).

    ``active`` holds the whole key chains of the booked requests, and a prefix-chained key
    stands for its whole prefix, so a key is booked only if every key before it is: the
    booked keys are a prefix of ``keys``, found by bisection (docs/engines/routers.md §3.3)."""
    return active.held_prefix(keys)


def as_key_array(keys: list[int]) -> np.ndarray:
    """Python-hash keys (:mod:`kvsim.fleet.keys`) as the uint64 keys of a :class:`KeyMultiset`:
    the same 64 bits; a 0 (which the table reserves) is taken as 1, as the pools' fast hash does."""
    out = np.array(keys, np.int64).view(np.uint64)
    out[out == 0] = 1
    return out


class DynamoRouter(Router):
    """Dynamo's ``DefaultWorkerSelector`` over its own active-sequence tracker and KV index."""

    name = "dynamo"
    Settings = DynamoSettings
    load_aware = True

    def _setup(self) -> None:
        from kvsim.kernels.multiset import KeyMultiset     # (numba: imported when a fleet routes)

        s = self.settings
        self.needs_events = s.mode == "events"  # type: ignore[misc]
        n = self.num_replicas
        self.device: list[Counter[int]] = [Counter() for _ in range(n)]   # events mode: key -> copies
        self.engine_keys: list[dict[int, int]] = [{} for _ in range(n)]   # engine hash -> key
        self.expiry: list[dict[int, float]] = [{} for _ in range(n)]      # approx mode
        self.active_prefill = [0] * n
        self.active_blocks = [KeyMultiset() for _ in range(n)]     # key -> booked requests
        self.active_requests = [0] * n
        self.bookings: dict[str, _Booking] = {}
        self._memo: tuple | None = None     # (index, id, keys as an array, as a list or None) of the request at hand
        self._devs: tuple | None = None     # (index, id, now, overlap per replica) where costs() computed them
        self._routes = 0
        self.devices = None         # events mode: the replicas' device blocks, read directly

    def read_devices(self, devices) -> None:
        """Read each replica's device blocks from ``devices`` (``DeviceBlocks``: what this router's
        index would hold from the replica's events, exactly) instead of being fed the events."""
        if self.settings.mode == "events":
            self.devices = devices

    # -- the index ------------------------------------------------------------------------
    def _keys(self, req: RouteRequest) -> np.ndarray:
        """The request's full-block keys (uint64), once per request."""
        if self._memo is None or self._memo[0] != req.index or self._memo[1] != req.request_id:
            if self.devices is not None:    # the pools' keys: one per namespace and token prefix
                keys = self.devices[0].keys(req)
                self._memo = (req.index, req.request_id, keys, None)
            else:
                listed = block_keys(req.tokens, self.block_size, req.namespace)
                self._memo = (req.index, req.request_id, as_key_array(listed), listed)
        return self._memo[2]

    def request_overlap(self, req: RouteRequest, replica: int, now: float) -> int:
        """:meth:`overlap` of ``req``'s keys (the memo's: an array from the pools, else the list)."""
        self._keys(req)
        return self.overlap(self._memo[2] if self.devices is not None else self._memo[3], replica, now)

    def overlap(self, keys: Sequence[int] | np.ndarray, replica: int, now: float) -> int:
        """Consecutive prefix blocks of ``keys`` on ``replica``'s device tier (the pools' keys
        where the router reads the pools, else the keys of :mod:`kvsim.fleet.keys`)."""
        if self.devices is not None:
            return self.devices[replica].prefix_blocks(np.asarray(keys, np.uint64))
        n = 0
        if self.settings.mode == "events":
            held = self.device[replica]
            for k in keys:
                if k not in held:
                    break
                n += 1
        else:
            exp = self.expiry[replica]
            for k in keys:
                t = exp.get(k)
                if t is None or t <= now:   # docs/engines/routers.md §3.1: approx entries expire at the TTL
                    break
                n += 1
        return n

    # -- the decision -----------------------------------------------------------------------
    def costs(self, req: RouteRequest, now: float) -> list[float]:
        """Each replica's cost for ``req`` (``docs/engines/routers.md §3.3``), in Dynamo's f64 order of operations."""
        s = self.settings
        keys = self._keys(req)
        bs = float(self.block_size)
        out = []
        devs = [self.request_overlap(req, w, now) for w in range(self.num_replicas)]
        self._devs = (req.index, req.request_id, now, devs)
        for w in range(self.num_replicas):
            dev = devs[w]
            raw = (self.active_prefill[w] + req.prompt_len) / bs
            adjusted = max(raw - s.overlap_score_credit * dev, 0.0)
            active = self.active_blocks[w]
            decode = len(active) + len(keys) - booked_prefix(active, keys)   # shared blocks count once
            out.append(s.prefill_load_scale * adjusted + decode
                       + s.decode_active_request_weight * self.active_requests[w])
        return out

    def candidates(self, req: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> frozenset[int]:
        costs = self.costs(req, now)
        best = min(costs)
        return frozenset(w for w, c in enumerate(costs) if c == best)

    def _dispatched(self, req: RouteRequest, replica: int, now: float) -> None:
        keys = self._keys(req)
        # the overlaps the decision just computed for this request (nothing changed since), else anew
        d = self._devs
        dev = d[3][replica] if d is not None and d[:3] == (req.index, req.request_id, now) \
            else self.request_overlap(req, replica, now)
        prefill = max(req.prompt_len - dev * self.block_size, 0)
        self.bookings[req.request_id] = _Booking(replica, prefill, keys)
        self.active_prefill[replica] += prefill
        self.active_blocks[replica].add(keys)
        self.active_requests[replica] += 1
        if self.settings.mode == "approx":
            exp = self.expiry[replica]
            until = now + self.settings.router_ttl_secs
            for k in self._memo[3]:
                exp[k] = until
            self._routes += 1
            if self._routes % 1024 == 0:
                self._purge(now)
        self._memo = self._devs = None

    def _purge(self, now: float) -> None:
        for exp in self.expiry:
            for k in [k for k, t in exp.items() if t <= now]:
                del exp[k]

    # -- the request's life -------------------------------------------------------------------
    def prefill_done(self, req: RouteRequest, replica: int, now: float) -> None:
        b = self.bookings.get(req.request_id)
        if b is not None and b.prefill_tokens:
            self.active_prefill[b.replica] -= b.prefill_tokens
            b.prefill_tokens = 0

    def finished(self, req: RouteRequest, replica: int, now: float) -> None:
        b = self.bookings.pop(req.request_id, None)
        if b is None:
            return
        self.active_prefill[b.replica] -= b.prefill_tokens
        self.active_blocks[b.replica].remove(b.keys)
        self.active_requests[b.replica] -= 1

    def kv_event(self, replica: int, event: KvEvent, now: float) -> None:
        if self.settings.mode != "events":
            return
        if isinstance(event, BlockStored):
            if event.medium != "GPU":
                return      # host tier: not modelled (docs/engines/routers.md §3.5, DY6)
            emap = self.engine_keys[replica]
            if event.parent_block_hash is None:
                parent = root_key((event.lora_name, event.cache_salt))
            elif event.parent_block_hash in emap:
                parent = emap[event.parent_block_hash]
            else:
                return      # a chain under a parent the router never saw is dropped
            keys = chain_keys(event.token_ids, event.block_size, parent)
            for h, k in zip(event.block_hashes, keys):
                emap[h] = k
                self.device[replica][k] += 1   # a block stored twice stays until removed twice
        elif isinstance(event, BlockRemoved):
            if event.medium != "GPU":
                return
            emap, held = self.engine_keys[replica], self.device[replica]
            for h in event.block_hashes:
                k = emap.get(h)
                if k is not None and held[k] > 0:
                    held[k] -= 1
                    if held[k] == 0:
                        del held[k], emap[h]
        elif isinstance(event, AllBlocksCleared):
            self.device[replica].clear()
            self.engine_keys[replica].clear()
