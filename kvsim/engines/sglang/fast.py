"""The fast radix engine (sections: docs/engines/radix.md): the reference model's decisions (:mod:`kvsim.engines.sglang.reference`)
on the same tree (:mod:`kvsim.engines.sglang.tree`) and the same rules
(:mod:`kvsim.engines.sglang.rules`), tuned for replaying long traces.

It keeps only these speed-ups, none of which changes a decision:

* KV slots are not tracked, only counts: ``avail`` is the allocator's free tokens and a
  running request holds ``ceil_page(allocated) - protected`` private tokens.
* The tree is a :class:`~kvsim.engines.sglang.tree.LazyHeapTree`: one persistent eviction
  heap instead of one rebuilt from every evictable leaf at each eviction.
* Decode steps are batched: between page boundaries or evictions nothing changes.

``tests/test_radix_fast.py`` replays random workloads through both engines and demands
identical per-request results and identical trees.
"""
from __future__ import annotations

from typing import Hashable

import numpy as np

from kvsim.engines.base import Request, SequentialCache, Served, Workload
from kvsim.engines.sglang import rules
from kvsim.engines.sglang.settings import RadixSettings
from kvsim.engines.sglang.tree import LazyHeapTree, Node

UNLIMITED = 1 << 62


class RadixFast(SequentialCache):
    """One SGLang radix cache and its allocator (token counts only), serving requests one at a time."""

    def __init__(self, settings: RadixSettings | None = None) -> None:
        self.settings = s = settings or RadixSettings()
        self.page_size = s.page_size
        self.capacity = s.capacity
        self.C = UNLIMITED if s.capacity is None else int(s.capacity)
        self.avail = self.C
        self.min_avail = self.C
        self.stop_finish = s.finish == "stop"
        self.cap = rules.UNCAPPED_MAX_NEW if s.max_new_tokens is None else int(s.max_new_tokens)
        self.chunk = int(s.chunked_prefill_size)
        self.tree = LazyHeapTree(s.page_size, s.eviction_policy, s.tree, s.policy_config)
        self.lru = self.tree.policy.name == "lru"
        self.refresh_calls = 0
        self.log_hit = 0               # the prefill log line's #cached-token, summed
        self.log_input = 0             # ... and #new-token
        self.ev_tokens = 0
        self.ev_leaves = 0

    # -- the allocator (counts) ------------------------------------------------------
    def evict(self, num_tokens: int) -> int:
        """Evict at least ``num_tokens`` (whole leaves); the freed tokens return to the pool."""
        freed, leaves, _ = self.tree.evict(num_tokens)
        self.ev_tokens += freed
        self.ev_leaves += leaves
        self.avail += freed
        return freed

    def evict_to_free(self, num_tokens: int) -> None:
        """allocator.evict_to_free_tokens (§5.5)."""
        if num_tokens > self.avail:   # (the common case, enough free, costs no call)
            self.evict(rules.eviction_amount(num_tokens, self.avail, self.settings.eviction_amount))

    def _take(self, tokens: int) -> None:
        self.avail -= tokens
        if self.avail < self.min_avail:
            self.min_avail = self.avail

    # -- one request ----------------------------------------------------------------
    def serve(self, req: Request) -> Served:
        fill = np.concatenate([np.asarray(req.prompt, np.int64), np.asarray(req.output, np.int64)])
        return self.serve_tokens(fill, len(req.prompt), len(req.output),
                                 rules.namespace(req.lora, req.cache_salt), req.logprob_start_len)

    def serve_at(self, work: Workload, i: int) -> Served:
        a, b = int(work.prompt_offsets[i]), int(work.prompt_offsets[i + 1])
        c, d = int(work.output_offsets[i]), int(work.output_offsets[i + 1])
        fill = np.concatenate([work.prompt_tokens[a:b].astype(np.int64), work.output_tokens[c:d]])
        return self.serve_tokens(fill, b - a, d - c, rules.namespace(work.lora[i], work.cache_salt[i]),
                                 int(work.logprob_start_len[i]))

    def serve_tokens(self, fill: np.ndarray, L: int, wanted: int, ns: Hashable,
                     logprob_start_len: int = -1) -> Served:
        """Serve a request: ``fill`` = its prompt (``L`` tokens) then the ``wanted`` output
        tokens it would generate; ``logprob_start_len`` (-1: none) caps its match."""
        p = self.page_size
        ev0, lv0 = self.ev_tokens, self.ev_leaves
        max_new = rules.max_new_tokens_for_memory(L, self.cap if self.stop_finish else wanted, self.capacity, p)
        aborted = rules.logprob_aborts(L, logprob_start_len)
        if aborted:  # refused, run as the placeholder prompt [0] with one sampled token
            fill = np.concatenate([np.zeros(1, np.int64), fill[L:L + 1]])
            L, k, logprob_start_len = 1, 1, -1
            extra = self.settings.overlap and k < max_new
        else:
            k = min(wanted, max(max_new, 1))
            extra = self.settings.overlap and self.stop_finish and k < max_new
        tree = self.tree
        self.calc_priority(fill, L, ns)
        prefix, node = tree.match_prefix(fill, ns, rules.max_prefix_len(L, logprob_start_len))
        extend = self.add_one_req(prefix, node, L, max_new)
        if extend is None:
            return Served(0, True, self.ev_tokens - ev0, self.ev_leaves - lv0, max_new, 0)
        self.log_hit += prefix
        self.log_input += extend
        extend_total = extend
        protected = prefix           # cache_protected_len
        inserted = 0                 # cache_inserted_len
        locked = node
        start, end = prefix, prefix + extend
        self.alloc_extend(start, end)
        while end < L:   # chunked prefill: checkpoint the chunk, schedule the next
            locked, protected, inserted = self.checkpoint(fill, L, end, ns, locked, protected, inserted)
            new_len = rules.next_chunk(L - end, self.avail + tree.evictable_size, self.chunk)
            self.log_input += new_len
            extend_total += new_len
            start, end = end, end + new_len
            self.alloc_extend(start, end)
        committed = L
        if k > 1:
            if self.settings.overlap:  # the first decode step is prepared before the prefill result
                self.decode(committed, 1)
                committed += 1
                locked, protected, inserted = self.checkpoint(fill, L, L, ns, locked, protected, inserted)
            else:
                locked, protected, inserted = self.checkpoint(fill, L, L, ns, locked, protected, inserted)
                self.decode(committed, 1)
                committed += 1
            self.decode(committed, k - 2)
            committed += k - 2
        if extra:  # overlap + stop token: the step built before the stop was seen
            self.decode(committed, 1)
            committed += 1
        self.release(fill, L, committed, ns, locked, protected, inserted)
        return Served(prefix, aborted, self.ev_tokens - ev0, self.ev_leaves - lv0, max_new, extend_total)

    # -- the scheduler's steps (named as in the reference model) ----------------------
    def calc_priority(self, fill: np.ndarray, L: int, ns: Hashable) -> None:
        """The waiting-prefix refresh: LRU only, every 32nd pass, the whole prompt (§5.4)."""
        if self.lru:
            if self.refresh_calls % rules.REFRESH_INTERVAL == 0:
                self.tree.match_prefix(fill, ns, L)
            self.refresh_calls += 1

    def add_one_req(self, prefix: int, node: Node, L: int, max_new: int) -> int | None:
        """Admission with the prefix pinned; the first prefill round's length, or None (§7.2)."""
        p = self.page_size
        extend = L - prefix
        tree = self.tree
        tree.lock(node)
        if not rules.admits(extend, max_new, p, self.avail + tree.evictable_size):
            tree.unlock(node)
            return None
        extend = rules.first_chunk(extend, self.chunk, p)
        if extend <= 0:
            tree.unlock(node)
            return None
        return extend

    def alloc_extend(self, start: int, end: int) -> None:
        """alloc_for_extend: evict the shortfall, take the pages for [start, end) (§5.5)."""
        p = self.page_size
        self.evict_to_free(rules.extend_demand(start, end, p))
        self._take(rules.ceil_page(end, p) - rules.ceil_page(start, p))

    def decode(self, c: int, steps: int) -> None:
        """``steps`` decode steps from committed length ``c``, batched between the points
        where a step makes a page allocatable or evicts (check_decode_mem + alloc, §5.5)."""
        p = self.page_size
        r = steps
        if p == 1:
            while r > 0:
                if self.avail < 1:
                    self.evict_to_free(1)
                s = min(r, self.avail)
                self._take(s)
                r -= s
            return
        while r > 0:
            if self.avail < p:
                self.evict_to_free(p)
            if rules.decode_starts_page(c, p):
                self._take(p)
            c += 1
            r -= 1
            if r and self.avail >= p:
                skip = min(r, rules.ceil_page(c, p) - c)   # to the next page boundary
                c += skip
                r -= skip

    def checkpoint(self, fill: np.ndarray, L: int, upto: int, ns: Hashable, locked: Node, protected: int,
                   inserted: int) -> tuple[Node, int, int]:
        """Insert [0, upto) page-floored, free duplicates, move the lock (§3.2, §3.3)."""
        p = self.page_size
        tree = self.tree
        key_len = rules.floor_page(upto, p)
        prefix, node = tree.insert(fill, None, ns, 0, inserted, key_len)
        if prefix > protected:   # duplicates of what the tree already holds are freed
            self.avail += prefix - protected
        if key_len > inserted:
            inserted = key_len
        prompt_key = rules.floor_page(L, p)
        if 0 < prompt_key < key_len:   # the leaf split at the prompt boundary
            tree.insert(fill, None, ns, 1, prompt_key, prompt_key)
        if tree.classic:
            _, node = tree.match_prefix(fill, ns, key_len)
        tree.unlock(locked)
        tree.lock(node)
        return node, key_len, inserted

    def release(self, fill: np.ndarray, L: int, committed: int, ns: Hashable, locked: Node, protected: int,
                inserted: int) -> None:
        """release_kv_cache: insert floor_page(committed), free the private tail, unlock (§3.3)."""
        locked, protected, inserted = self.checkpoint(fill, L, committed, ns, locked, protected, inserted)
        x = locked
        while x.parent is not None:
            x.requests += 1
            x = x.parent
        self.avail += rules.ceil_page(committed, self.page_size) - protected
        self.tree.unlock(locked)

    # -- inspection -----------------------------------------------------------------
    @property
    def evictable(self) -> int:
        return self.tree.evictable_size

    @property
    def total_size(self) -> int:
        return self.tree.total_size

    @property
    def peak_used(self) -> int:
        return self.C - self.min_avail

    @property
    def peak_used_tokens(self) -> int:
        return self.peak_used

    @property
    def root(self) -> Node:
        return self.tree.root

    def nodes(self):
        return self.tree.nodes()

    def paths(self) -> list[tuple[int, ...]]:
        return self.tree.paths()
