"""The sequential SGLang replay: one request at a time through :class:`~kvsim.engines.sglang.request.RadixCache`.

Both implementations serve a request with the same life (:func:`serve_one`); they differ
only in the cache's parts:

* :class:`RadixReference` — the readable model: a :class:`~kvsim.engines.sglang.tree.RadixTree`
  (a heap rebuilt from every evictable leaf at each eviction, as SGLang does) over real
  slot ids (:class:`~kvsim.engines.sglang.allocator.PageAllocator`), and the stepwise
  ``admit`` / ``decode`` / ``finish`` that gpu-validate and the serve model drive.
* :class:`RadixFast` — the fast engine: the same decisions on a
  :class:`~kvsim.engines.sglang.tree.LazyHeapTree` (one persistent eviction heap) and a
  :class:`~kvsim.engines.sglang.allocator.TokenCounter` (counts, no slot ids).

SGLang clips a request's generation to the empty pool (``max_new_tokens_for_memory``);
a request whose prompt cannot be admitted even into an empty pool would wait forever
in SGLang; kvsim reports it as rejected and goes on. A request whose
``logprob_start_len`` exceeds its prompt is refused (HTTP 400) but still runs as a
one-token placeholder (``logprob_aborts``); kvsim reports it as rejected too.
``tests/test_radix_fast.py`` replays random workloads through both and demands identical
per-request results and identical trees.
"""
from __future__ import annotations

from typing import Hashable

import numpy as np

from kvsim.engines.base import Admission, PrefixCache, Request, SequentialCache, Served, Workload
from kvsim.engines.sglang.request import RadixCache, RequestState, make_cache, plan_request
from kvsim.engines.sglang.rules import namespace
from kvsim.engines.sglang.settings import RadixSettings
from kvsim.engines.sglang.tree import Node


def serve_one(cache: RadixCache, state: RequestState) -> Served:
    """A lone request's whole life (the steps of :mod:`kvsim.engines.sglang.request`); with
    HiCache every step starts with ``check_hicache_events`` (docs/engines/offload.md §3.1)."""
    log_before = cache.log_input_tokens
    L = state.num_prompt
    hicache = cache.hicache
    if hicache:
        cache.check_hicache_events()
    cache.calc_priority(state)
    cache.init_next_round_input(state)
    if not cache.add_one_req(state):
        return Served(0, True, state.evicted_tokens, state.evicted_leaves, state.max_new, 0)
    cache.alloc_extend(state)
    while state.extend_end < L:   # chunked prefill: checkpoint the chunk, schedule the next
        if hicache:
            cache.check_hicache_events()
        cache.checkpoint(state, state.extend_end)
        cache.add_chunked_req(state)
        cache.alloc_extend(state)
    k = state.k
    if k > 1:
        if cache.settings.overlap:  # the first decode step is prepared before the prefill result
            if hicache:
                cache.check_hicache_events()
            cache.decode(state, 1)
            cache.checkpoint(state, L)
        else:
            cache.checkpoint(state, L)
            if hicache:
                cache.check_hicache_events()
            cache.decode(state, 1)
        if hicache and k > 2:
            cache.check_hicache_events()
        cache.decode(state, k - 2)
    if state.extra_step:   # overlap + stop token: the step built before the stop was seen
        cache.decode(state, 1)
    cache.release(state)
    return Served(state.cached_tokens, state.aborted, state.evicted_tokens, state.evicted_leaves, state.max_new,
                  cache.log_input_tokens - log_before)


class _RadixSequential(SequentialCache):
    """One SGLang radix cache serving requests one at a time."""

    fast = False

    def __init__(self, settings: RadixSettings | None = None) -> None:
        self.settings = s = settings or RadixSettings()
        self.page_size = s.page_size
        self.cache = make_cache(s, self.fast)
        self.tree = self.cache.tree
        self._split: list[tuple[int, int]] = []     # HiCache: (device, host) tokens per request

    def state_for(self, prompt: np.ndarray, output: np.ndarray, ns: Hashable, logprob_start_len: int = -1):
        return plan_request(self.cache, prompt, output, ns, logprob_start_len)

    def serve(self, req: Request) -> Served:
        return self.serve_tokens(np.asarray(req.prompt, np.int64), np.asarray(req.output, np.int64),
                                 namespace(req.lora, req.cache_salt), req.logprob_start_len)

    def serve_at(self, work: Workload, i: int) -> Served:
        a, b = int(work.prompt_offsets[i]), int(work.prompt_offsets[i + 1])
        c, d = int(work.output_offsets[i]), int(work.output_offsets[i + 1])
        return self.serve_tokens(work.prompt_tokens[a:b].astype(np.int64), work.output_tokens[c:d],
                                 namespace(work.lora[i], work.cache_salt[i]), int(work.logprob_start_len[i]))

    def serve_tokens(self, prompt: np.ndarray, output: np.ndarray, ns: Hashable,
                     logprob_start_len: int = -1) -> Served:
        """Serve a request: its prompt, the output tokens it would generate, its namespace;
        ``logprob_start_len`` (-1: none) caps its match."""
        state = self.state_for(prompt, output, ns, logprob_start_len)
        served = serve_one(self.cache, state)
        if self.cache.hicache:    # the per-request device / host split (offload.md §3.6)
            host = 0 if served.rejected else state.cached_host
            self._split.append((served.cached_tokens - host, host))
        return served

    def tier_run(self):
        """HiCache's per-request split and counters (None without HiCache)."""
        if not self.cache.hicache:
            return None
        from kvsim.engines.sglang.hicache import tier_run

        device, host = zip(*self._split) if self._split else ((), ())
        return tier_run(self.tree, list(device), list(host))

    # -- inspection -----------------------------------------------------------------
    def available(self) -> int | float:
        return self.cache.available_size

    def used_tokens(self) -> int:
        """KV tokens held: in the tree, or private to running requests."""
        return self.cache.pool.used_tokens

    @property
    def evictable(self) -> int:
        return self.tree.evictable_size

    @property
    def total_size(self) -> int:
        return self.tree.total_size

    @property
    def peak_used_tokens(self) -> int:
        return self.cache.peak_used_tokens

    @property
    def root(self) -> Node:
        return self.tree.root

    def nodes(self):
        return self.tree.nodes()

    def paths(self) -> list[tuple[int, ...]]:
        return self.tree.paths()


class RadixFast(_RadixSequential):
    """The fast engine: the lazy-heap tree and counts instead of slots."""

    fast = True


class RadixReference(_RadixSequential, PrefixCache):
    """The readable model, with the stepwise life SGLang's scheduler gives a lone request."""

    def __init__(self, settings: RadixSettings | None = None) -> None:
        super().__init__(settings)
        self.active: dict[str, RequestState] = {}
        self.last_rejected: RequestState | None = None

    token_slots = True      # a running request's row holds one slot per token

    @classmethod
    def for_validation(cls, settings: RadixSettings, trace) -> tuple["RadixReference", int]:
        """The model gpu-validate drives, and the pool pages it needs: unlimited, slots are never
        reused and a request allocates at most L + M + 1 slots plus a page."""
        from kvsim.engines.sglang.rules import ceil_page
        from kvsim.errors import ConfigError

        if settings.finish != "length":
            raise ConfigError("gpu-validate follows requests that finish by length only (finish='length')")
        p = settings.page_size
        L = trace.prompt_lengths
        slice_pages = int(np.sum(ceil_page(L + np.maximum(trace.output_lengths, 1) + 1, p) // p + 1)) + 2
        return cls(settings), slice_pages if settings.capacity is None else settings.capacity // p + 1

    def decodes_after_admission(self, req: Request) -> int:
        state = self.active.get(req.request_id)
        return 0 if state is None else state.k - 1   # generation clipped to the pool (max_new)

    def admit(self, req: Request) -> Admission | None:
        cache = self.cache
        state = self.state_for(np.asarray(req.prompt, np.int64), np.asarray(req.output, np.int64),
                               namespace(req.lora, req.cache_salt), int(req.logprob_start_len))
        cache.calc_priority(state)
        cache.init_next_round_input(state)
        if not cache.add_one_req(state):
            self.last_rejected = state
            return None
        self.active[req.request_id] = state
        cache.alloc_extend(state)
        while state.extend_end < state.num_prompt:   # chunked prefill
            cache.checkpoint(state, state.extend_end)
            cache.add_chunked_req(state)
            cache.alloc_extend(state)
        state.generated = 1
        req.num_generated = 1
        if state.k > 1:
            if self.settings.overlap:
                state.pending_checkpoint = True
            else:
                cache.checkpoint(state, state.num_prompt)
        p = self.page_size
        table = state.row[:state.num_prompt]
        table = table if p == 1 else table[::p] // p
        return Admission(state.cached_tokens, table.copy(), state.evicted_tokens, state.evicted_leaves)

    def decode(self, req: Request) -> int:
        state = self.active[req.request_id]
        before = state.evicted_tokens
        self.cache.decode(state, 1)
        if state.pending_checkpoint:  # overlap: the prefill result lands after this step
            self.cache.checkpoint(state, state.num_prompt)
            state.pending_checkpoint = False
        state.generated += 1
        req.num_generated = state.generated
        return state.evicted_tokens - before

    def finish(self, req: Request) -> int:
        state = self.active.pop(req.request_id)
        before = state.evicted_tokens
        if state.extra_step:   # the wasted step computes the last token's KV
            self.cache.decode(state, 1)
        self.cache.release(state)
        return state.evicted_tokens - before

    def block_table(self, req: Request) -> np.ndarray | None:
        """A running request's ``req_to_token`` row: one KV slot per token so far."""
        state = self.active.get(req.request_id)
        return None if state is None else state.row[:state.committed]
