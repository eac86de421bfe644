"""SGLang's radix cache and a request's life through it (sections: docs/engines/radix.md).

The life of a request in SGLang 0.5.23 (``scheduler.py``, ``schedule_policy.py``,
``schedule_batch.py``, ``mem_cache/common.py``, ``mem_cache/allocation.py``), each step a
method of :class:`RadixCache` with the engine's name:

1. ``calc_priority``: with LRU eviction, every 32nd scheduling pass first refreshes the
   waiting request's full-prompt path (a full-length match: stamps, may split; §5.4).
2. ``init_next_round_input``: match at most ``len - 1`` tokens, and at most
   ``logprob_start_len`` for a logprob request, page-floored (§2.1).
3. ``add_one_req``: admit if ``extend + min(max_new, 4096) + page < free + evictable``
   (the prefix locked); lock the matched node; chunk a prefill longer than
   ``chunked_prefill_size`` (§7.2).
4. ``alloc_extend``: evict the allocator's shortfall (page > 1: one extra page per
   request is demanded), then allocate (§5.5).
5. ``checkpoint`` after the prefill: insert the page-floored prompt, free duplicate
   KV, move the lock onto the new node (§3.2). A chunk is checkpointed at the start
   of the next pass.
6. ``decode``: per generated token, make ``page`` tokens allocatable (page 1: one) and
   allocate a slot; with the overlap scheduler (SGLang's default) the first decode step is
   prepared before the prefill result is processed, i.e. before step 5.
7. ``release``: insert ``floor_page(L + k - 1)`` tokens (the last sampled token has
   no KV; the overlap scheduler skips the decode of a request finishing by length, so
   this holds for both schedulers), split the leaf at the prompt boundary with a
   one-higher priority, free the private tail, unlock (§3.3).

With HiCache on (``settings.hicache``, docs/engines/offload.md §3) the tree is a
:class:`~kvsim.engines.sglang.hicache.HiRadixTree`: step 2 also finds the host part of the
match, step 3 loads it back (``init_load_back``), steps 5 and 7 back nodes up by the write
policy, and every step starts by acknowledging the transfers in flight
(``check_hicache_events``).

The cache is a tree (:class:`~kvsim.engines.sglang.tree.RadixTree`, or the fast engine's
:class:`~kvsim.engines.sglang.tree.LazyHeapTree`) and an allocator
(:class:`~kvsim.engines.sglang.allocator.PageAllocator` with slot ids, or the
:class:`~kvsim.engines.sglang.allocator.TokenCounter`). The sequential replays
(:mod:`kvsim.engines.sglang.sequential`) and the scheduler
(:mod:`kvsim.engines.sglang.scheduler`) all drive this one class.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

import numpy as np

from kvsim.engines.sglang import rules
from kvsim.engines.sglang.allocator import PageAllocator, TokenCounter
from kvsim.engines.sglang.rules import ceil_page
from kvsim.engines.sglang.settings import RadixSettings
from kvsim.engines.sglang.tree import LazyHeapTree, Node, RadixTree


@dataclass(eq=False)
class RequestState:
    """A running request's KV bookkeeping (SGLang's ``Req`` / ``ReqKvInfo``)."""

    tokens: np.ndarray                  # prompt, then the outputs it will generate (k of them)
    num_prompt: int
    ns: Hashable
    max_new: int
    row: np.ndarray | None              # req_to_token row: slot of each position (None: counts only)
    logprob_start_len: int = -1         # caps the match (§2.1); -1: none
    aborted: bool = False               # refused by SGLang, run as a placeholder
    prefix_len: int = 0                 # tokens already computed or cached
    extend_end: int = 0                 # end of this prefill round
    protected: int = 0                  # cache_protected_len: tree-owned positions
    inserted: int = 0                   # cache_inserted_len
    allocated: int = 0                  # kv_allocated_len
    committed: int = 0                  # kv_committed_len
    generated: int = 0                  # output tokens sampled so far
    last_node: Node | None = None       # the locked node
    cached_tokens: int = 0
    pending_checkpoint: bool = False    # overlap: prefill result not processed yet
    extra_step: bool = False            # overlap + stop token: one wasted decode step
    evicted_tokens: int = 0
    evicted_leaves: int = 0
    best_node: Node | None = None       # HiCache: the deepest matched node with KV anywhere
    host_hit: int = 0                   # HiCache: matched tokens only the host holds
    cached_host: int = 0                # HiCache: of cached_tokens, loaded from host

    @property
    def prompt(self) -> np.ndarray:
        return self.tokens[:self.num_prompt]

    @property
    def k(self) -> int:
        """Output tokens it generates."""
        return len(self.tokens) - self.num_prompt

    def fill(self, upto: int) -> np.ndarray:
        """Its first ``upto`` tokens (prompt, then outputs)."""
        return self.tokens[:upto]


class RadixCache:
    """SGLang 0.5.23's radix cache and allocator, and the scheduler's per-request steps on them."""

    def __init__(self, settings: RadixSettings, tree, pool) -> None:
        self.settings = s = settings
        self.page_size = s.page_size
        self.capacity = s.capacity              # max_total_num_tokens; None = unlimited
        self.tree = tree
        self.pool = pool
        self.refresh_calls = 0
        self.log_hit_tokens = 0                 # the prefill log line's #cached-token, summed
        self.log_input_tokens = 0               # ... and #new-token
        self.evicted_tokens = 0
        self.evicted_leaves = 0
        self.hicache = s.hicache is not None
        self.pending_load = 0                   # HiCache: tokens loaded back since last asked (timed replays)

    # -- requests ------------------------------------------------------------------------
    def new_state(self, prompt: np.ndarray, outputs: np.ndarray, max_new: int, ns: Hashable = None,
                  logprob_start_len: int = -1, aborted: bool = False) -> RequestState:
        """A request that will generate ``outputs``; its row has room for an extra step."""
        tokens = np.concatenate([np.asarray(prompt, np.int64), np.asarray(outputs, np.int64)])
        row = np.zeros(len(tokens) + 2 * self.page_size + 2, np.int64) if self.pool.tracks_slots else None
        return RequestState(tokens, len(prompt), ns, max_new, row, logprob_start_len, aborted)

    def max_new_tokens_for_memory(self, prompt_len: int, wanted: int) -> int:
        """``init_req_max_new_tokens``: generation clipped to what an empty pool holds."""
        return rules.max_new_tokens_for_memory(prompt_len, wanted, self.capacity, self.page_size)

    def reset_row(self, state: RequestState) -> None:
        """A retracted request starts over with an empty row."""
        if state.row is not None:
            state.row[:] = 0
        state.prefix_len = state.extend_end = state.protected = state.inserted = 0
        state.allocated = state.committed = 0
        state.last_node = None

    # -- the allocator -------------------------------------------------------------------
    @property
    def available_size(self) -> int | float:
        return self.pool.available()

    @property
    def evictable_size(self) -> int:
        return self.tree.evictable_size

    @property
    def peak_used_tokens(self) -> int:
        return self.pool.peak_used_tokens

    @property
    def eviction_policy(self) -> str:
        return self.settings.eviction_policy

    def evict_to_free(self, num_tokens: int, state: RequestState | None = None) -> None:
        """``allocator.evict_to_free_tokens``: evict the shortfall, whole leaves (§5.5)."""
        available = self.pool.available()
        if num_tokens <= available:
            return
        freed, leaves, values = self.tree.evict(rules.eviction_amount(num_tokens, available,
                                                                      self.settings.eviction_amount))
        self.pool.free_evicted(freed, values)
        self.evicted_tokens += freed
        self.evicted_leaves += leaves
        if state is not None:
            state.evicted_tokens += freed
            state.evicted_leaves += leaves

    # -- the tree ------------------------------------------------------------------------
    def lock(self, node: Node | None) -> None:
        if node is not None:
            self.tree.lock(node)

    def unlock(self, node: Node | None) -> None:
        if node is not None:
            self.tree.unlock(node)

    def calc_priority(self, state: RequestState) -> None:
        """``SchedulePolicy._touch_waiting_prefixes`` (fcfs, LRU only, every 32nd pass; §5.4)."""
        if self.tree.policy.name != "lru":
            return
        if self.refresh_calls % rules.REFRESH_INTERVAL == 0:
            self.tree.match_prefix(state.tokens, state.ns, state.num_prompt)
        self.refresh_calls += 1

    def touch(self, state: RequestState, length: int) -> None:
        """``touch_prefix``: refresh the recency of the request's cached path."""
        self.tree.match_prefix(state.fill(length), state.ns)

    def match(self, state: RequestState, length: int, limit: int | None = None) -> None:
        """``match_kv_cache`` on the first ``length`` tokens, at most ``limit`` matched.

        It stamps the tree and may split an edge; the request's row starts with the matched
        KV (``prefix_indices``; radix.md §2).
        """
        state.prefix_len, state.last_node = self.tree.match_prefix(state.tokens[:length], state.ns, limit)
        if self.hicache:    # the walk went on through host-only nodes (offload.md §3.5)
            state.best_node, state.host_hit = self.tree.last_best, self.tree.last_host_hit
            state.cached_host = 0
        if state.prefix_len and state.row is not None:
            state.row[:state.prefix_len] = self.tree.path_value(state.last_node)[:state.prefix_len]

    def init_next_round_input(self, state: RequestState) -> None:
        """Match at most ``len - 1`` prompt tokens, a logprob request at most its start (§2.1)."""
        self.match(state, state.num_prompt, rules.max_prefix_len(state.num_prompt, state.logprob_start_len))
        state.protected = state.prefix_len

    # -- admission (§7.2) ------------------------------------------------------------------
    def add_one_req(self, state: RequestState) -> bool:
        """``PrefillAdder.add_one_req`` for a lone request: admit, lock, maybe chunk."""
        p, tree = self.page_size, self.tree
        extend = state.num_prompt - state.prefix_len
        tree.lock(state.last_node)           # the temporary pin while checking
        room = self.pool.available() + tree.evictable_size
        if not rules.admits(extend, state.max_new, p, room):
            tree.unlock(state.last_node)
            return False
        if state.host_hit:
            old = state.last_node
            loaded = self.load_back(state)
            if loaded:                  # the request's lock moves onto the loaded path
                tree.unlock(old)
                tree.lock(state.last_node)
            extend -= loaded
        extend = rules.first_chunk(extend, self.settings.chunked_prefill_size, p)
        if extend <= 0:
            tree.unlock(state.last_node)
            return False
        state.extend_end = state.prefix_len + extend
        state.cached_tokens = state.prefix_len
        self.log_hit_tokens += state.prefix_len
        self.log_input_tokens += extend
        return True

    def load_back(self, state: RequestState) -> int:
        """``init_load_back``: the host part of the match comes to the device whole, or not at
        all (under 10 tokens, or no device room; offload.md §3.5); ``last_node`` becomes its end."""
        tree = self.tree
        loaded = sum(len(x.key) for x in tree.load_back(state.best_node, lambda n: self.evict_to_free(n, state)))
        self.pending_load += loaded
        if loaded:
            state.last_node = state.best_node
            state.prefix_len += loaded
            state.protected = state.prefix_len
            state.cached_host = loaded
            if state.row is not None:
                state.row[:state.prefix_len] = tree.path_value(state.last_node)
        return loaded

    def check_hicache_events(self) -> None:
        """The start of a scheduler step: HiCache's transfers in flight are acknowledged."""
        if self.hicache:
            self.tree.check_events()

    def add_chunked_req(self, state: RequestState) -> None:
        """``PrefillAdder.add_chunked_req``: the next chunk, bounded by free + evictable."""
        room = self.pool.available() + self.tree.evictable_size
        new_len = rules.next_chunk(state.num_prompt - state.prefix_len, room, self.settings.chunked_prefill_size)
        state.extend_end = state.prefix_len + new_len
        self.log_input_tokens += new_len

    # -- KV slots (§5.5) ---------------------------------------------------------------------
    def alloc_extend(self, state: RequestState, evict: bool = True) -> None:
        """``alloc_for_extend``: evict the shortfall, then hand out slots for [prefix, end)
        (the scheduler evicts once for its whole batch: ``evict=False``)."""
        start, end = state.prefix_len, state.extend_end
        if evict:
            self.evict_to_free(rules.extend_demand(start, end, self.page_size), state)
        self.pool.extend(state, start, end)
        state.allocated = state.committed = end

    def decode(self, state: RequestState, steps: int) -> None:
        """``steps`` decode steps of a lone request: per step check_decode_mem + alloc (§5.5).

        Page 1: a step needs one free slot, evicting first when there is none. Pages: a
        step needs ``page`` free tokens (evicting first when fewer) and takes a page when
        its position starts one. Steps between the points where one evicts change nothing
        else, so they are handed out together.
        """
        p, pool = self.page_size, self.pool
        while steps > 0:
            if pool.available() < p:
                self.evict_to_free(p, state)
            run = int(min(steps, pool.available())) if p == 1 else 1
            self._decode_run(state, run)
            steps -= run
            if p > 1 and steps and pool.available() >= p:
                # the steps to the next page boundary take no page and evict nothing
                run = min(steps, ceil_page(state.committed, p) - state.committed)
                self._decode_run(state, run)
                steps -= run

    def _decode_run(self, state: RequestState, run: int) -> None:
        if run:
            self.pool.decode(state, run)
            state.allocated += run
            state.committed += run

    def alloc_decode(self, states: list[RequestState], k: int = 1) -> None:
        """``k`` decode steps of a scheduler batch at once, slots handed out step by step in
        batch order; the batch's eviction already ran."""
        self.pool.decode_batch(states, k)
        for state in states:
            state.allocated += k
            state.committed += k

    # -- publishing and releasing (§3.2, §3.3) -----------------------------------------------
    def checkpoint(self, state: RequestState, upto: int) -> None:
        """``checkpoint_kv_cache``: insert [0, upto) page-floored, free duplicates, move the lock."""
        p, tree, pool = self.page_size, self.tree, self.pool
        key_len = rules.floor_page(upto, p)
        prefix, node = tree.insert(state.tokens, pool.value(state, key_len), state.ns, 0, state.inserted, key_len)
        if prefix > state.protected:  # the tree already held these: free ours
            pool.free(state, state.protected, prefix)
        state.inserted = max(state.inserted, key_len)
        prompt_key = rules.floor_page(state.num_prompt, p)
        if 0 < prompt_key < key_len:
            # split the leaf at the prompt boundary so the output KV can go alone
            tree.insert(state.tokens, pool.value(state, prompt_key), state.ns, 1, prompt_key, prompt_key)
        if tree.classic:
            _, node = tree.match_prefix(state.tokens, state.ns, key_len)
        pool.adopt(state, tree, node, state.protected, key_len)
        tree.unlock(state.last_node)
        tree.lock(node)
        state.protected = key_len
        state.last_node = node
        state.prefix_len = upto

    def release(self, state: RequestState) -> None:
        """``release_kv_cache(checkpoint=True)``: publish what was computed, free the rest, unlock."""
        self.checkpoint(state, state.committed)
        node = state.last_node
        while node is not None and node.parent is not None:
            node.requests += 1
            node = node.parent
        self.release_uncached(state)

    def release_uncached(self, state: RequestState) -> None:
        """``release_kv_cache(checkpoint=False)``: the private KV is freed (a retracted request's all of it)."""
        owned = state.committed
        self.pool.free(state, state.protected, owned)
        self.unlock(state.last_node)
        start = ceil_page(owned, self.page_size)
        if start < state.allocated:
            self.pool.free(state, start, state.allocated)
        state.last_node = None


def make_cache(settings: RadixSettings, fast: bool = False) -> RadixCache:
    """The readable cache (a :class:`RadixTree` over slot ids) or, ``fast``, the fast engine's
    (a :class:`LazyHeapTree` over counts): the same decisions either way."""
    s = settings
    if s.hicache is not None:   # HiCache: the readable tree with host copies, over slot ids (both implementations)
        from kvsim.engines.sglang.hicache import HiRadixTree

        pool = PageAllocator(s.capacity, s.page_size)
        return RadixCache(s, HiRadixTree(s.page_size, s.eviction_policy, s.tree, s.policy_config, s.hicache, pool),
                          pool)
    tree = (LazyHeapTree if fast else RadixTree)(s.page_size, s.eviction_policy, s.tree, s.policy_config)
    return RadixCache(s, tree, (TokenCounter if fast else PageAllocator)(s.capacity, s.page_size))


def plan_request(cache: RadixCache, prompt: np.ndarray, output: np.ndarray, ns: Hashable,
                 logprob_start_len: int = -1) -> RequestState:
    """A request of a sequential replay, with the generation length and finish SGLang decides (§3.3).

    A reply ends at its logged length (``finish="length"``: ``max_tokens`` = that length)
    or with a stop token (``"stop"``: ``max_tokens`` the client's, else uncapped), clipped
    to the empty pool. A request whose ``logprob_start_len`` passes its prompt's end is
    refused and runs as the one-token placeholder prompt ``[0]``.
    """
    s = cache.settings
    logged = max(len(output), 1)
    if s.finish == "length":
        wanted = logged
    else:
        wanted = rules.UNCAPPED_MAX_NEW if s.max_new_tokens is None else int(s.max_new_tokens)
    max_new = cache.max_new_tokens_for_memory(len(prompt), wanted)
    aborted = rules.logprob_aborts(len(prompt), logprob_start_len)
    if aborted:  # the placeholder: prompt [0], one sampled token, no logprobs
        prompt, k, logprob_start_len = np.zeros(1, np.int64), 1, -1
    else:
        k = min(logged, max(max_new, 1))
    state = cache.new_state(prompt, output[:k], max_new, ns, logprob_start_len, aborted)
    # overlap builds the next decode batch before it sees the stop token; only a finish by
    # length is known in advance (skip-finishing-decode)
    state.extra_step = s.overlap and (s.finish == "stop" or aborted) and k < max_new
    return state
