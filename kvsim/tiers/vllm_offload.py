"""vLLM 0.33's CPU tier, readable: ``CPUOffloadingManager`` (``docs/engines/offload.md §1.4``).

The tier holds ``capacity`` chunks (offload blocks), keyed by the chained GPU block key
of each chunk's last GPU block (offload.md §1.3). A chunk is pending while its store is in
flight, then ready; a ready chunk is idle (evictable) unless a load is reading it. The
connector (:mod:`kvsim.tiers.vllm_connector`) calls:

1. ``lookup(key)``: HIT, HIT_PENDING or MISS; nothing else changes (offload.md §1.5);
2. ``prepare_load(keys, ctx)`` pins the chunks, ``complete_load`` unpins them (offload.md §1.6);
3. ``prepare_store(keys, ctx)``: drops resident keys (and, with ``store_threshold >= 2``,
   keys offered fewer times), evicts idle chunks by the policy for room, inserts the rest as
   pending; None when there is no room (offload.md §1.7, §1.11);
4. ``complete_store(keys)`` makes them ready (offload.md §1.8);
5. ``on_request_finished(ctx)`` hands the request's keys, head to tail, to the policy (offload.md §1.8).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from enum import Enum

from kvsim.errors import ConfigError
from kvsim.tiers.vllm_policies import POLICIES, Chunk, Key, RequestContext

PAGE_ALIGNMENT = 4096            # SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT = mmap.PAGESIZE
TRACKER_SIZE = 64_000            # max_tracker_size default (cpu/spec.py)


def num_cpu_chunks(cpu_bytes: int, bytes_per_gpu_block: int, blocks_per_chunk: int = 1,
                   world_size: int = 1) -> int:
    """Chunks ``cpu_bytes_to_use`` buys: each holds ``blocks_per_chunk`` GPU blocks of every
    worker, rounded up to a 4 KiB page (``cpu/spec.py:111-123``; offload.md §1.2)."""
    if cpu_bytes <= 0:
        raise ConfigError("cpu_bytes_to_use must be positive")
    per_chunk = bytes_per_gpu_block * world_size * blocks_per_chunk
    aligned = -(-per_chunk // PAGE_ALIGNMENT) * PAGE_ALIGNMENT
    return int(cpu_bytes) // aligned


class LookupResult(Enum):
    MISS = "miss"
    HIT = "hit"
    HIT_PENDING = "hit_pending"


@dataclass
class StorePlan:
    """``PrepareStoreOutput``: the keys that will be written and the keys evicted for them."""

    keys_to_store: list[Key]
    evicted: list[Key]


@dataclass
class TierCounters:
    """Per-run counts the manager and connector report (offload.md §1.12)."""

    stored_chunks: int = 0        # chunks whose store completed
    store_failures: int = 0       # prepare_store returned None (kv_offload allocation failure)
    skipped_by_threshold: int = 0  # offers dropped by store_threshold
    evicted_chunks: int = 0
    loaded_chunks: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class CPUOffloadManager:
    """``CPUOffloadingManager`` for one KV group (``cpu/manager.py``)."""

    def __init__(self, capacity: int, policy: str = "lru", store_threshold: int = 0,
                 tracker_size: int = TRACKER_SIZE) -> None:
        if policy not in POLICIES:
            raise ConfigError(f"unknown offload eviction policy {policy!r} (lru, arc)")
        if capacity < 0:
            raise ConfigError("offload capacity must be >= 0 chunks")
        self.capacity = capacity
        self.policy = POLICIES[policy](capacity)
        self.store_threshold = store_threshold
        self.tracker_size = tracker_size
        # offers per key, oldest first; only with a threshold (offload.md §1.11)
        self.counts: OrderedDict[Key, int] | None = OrderedDict() if store_threshold >= 2 else None
        self.num_evictable = 0
        self.counters = TierCounters()

    # -- state ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.policy)

    def free_chunks(self) -> int:
        """Slots no chunk holds (each resident chunk, pending or ready, holds one)."""
        return self.capacity - len(self.policy)

    def lookup(self, key: Key) -> LookupResult:
        chunk = self.policy.get(key)
        if chunk is None:
            return LookupResult.MISS
        return LookupResult.HIT if chunk.is_ready else LookupResult.HIT_PENDING

    # -- a request's first accesses (``_record_request_cache_access``) ------------------
    def _record(self, keys: Sequence[Key], ctx: RequestContext, reused: Sequence[Key] = ()) -> None:
        new = [k for k in keys if k not in ctx.seen_set]
        for k in new:
            assert not ctx.finished, "keys observed after the request finished"
            ctx.seen.append(k)
            ctx.seen_set.add(k)
        if new:
            self.policy.on_request_access(new, ctx)
        ctx.reused.update(k for k in reused if k not in ctx.inserted)

    def _count_offers(self, keys: Sequence[Key]) -> None:
        """The reuse tracker: +1 per offer, an LRU of at most ``tracker_size`` keys whose
        oldest entry not offered now makes room (``cpu/manager.py:129-148``)."""
        counts = self.counts
        assert counts is not None
        offered_now = set()
        for k in keys:
            if k in counts:
                counts.move_to_end(k)
                counts[k] += 1
                offered_now.add(k)
        unprotected = len(counts) - len(offered_now)
        for k in keys:
            if k in counts:
                continue
            if len(counts) >= self.tracker_size:
                if unprotected == 0:
                    continue
                counts.popitem(last=False)
                unprotected -= 1
            counts[k] = 1

    # -- loads --------------------------------------------------------------------------
    def prepare_load(self, keys: Collection[Key], ctx: RequestContext) -> None:
        for k in keys:
            chunk = self.policy.get(k)
            assert chunk is not None and chunk.is_ready, f"load of a chunk not ready: {k!r}"
            if chunk.ref_cnt == 0:
                self.policy.mark_non_evictable(k)
                self.num_evictable -= 1
            chunk.ref_cnt += 1
        self.counters.loaded_chunks += len(keys)
        self._record(list(keys), ctx, reused=list(keys))

    def complete_load(self, keys: Collection[Key]) -> None:
        for k in keys:
            chunk = self.policy.get(k)
            assert chunk is not None and chunk.ref_cnt > 0
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                self.num_evictable += 1
                self.policy.mark_evictable(k)

    # -- stores -------------------------------------------------------------------------
    def prepare_store(self, keys: Sequence[Key], ctx: RequestContext) -> StorePlan | None:
        keys = list(keys)
        if self.counts is not None:
            self._count_offers(keys)
        to_store = [k for k in keys if self.policy.get(k) is None]
        ready = [k for k in keys if (c := self.policy.get(k)) is not None and c.is_ready]
        if self.counts is not None:
            wanted = [k for k in to_store if self.counts.get(k, 0) >= self.store_threshold]
            self.counters.skipped_by_threshold += len(to_store) - len(wanted)
            to_store = wanted
        misses = [k for k in to_store if k not in ctx.store_misses]
        if misses:
            self.policy.on_store_miss(misses, ctx)
            ctx.store_misses.update(misses)
        # recorded before any failure below: a failed store still counts as an access
        recorded = set(to_store) | set(ready)
        self._record([k for k in keys if k in recorded], ctx, reused=ready)
        if not to_store:
            return StorePlan([], [])
        need = len(to_store) - self.free_chunks()
        evicted: list[Key] = []
        if need > 0:
            if need > self.num_evictable:
                self.counters.store_failures += 1
                return None
            out = self.policy.evict(need, protected=set(keys))
            if out is None:
                self.counters.store_failures += 1
                return None
            self.num_evictable -= len(out)
            evicted = [k for k, _ in out]
            self.counters.evicted_chunks += len(out)
        for k in to_store:
            self.policy.insert(k, Chunk(), ctx)
        ctx.inserted.update(to_store)
        return StorePlan(to_store, evicted)

    def complete_store(self, keys: Collection[Key], success: bool = True) -> None:
        for k in keys:
            chunk = self.policy.get(k)
            if chunk is None or chunk.is_ready:
                continue
            if success:
                chunk.ref_cnt = 0
                self.num_evictable += 1
                self.policy.mark_evictable(k)
                self.counters.stored_chunks += 1
            else:
                self.policy.remove(k)

    # -- requests -----------------------------------------------------------------------
    def on_request_finished(self, ctx: RequestContext) -> None:
        if ctx.finished:
            return
        ctx.finished = True
        self.policy.on_request_finished(ctx.head_to_tail(ctx.seen), ctx.inserted - ctx.reused,
                                        ctx.reused, ctx)
