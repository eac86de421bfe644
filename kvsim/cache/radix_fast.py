"""The fast radix engine: the same rules as :mod:`kvsim.cache.radix` and
:mod:`kvsim.cache.radix_cache`, tuned for replaying long traces.

What makes it fast, without changing a single decision:

* KV slots are not tracked, only counts: ``avail`` is the allocator's free tokens and a
  running request holds ``ceil_page(allocated) - protected`` private tokens.
* The eviction candidates live in one persistent lazy heap instead of a heap rebuilt
  from every evictable leaf on each eviction (SGLang's way). A node is pushed again
  whenever it becomes an evictable leaf or a field its policy key reads changes;
  stale entries are skipped on pop. The heap therefore always ranks exactly the
  current evictable leaves by their current keys, which is the order SGLang's freshly
  built heap pops them in.
* Decode steps are batched: between page boundaries or evictions nothing changes.
* Edges are numpy views into the request's token array; comparisons are vectorized.

``tests/test_radix_fast.py`` replays random workloads through both models and demands
identical per-request results and identical trees.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Hashable

import numpy as np

from kvsim.cache.evict_policy import make_policy
from kvsim.cache.radix import SCALE
from kvsim.cache.radix_cache import (
    CLIP_MAX_NEW_TOKENS,
    EVICTION_AMOUNTS,
    FINISHES,
    REFRESH_INTERVAL,
    UNCAPPED_MAX_NEW,
    logprob_aborts,
    max_prefix_len,
)
from kvsim.errors import ConfigError

UNLIMITED = 1 << 62


def _ceil_page(x: int, p: int) -> int:
    return -(-x // p) * p


class FNode:
    __slots__ = ("children", "parent", "key", "lock_ref", "last_access_time", "creation_time",
                 "hit_count", "priority", "id", "ns", "tlru_cached_prefix_len", "tlru_history_len",
                 "version", "requests")

    @property
    def key_len(self) -> int:
        return len(self.key)


@dataclass
class FastOutcome:
    cached_tokens: int
    rejected: bool
    evicted_tokens: int
    evicted_leaves: int
    max_new: int
    extend_tokens: int


class FastRadixEngine:
    """One SGLang radix cache and its allocator, serving requests one at a time."""

    def __init__(self, page_size: int = 1, capacity: int | None = None, eviction_policy: str = "lru",
                 flavor: str = "unified", overlap: bool = True, chunked_prefill_size: int = 4096,
                 policy_config: dict | None = None, finish_mode: str = "length",
                 max_new_tokens: int | None = None, eviction_amount: str = "shortfall") -> None:
        p = self.page_size = int(page_size)
        if capacity is not None and (capacity <= 0 or capacity % p):
            raise ConfigError(f"radix capacity must be a positive multiple of the page size, got {capacity}")
        if flavor not in ("unified", "classic"):
            raise ConfigError(f"unknown radix tree flavor {flavor!r}")
        if finish_mode not in FINISHES:
            raise ConfigError(f"unknown finish {finish_mode!r}; choose from {', '.join(FINISHES)}")
        if eviction_amount not in EVICTION_AMOUNTS:
            raise ConfigError(f"unknown eviction amount {eviction_amount!r}")
        self.stop_finish = finish_mode == "stop"
        self.cap = UNCAPPED_MAX_NEW if max_new_tokens is None else int(max_new_tokens)
        self.evict_need = eviction_amount == "need"
        self.capacity = capacity
        self.C = UNLIMITED if capacity is None else int(capacity)
        self.avail = self.C
        self.classic = flavor == "classic"
        self.flavor = flavor
        self.overlap = overlap
        self.chunk = int(chunked_prefill_size)
        self.policy = make_policy(eviction_policy, policy_config)
        if self.policy.name == "tlru" and self.classic:
            raise ConfigError("the tlru eviction policy exists only in the unified tree (SGLang's default)")
        self.prio = self.policy.priority
        self.lru = self.policy.name == "lru"
        self.clock = 0
        self.next_id = 0
        self.n_nodes = 0               # live nodes, to bound stale heap entries
        self.root = self._new(0)
        self.root.lock_ref = 1
        self.root.priority = -(2**63 - 1)
        self.evictable = 0
        self.protected = 0
        self.heap: list = []
        self.refresh_calls = 0
        self.log_hit = 0
        self.log_input = 0
        self.min_avail = self.C
        self.ev_tokens = 0
        self.ev_leaves = 0

    # -- nodes, clock, heap --------------------------------------------------------
    def _new(self, priority: int) -> FNode:
        n = FNode()
        n.children = {}
        n.parent = None
        n.key = None
        n.lock_ref = 0
        self.clock += 1
        n.last_access_time = self.clock * SCALE
        self.clock += 1
        n.creation_time = self.clock * SCALE
        n.hit_count = 0
        n.priority = priority
        n.id = self.next_id
        self.next_id += 1
        n.ns = None
        n.tlru_cached_prefix_len = 0
        n.tlru_history_len = 0
        n.version = 0
        n.requests = 0
        self.n_nodes += 1
        return n

    def _tick(self) -> int:
        self.clock += 1
        return self.clock * SCALE

    def _push(self, n: FNode) -> None:
        """(Re)rank an evictable leaf after it became one or its key changed."""
        n.version += 1
        heapq.heappush(self.heap, (self.prio(n), n.last_access_time, n.id, n.version, n))

    def _touched(self, n: FNode) -> None:
        if n.lock_ref == 0 and not n.children and n.parent is not None:
            self._push(n)

    def _ck(self, node: FNode, tokens: np.ndarray, off: int, ns: Hashable):
        p = self.page_size
        first = int(tokens[off]) if p == 1 else tokens[off:off + p].tobytes()
        return (ns, first) if node is self.root else first

    def _match_len(self, key: np.ndarray, tokens: np.ndarray, off: int, end: int) -> int:
        n = min(len(key), end - off)
        eq = key[:n] == tokens[off:off + n]
        m = n if eq[n - 1] and eq.all() else int(eq.argmin())
        return m - m % self.page_size

    # -- tree operations (see kvsim.cache.radix for the commented version) ---------
    def match(self, tokens: np.ndarray, n: int, ns: Hashable) -> tuple[int, FNode]:
        n -= n % self.page_size
        root = self.root
        if n <= 0:
            return 0, root
        classic = self.classic
        if classic:
            t = self._tick()
        node, off = root, 0
        children = root.children
        while off < n:
            child = children.get(self._ck(node, tokens, off, ns))
            if child is None:
                break
            if classic:
                child.last_access_time = t
                self._touched(child)
            m = self._match_len(child.key, tokens, off, n)
            off += m
            if m < len(child.key):
                node = self._split(child, m)
                break
            node = child
            children = child.children
        if not classic:
            t, k, x = self._tick(), 0, node
            while x is not None:
                x.last_access_time = t - k
                k += 1
                x = x.parent
            self._touched(node)
        return off, node

    def _split(self, child: FNode, m: int) -> FNode:
        new = self._new(child.priority)
        new.hit_count = child.hit_count
        new.lock_ref = child.lock_ref
        new.ns = child.ns
        new.requests = child.requests
        new.key = child.key[:m]
        child.key = child.key[m:]
        parent = child.parent
        new.parent = parent
        child.parent = new
        parent.children[self._ck(parent, new.key, 0, new.ns)] = new
        new.children = {self._ck(new, child.key, 0, child.ns): child}
        if not self.classic:
            new.creation_time = child.creation_time
            new.tlru_cached_prefix_len = parent.tlru_cached_prefix_len + m
            new.tlru_history_len = child.tlru_history_len
            child.last_access_time = self._tick()
        self._touched(child)   # key length (T-LRU) or stamp changed
        return new

    def insert(self, tokens: np.ndarray, k_len: int, ns: Hashable, priority: int,
               inserted_len: int) -> tuple[int, FNode]:
        classic = self.classic
        t = self._tick()
        root = self.root
        if priority > root.priority:
            root.priority = priority
        node, off = root, 0
        while off < k_len:
            child = node.children.get(self._ck(node, tokens, off, ns))
            if child is None:
                break
            child.last_access_time = t if classic else self._tick()
            m = self._match_len(child.key, tokens, off, k_len)
            if m < len(child.key):
                child = self._split(child, m)
            if priority > child.priority:
                child.priority = priority
            off += m
            if off > inserted_len:
                child.hit_count += 1
            self._touched(child)
            node = child
        if off < k_len:
            leaf = self._new(priority)
            leaf.parent = node
            leaf.ns = ns
            leaf.key = tokens[off:k_len]
            node.children[self._ck(node, tokens, off, ns)] = leaf
            if k_len > inserted_len:
                leaf.hit_count = 1
            self.evictable += k_len - off
            if not self.classic:
                leaf.tlru_cached_prefix_len = node.tlru_cached_prefix_len + k_len - off
                leaf.tlru_history_len = leaf.tlru_cached_prefix_len
                x = node
                while x is not None and x.tlru_history_len < leaf.tlru_cached_prefix_len:
                    x.tlru_history_len = leaf.tlru_cached_prefix_len
                    x = x.parent
            self._push(leaf)
            return off, leaf
        return off, node

    def lock(self, node: FNode) -> None:
        root = self.root
        while node is not root:
            if node.lock_ref == 0:
                k = len(node.key)
                self.evictable -= k
                self.protected += k
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: FNode) -> None:
        root = self.root
        while node is not root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                k = len(node.key)
                self.evictable += k
                self.protected -= k
                if not node.children:
                    self._push(node)
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """Free whole unlocked leaves, lowest key first, until num_tokens are freed."""
        heap = self.heap
        freed = 0
        while freed < num_tokens and heap:
            *_, version, x = heapq.heappop(heap)
            if x.version != version or x.parent is None or x.lock_ref or x.children:
                continue
            k = len(x.key)
            freed += k
            self.ev_leaves += 1
            parent = x.parent
            del parent.children[self._ck(parent, x.key, 0, x.ns)]
            x.parent = None
            self.evictable -= k
            self.n_nodes -= 1
            if parent.lock_ref == 0 and not parent.children and parent.parent is not None:
                self._push(parent)
        self.ev_tokens += freed
        self.avail += freed
        if len(heap) > 2 * self.n_nodes + 4096:
            self._compact()
        return freed

    def _compact(self) -> None:
        live = {}
        for entry in self.heap:
            x = entry[-1]
            if x.version == entry[-2] and x.parent is not None and not x.lock_ref and not x.children:
                live[x.id] = entry
        self.heap = list(live.values())
        heapq.heapify(self.heap)

    def evict_to_free(self, num_tokens: int) -> None:
        if num_tokens > self.avail:
            self.evict(num_tokens if self.evict_need else num_tokens - self.avail)

    # -- one request ----------------------------------------------------------------
    def serve(self, fill: np.ndarray, L: int, wanted: int, ns: Hashable,
              logprob_start_len: int = -1) -> FastOutcome:
        """Serve a request: ``fill`` = prompt (L tokens) followed by its output tokens;
        ``logprob_start_len`` (-1: none) caps a logprob request's match."""
        p = self.page_size
        ev0, lv0 = self.ev_tokens, self.ev_leaves
        want = self.cap if self.stop_finish else wanted
        if self.capacity is None:
            max_new = want
        else:
            max_new = max(0, min(want, self.C - (-(-L // p) * p) - p - 1))
        aborted = logprob_aborts(L, logprob_start_len)
        if aborted:  # refused, run as the placeholder prompt [0] with one sampled token
            fill = np.concatenate([np.zeros(1, np.int64), fill[L:L + 1]])
            L, k, logprob_start_len = 1, 1, -1
            extra = self.overlap and k < max_new
        else:
            k = min(wanted, max(max_new, 1))
            extra = self.overlap and self.stop_finish and k < max_new
        # calc_priority: the waiting-prefix refresh (LRU only, every 32nd pass)
        if self.lru:
            if self.refresh_calls % REFRESH_INTERVAL == 0:
                self.match(fill, L, ns)
            self.refresh_calls += 1
        # init_next_round_input: the len-1 match, capped at a logprob request's start
        prefix, node = self.match(fill, max_prefix_len(L, logprob_start_len), ns)
        # add_one_req: admission with the prefix pinned
        extend = L - prefix
        self.lock(node)
        room = self.avail + self.evictable
        if not extend + min(max_new, CLIP_MAX_NEW_TOKENS) + p < room:
            self.unlock(node)
            return FastOutcome(0, True, self.ev_tokens - ev0, self.ev_leaves - lv0, max_new, 0)
        chunk = self.chunk
        if chunk > 0 and -(-extend // p) * p > chunk:
            extend = chunk // p * p
            if extend <= 0:
                self.unlock(node)
                return FastOutcome(0, True, self.ev_tokens - ev0, self.ev_leaves - lv0, max_new, 0)
        cached = prefix
        self.log_hit += prefix
        self.log_input += extend
        extend_total = extend
        protected = prefix           # cache_protected_len
        inserted = 0                 # cache_inserted_len
        locked = node
        start, end = prefix, prefix + extend
        allocated = self._alloc_extend(start, end, 0)
        while end < L:   # chunked prefill: checkpoint the chunk, schedule the next
            locked, protected, inserted = self._checkpoint(fill, L, end, ns, locked, protected, inserted)
            room = self.avail + self.evictable
            rem = min(chunk, room)
            if rem <= 0:
                rem = chunk
            new_len = min(L - end, rem)
            self.log_input += new_len
            extend_total += new_len
            start, end = end, end + new_len
            allocated = self._alloc_extend(start, end, allocated)
        committed = L
        if k > 1:
            if self.overlap:  # the first decode step is prepared before the prefill result
                allocated = self._decode(committed, 1, allocated)
                committed += 1
                locked, protected, inserted = self._checkpoint(fill, L, L, ns, locked, protected, inserted)
            else:
                locked, protected, inserted = self._checkpoint(fill, L, L, ns, locked, protected, inserted)
                allocated = self._decode(committed, 1, allocated)
                committed += 1
            allocated = self._decode(committed, k - 2, allocated)
            committed += k - 2
        if extra:  # overlap + stop token: the step built before the stop was seen
            allocated = self._decode(committed, 1, allocated)
            committed += 1
        # release_kv_cache: insert floor_page(L + k - 1), free the rest, unlock
        locked, protected, inserted = self._checkpoint(fill, L, committed, ns, locked, protected, inserted)
        x = locked
        while x.parent is not None:
            x.requests += 1
            x = x.parent
        self.avail += _ceil_page(allocated, p) - protected
        self.unlock(locked)
        return FastOutcome(cached, aborted, self.ev_tokens - ev0, self.ev_leaves - lv0, max_new, extend_total)

    def _alloc_extend(self, start: int, end: int, allocated: int) -> int:
        """alloc_for_extend: evict the shortfall (pages > 1: one page extra), take the pages."""
        p = self.page_size
        self.evict_to_free(end - start + (p if p > 1 else 0))
        self.avail -= _ceil_page(end, p) - _ceil_page(start, p)
        if self.avail < self.min_avail:
            self.min_avail = self.avail
        return end

    def _decode(self, c: int, steps: int, allocated: int) -> int:
        """``steps`` decode steps from committed length ``c``; returns the new allocated length."""
        p = self.page_size
        if steps <= 0:
            return allocated
        if p == 1:
            r = steps
            while r > 0:
                if self.avail < 1:
                    self.evict(1 - self.avail)
                s = min(r, self.avail)
                self.avail -= s
                r -= s
                if self.avail < self.min_avail:
                    self.min_avail = self.avail
        else:
            r = steps
            while r > 0:
                if self.avail < p:
                    self.evict(p - self.avail)
                if c % p == 0:
                    self.avail -= p
                    if self.avail < self.min_avail:
                        self.min_avail = self.avail
                c += 1
                r -= 1
                if r and self.avail >= p:
                    skip = min(r, (-c) % p)
                    c += skip
                    r -= skip
        return allocated + steps

    def _checkpoint(self, fill: np.ndarray, L: int, upto: int, ns, locked: FNode, protected: int,
                    inserted: int) -> tuple[FNode, int, int]:
        p = self.page_size
        key_len = upto - upto % p
        prefix, node = self.insert(fill, key_len, ns, 0, inserted)
        if prefix > protected:   # duplicates of what the tree already holds are freed
            self.avail += prefix - protected
        if key_len > inserted:
            inserted = key_len
        prompt_key = L - L % p
        if 0 < prompt_key < key_len:
            self.insert(fill, prompt_key, ns, 1, prompt_key)
        if self.classic:
            _, node = self.match(fill, key_len, ns)
        self.unlock(locked)
        self.lock(node)
        return node, key_len, inserted

    # -- inspection -----------------------------------------------------------------
    @property
    def total_size(self) -> int:
        return self.evictable + self.protected

    @property
    def peak_used(self) -> int:
        return self.C - self.min_avail

    def nodes(self):
        stack = [(c, 1) for c in reversed(list(self.root.children.values()))]
        while stack:
            node, depth = stack.pop()
            yield node, depth
            stack.extend((c, depth + 1) for c in reversed(list(node.children.values())))

    def paths(self) -> list[tuple[int, ...]]:
        out = []

        def walk(node, prefix):
            for child in node.children.values():
                path = prefix + (len(child.key),)
                out.append(path)
                walk(child, path)
        walk(self.root, ())
        return sorted(out)
