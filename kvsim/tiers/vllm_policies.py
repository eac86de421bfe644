"""vLLM 0.33's CPU-tier eviction policies, LRU and ARC (``docs/engines/offload.md §1.9``, §1.10).

A policy holds the tier's chunks (``key -> Chunk``) and decides which idle chunks leave
when a store needs room. Both re-state ``vllm/v1/kv_offload/cpu/policies/{lru,arc}.py``;
the manager (:mod:`kvsim.tiers.vllm_offload`) calls them at the points vLLM's
``CPUOffloadingManager`` does:

1. ``insert`` when a store is prepared (the chunk is pending, ``ref_cnt = -1``);
2. ``mark_evictable`` / ``mark_non_evictable`` when ``ref_cnt`` reaches / leaves 0;
3. ``on_request_access`` with the keys a request touches for the first time;
4. ``on_store_miss`` with the keys a request offers that are not in the tier;
5. ``on_request_finished`` once per request, with its keys head to tail;
6. ``evict(n, protected)``: exactly ``n`` idle chunks, or None and no change.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field

Key = Hashable


@dataclass(eq=False)
class Chunk:
    """One CPU slot: ``ref_cnt`` -1 = store in flight, 0 = ready and idle, > 0 = being loaded."""

    ref_cnt: int = -1

    @property
    def is_ready(self) -> bool:
        """Readable: its store completed."""
        return self.ref_cnt >= 0


@dataclass(eq=False)
class RequestContext:
    """vLLM's ``ReqContext`` for one request, with the scratch state the tier keeps in it."""

    req_id: str
    positions: dict[Key, int] = field(default_factory=dict)   # key -> end token of its chunk
    lru_rank: int | None = None                               # LRU's shared request rank
    seen: list[Key] = field(default_factory=list)             # first-access order
    seen_set: set[Key] = field(default_factory=set)
    inserted: set[Key] = field(default_factory=set)
    reused: set[Key] = field(default_factory=set)
    store_misses: set[Key] = field(default_factory=set)
    finished: bool = False

    def head_to_tail(self, keys: Sequence[Key]) -> list[Key]:
        """``order_request_keys``: by position when every key has one, else as given."""
        if all(k in self.positions for k in keys):
            return sorted(keys, key=self.positions.__getitem__)
        return list(keys)


class Policy:
    """The interface both policies implement (``cpu/policies/base.py``)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity

    def get(self, key: Key) -> Chunk | None:
        raise NotImplementedError

    def insert(self, key: Key, chunk: Chunk, ctx: RequestContext) -> None:
        raise NotImplementedError

    def remove(self, key: Key) -> None:
        raise NotImplementedError

    def touch(self, keys: Iterable[Key], ctx: RequestContext) -> None:
        raise NotImplementedError

    def evict(self, n: int, protected: set[Key]) -> list[tuple[Key, Chunk]] | None:
        raise NotImplementedError

    def on_store_miss(self, keys: Sequence[Key], ctx: RequestContext) -> None:
        """Default: a touch (a no-op for LRU, whose misses are never resident)."""
        self.touch(keys, ctx)

    def on_request_access(self, keys: Sequence[Key], ctx: RequestContext) -> None:
        return

    def on_request_finished(self, keys: list[Key], insertion_only: set[Key], reused: set[Key],
                            ctx: RequestContext) -> None:
        self.touch(keys, ctx)

    def mark_evictable(self, key: Key) -> None:
        return

    def mark_non_evictable(self, key: Key) -> None:
        return

    def __len__(self) -> int:
        raise NotImplementedError


class LRUPolicy(Policy):
    """A rank heap (``lru.py``): the idle chunk with the smallest rank is evicted first.

    Ranks are ``(request rank, -end position)``: the chunks one request stores or first
    touches share its rank, so within a request the tail goes before the head. When the
    request finishes, its resident chunks get fresh ranks tail first, so the head ends up
    most recent (offload.md §1.9).
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.chunks: dict[Key, Chunk] = {}
        self.ranks: dict[Key, tuple[int, int]] = {}
        self.evictable: set[Key] = set()
        self._heap: list[tuple[tuple[int, int], int, Key]] = []   # (rank, tiebreak, key), lazy
        self._next_rank = 0
        self._pushes = 0

    def __len__(self) -> int:
        return len(self.chunks)

    def _request_rank(self, ctx: RequestContext) -> int:
        if ctx.lru_rank is None:            # assigned on first need, from the shared counter
            self._next_rank += 1
            ctx.lru_rank = self._next_rank
        return ctx.lru_rank

    def _push(self, key: Key) -> None:
        self._pushes += 1
        heapq.heappush(self._heap, (self.ranks[key], self._pushes, key))

    def _renew(self, keys: Iterable[Key]) -> None:
        """A fresh rank for each resident key, in the order given."""
        for key in keys:
            if key not in self.chunks:
                continue
            self._next_rank += 1
            self.ranks[key] = (self._next_rank, 0)
            if key in self.evictable:
                self._push(key)

    def get(self, key: Key) -> Chunk | None:
        return self.chunks.get(key)

    def insert(self, key: Key, chunk: Chunk, ctx: RequestContext) -> None:
        self.chunks[key] = chunk
        pos = ctx.positions.get(key)
        if pos is None:
            self._next_rank += 1
            self.ranks[key] = (self._next_rank, 0)
        else:
            self.ranks[key] = (self._request_rank(ctx), -pos)
        if chunk.ref_cnt == 0:
            self.evictable.add(key)
            self._push(key)

    def remove(self, key: Key) -> None:
        del self.chunks[key]
        self.ranks.pop(key, None)
        self.evictable.discard(key)

    def touch(self, keys: Iterable[Key], ctx: RequestContext) -> None:
        self._renew(reversed(list(keys)))

    def on_request_access(self, keys: Sequence[Key], ctx: RequestContext) -> None:
        rank = self._request_rank(ctx)
        for key in keys:
            pos = ctx.positions.get(key)
            if pos is None or key not in self.chunks:
                continue
            new = (rank, -pos)
            if self.ranks[key] >= new:      # never moves a chunk back in time
                continue
            self.ranks[key] = new
            if key in self.evictable:
                self._push(key)

    def on_request_finished(self, keys: list[Key], insertion_only: set[Key], reused: set[Key],
                            ctx: RequestContext) -> None:
        self._renew(reversed(keys))

    def mark_evictable(self, key: Key) -> None:
        self.evictable.add(key)
        self._push(key)

    def mark_non_evictable(self, key: Key) -> None:
        self.evictable.remove(key)

    def _current(self, rank: tuple[int, int], key: Key) -> bool:
        return key in self.evictable and self.ranks.get(key) == rank

    def evict(self, n: int, protected: set[Key]) -> list[tuple[Key, Chunk]] | None:
        if n == 0:
            return []
        selected: list[tuple[tuple[int, int], int, Key]] = []
        chosen: set[Key] = set()
        deferred: list[tuple[tuple[int, int], int, Key]] = []
        while self._heap and len(selected) < n:
            entry = heapq.heappop(self._heap)
            rank, _, key = entry
            if not self._current(rank, key) or key in chosen:
                continue
            if key in protected:
                deferred.append(entry)
                continue
            selected.append(entry)
            chosen.add(key)
        for entry in deferred:
            heapq.heappush(self._heap, entry)
        if len(selected) < n:               # atomic: put everything back
            for entry in selected:
                heapq.heappush(self._heap, entry)
            return None
        out = []
        for _, _, key in selected:
            self.evictable.remove(key)
            del self.ranks[key]
            out.append((key, self.chunks.pop(key)))
        return out


class ARCPolicy(Policy):
    """Adaptive replacement (``arc.py``): T1 seen once, T2 reused, ghosts B1/B2 (offload.md §1.10)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.target_t1 = 0.0
        self.t1: OrderedDict[Key, Chunk] = OrderedDict()
        self.t2: OrderedDict[Key, Chunk] = OrderedDict()
        self.b1: OrderedDict[Key, None] = OrderedDict()
        self.b2: OrderedDict[Key, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def get(self, key: Key) -> Chunk | None:
        return self.t1.get(key) or self.t2.get(key)

    def insert(self, key: Key, chunk: Chunk, ctx: RequestContext) -> None:
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key: Key) -> None:
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

    def _ghost_hit(self, key: Key) -> None:
        if key in self.b1:      # recency pays: grow T1's target
            self.target_t1 = min(self.target_t1 + max(1, len(self.b2) / len(self.b1)), self.capacity)
            self.b1.move_to_end(key)
        elif key in self.b2:    # frequency pays: shrink it
            self.target_t1 = max(self.target_t1 - max(1, len(self.b1) / len(self.b2)), 0)
            self.b2.move_to_end(key)

    def on_store_miss(self, keys: Sequence[Key], ctx: RequestContext) -> None:
        for key in reversed(list(keys)):
            self._ghost_hit(key)

    def touch(self, keys: Iterable[Key], ctx: RequestContext) -> None:
        for key in reversed(list(keys)):
            if key in self.t1:
                chunk = self.t1.pop(key)
                if chunk.is_ready:
                    self.t2[key] = chunk
                else:                       # a pending store is not a second use
                    self.t1[key] = chunk
            elif key in self.t2:
                self.t2.move_to_end(key)
            else:
                self._ghost_hit(key)

    def on_request_finished(self, keys: list[Key], insertion_only: set[Key], reused: set[Key],
                            ctx: RequestContext) -> None:
        for key in reversed(keys):
            if key in insertion_only:       # a store is not a frequency hit
                if key in self.t1:
                    self.t1.move_to_end(key)
                elif key in self.t2:
                    self.t2.move_to_end(key)
            elif key in reused and key in self.t1:
                self.t2[key] = self.t1.pop(key)
            elif key in reused and key in self.t2:
                self.t2.move_to_end(key)

    def evict(self, n: int, protected: set[Key]) -> list[tuple[Key, Chunk]] | None:
        if n == 0:
            return []
        t1 = iter(self.t1.items())
        t2 = iter(self.t2.items())

        def next_idle(entries: Iterable[tuple[Key, Chunk]]) -> tuple[Key, Chunk] | None:
            for key, chunk in entries:
                if chunk.ref_cnt == 0 and key not in protected:
                    return key, chunk
            return None

        picks: list[tuple[Key, Chunk, bool]] = []
        t1_size = len(self.t1)
        for _ in range(n):
            pick = None
            if t1_size >= int(self.target_t1) and (e := next_idle(t1)) is not None:
                pick, t1_size = (*e, True), t1_size - 1
            if pick is None and (e := next_idle(t2)) is not None:
                pick = (*e, False)
            if pick is None:
                if (e := next_idle(t1)) is None:
                    return None
                pick, t1_size = (*e, True), t1_size - 1
            picks.append(pick)
        out = []
        for key, chunk, from_t1 in picks:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
            out.append((key, chunk))
        for ghost in (self.b1, self.b2):
            while len(ghost) > self.capacity:
                ghost.popitem(last=False)
        return out


POLICIES: dict[str, type[Policy]] = {"lru": LRUPolicy, "arc": ARCPolicy}
