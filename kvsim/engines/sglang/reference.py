"""SGLang RadixAttention as its scheduler drives it, one request at a time (reference model;
sections: docs/engines/radix.md).

The life of a lone request in SGLang 0.5.23 (``scheduler.py``, ``schedule_policy.py``,
``schedule_batch.py``, ``mem_cache/common.py``, ``mem_cache/allocation.py``), each
step a method below with the engine's name:

1. ``calc_priority``: with LRU eviction, every 32nd scheduling pass first refreshes the
   waiting request's full-prompt path (a full-length match: stamps, may split).
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
6. ``decode_step``: per generated token, make ``page`` tokens allocatable (page 1: one)
   and allocate a slot; with the overlap scheduler (SGLang's default) the first decode
   step is prepared before the prefill result is processed, i.e. before step 5.
7. ``release``: insert ``floor_page(L + k - 1)`` tokens (the last sampled token has
   no KV; the overlap scheduler skips the decode of a request finishing by length, so
   this holds for both schedulers), split the leaf at the prompt boundary with a
   one-higher priority, free the private tail, unlock (§3.3).

SGLang clips a request's generation to the empty pool (``max_new_tokens_for_memory``);
a request whose prompt cannot be admitted even into an empty pool would wait forever
in SGLang; kvsim reports it as rejected and goes on. A request whose
``logprob_start_len`` exceeds its prompt is refused (HTTP 400) but still runs as a
one-token placeholder (``logprob_aborts``); kvsim reports it as rejected too.

This module is readable and slow; :mod:`kvsim.engines.sglang.fast` is the fast engine
and is tested against it.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Hashable

import numpy as np

from kvsim.engines.base import Admission, PrefixCache, Request, Served
from kvsim.engines.sglang import rules
from kvsim.engines.sglang.rules import ceil_page, namespace
from kvsim.engines.sglang.settings import RadixSettings
from kvsim.engines.sglang.tree import Node, RadixTree

class SlotAllocator:
    """SGLang's token (page 1) or paged KV allocator: free pages, handed out from the front."""

    def __init__(self, capacity: int | None, page_size: int) -> None:
        self.page_size = page_size
        self.unlimited = capacity is None
        self.num_pages = 0 if capacity is None else capacity // page_size
        self.free_pages: deque[int] = deque(range(1, self.num_pages + 1))  # page 0 is padding
        self._next = 1

    def available_size(self) -> int | float:
        return float("inf") if self.unlimited else len(self.free_pages) * self.page_size

    def alloc_pages(self, n: int) -> np.ndarray:
        if self.unlimited:
            out = np.arange(self._next, self._next + n, dtype=np.int64)
            self._next += n
            return out
        if n > len(self.free_pages):
            raise RuntimeError("out of KV memory (the admission check should prevent this)")
        return np.array([self.free_pages.popleft() for _ in range(n)], dtype=np.int64)

    def free_slots(self, slots: np.ndarray) -> None:
        """free_segment: a page-aligned run of slots releases each page it touches once."""
        if len(slots) == 0 or self.unlimited:
            return
        p = self.page_size
        pages = (slots[::p] // p).tolist()
        if p == 1:
            self.free_pages.extend(pages)            # token allocator appends
        else:
            self.free_pages.extendleft(reversed(pages))  # paged allocator prepends


@dataclass
class RequestState:
    """A running request's KV bookkeeping (SGLang's ``Req`` / ``ReqKvInfo``)."""

    prompt: np.ndarray
    outputs: np.ndarray                 # the tokens it will generate (k of them)
    ns: Hashable
    max_new: int
    row: np.ndarray                     # req_to_token row: slot of each position
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

    @property
    def k(self) -> int:
        return len(self.outputs)

    def fill(self, upto: int) -> np.ndarray:
        n_out = upto - len(self.prompt)
        if n_out <= 0:
            return self.prompt[:upto]
        return np.concatenate([self.prompt, self.outputs[:n_out]])


class RadixReference(PrefixCache):
    """The request-level SGLang radix cache with its allocator (sequential driver)."""

    def __init__(self, settings: RadixSettings | None = None) -> None:
        self.settings = s = settings or RadixSettings()
        self.page_size = s.page_size
        self.capacity = s.capacity            # max_total_num_tokens; None = unlimited
        self.overlap = s.overlap
        self.chunked_prefill_size = s.chunked_prefill_size
        self.finish_mode = s.finish           # how requests end: "length" or "stop" (a stop token)
        self.max_new_tokens = s.max_new_tokens
        self.eviction_amount = s.eviction_amount
        self.tree = RadixTree(s.page_size, s.eviction_policy, s.tree, s.policy_config)
        self.alloc = SlotAllocator(s.capacity, s.page_size)
        self.active: dict[str, RequestState] = {}
        self.refresh_calls = 0
        self.log_hit_tokens = 0
        self.log_input_tokens = 0
        self.peak_used = 0

    # -- accounting ----------------------------------------------------------------
    def available(self) -> int | float:
        return self.alloc.available_size()

    def used_tokens(self) -> int:
        private = sum(ceil_page(r.allocated, self.page_size) - r.protected for r in self.active.values())
        return self.tree.total_size + private

    def _note_peak(self) -> None:
        self.peak_used = max(self.peak_used, self.used_tokens())

    def evict_to_free(self, state: RequestState | None, num_tokens: int) -> None:
        """allocator.evict_to_free_tokens: evict the shortfall, whole leaves (§5.5)."""
        amount = rules.eviction_amount(num_tokens, self.available(), self.eviction_amount)
        if amount:
            freed, leaves, values = self.tree.evict(amount)
            for v in values:
                self.alloc.free_slots(v)
            if state is not None:
                state.evicted_tokens += freed
                state.evicted_leaves += leaves

    # -- the scheduler's steps -----------------------------------------------------
    def calc_priority(self, state: RequestState) -> None:
        """SchedulePolicy._touch_waiting_prefixes (fcfs, LRU only, every 32nd pass)."""
        if self.tree.policy.name != "lru":
            return
        if self.refresh_calls % rules.REFRESH_INTERVAL == 0:
            self.tree.match_prefix(state.prompt, state.ns)
        self.refresh_calls += 1

    def init_next_round_input(self, state: RequestState) -> None:
        """Match at most len - 1 tokens, a logprob request at most its start (§2.1)."""
        limit = rules.max_prefix_len(len(state.prompt), state.logprob_start_len)
        state.prefix_len, state.last_node = self.tree.match_prefix(state.prompt, state.ns, limit)
        state.protected = state.prefix_len
        if state.prefix_len:  # the request's slot row starts with the matched KV (prefix_indices)
            state.row[:state.prefix_len] = self.tree.path_value(state.last_node)[:state.prefix_len]

    def add_one_req(self, state: RequestState) -> bool:
        """PrefillAdder.add_one_req for a lone request: admit, lock, maybe chunk."""
        p = self.page_size
        extend = len(state.prompt) - state.prefix_len
        self.tree.lock(state.last_node)           # the temporary pin while checking
        room = self.available() + self.tree.evictable_size
        self.tree.unlock(state.last_node)
        if not rules.admits(extend, state.max_new, p, room):
            return False
        extend = rules.first_chunk(extend, self.chunked_prefill_size, p)
        if extend <= 0:
            return False
        state.extend_end = state.prefix_len + extend
        self.tree.lock(state.last_node)
        state.cached_tokens = state.prefix_len
        self.log_hit_tokens += state.prefix_len
        self.log_input_tokens += extend
        return True

    def add_chunked_req(self, state: RequestState) -> None:
        """PrefillAdder.add_chunked_req: the next chunk, bounded by free + evictable."""
        room = self.available() + self.tree.evictable_size
        new_len = rules.next_chunk(len(state.prompt) - state.prefix_len, room, self.chunked_prefill_size)
        state.extend_end = state.prefix_len + new_len
        self.log_input_tokens += new_len

    def alloc_extend(self, state: RequestState) -> None:
        """alloc_for_extend: evict the shortfall, then hand out slots for [prefix, end)."""
        p = self.page_size
        start, end = state.prefix_len, state.extend_end
        self.evict_to_free(state, rules.extend_demand(start, end, p))
        if p == 1:
            state.row[start:end] = self.alloc.alloc_pages(end - start)
        else:
            pos = start
            if start % p:  # finish the partially filled last page first
                fill_end = min(end, ceil_page(start, p))
                state.row[start:fill_end] = state.row[start - 1] + 1 + np.arange(fill_end - start)
                pos = fill_end
            n_pages = ceil_page(end, p) // p - ceil_page(pos, p) // p
            pages = self.alloc.alloc_pages(n_pages)
            slots = (pages[:, None] * p + np.arange(p)).reshape(-1)
            state.row[pos:end] = slots[: end - pos]
        state.allocated = state.committed = end
        self._note_peak()

    def checkpoint(self, state: RequestState, upto: int) -> None:
        """Insert [0, upto) page-floored, free duplicates, move the lock (§3.2, §3.3)."""
        p = self.page_size
        tokens = state.fill(upto)
        key_len = rules.floor_page(upto, p)
        prefix, node = self.tree.insert(tokens[:key_len], state.row[:key_len], state.ns,
                                        priority=0, inserted_len=state.inserted)
        if prefix > state.protected:  # the tree already held these: free ours
            self.alloc.free_slots(state.row[state.protected:prefix])
        state.inserted = max(state.inserted, key_len)
        prompt_key = rules.floor_page(len(state.prompt), p)
        if 0 < prompt_key < key_len:
            # split the leaf at the prompt boundary so the output KV can go alone
            self.tree.insert(tokens[:prompt_key], state.row[:prompt_key], state.ns,
                             priority=1, inserted_len=prompt_key)
        if self.tree.classic:
            _, node = self.tree.match_prefix(tokens, state.ns, key_len)
        path = self.tree.path_value(node)
        assert len(path) == key_len
        state.row[state.protected:key_len] = path[state.protected:]
        self.tree.unlock(state.last_node)
        self.tree.lock(node)
        state.protected = key_len
        state.last_node = node
        state.prefix_len = upto

    def decode_step(self, state: RequestState) -> None:
        """check_decode_mem + alloc_for_decode for one token (§5.5)."""
        p = self.page_size
        c = state.committed
        if p == 1:
            self.evict_to_free(state, 1)          # check_decode_mem
            self.evict_to_free(state, 1)          # alloc_token_slots
            state.row[c] = self.alloc.alloc_pages(1)[0]
        else:
            new_page = rules.decode_starts_page(c, p)
            if new_page:
                self.evict_to_free(state, p)      # check_decode_mem
            self.evict_to_free(state, p)          # alloc_paged_token_slots_decode: bs * page
            state.row[c] = self.alloc.alloc_pages(1)[0] * p if new_page else state.row[c - 1] + 1
        state.allocated += 1
        state.committed += 1
        self._note_peak()

    def release(self, state: RequestState) -> None:
        """release_kv_cache(checkpoint=True) for a request finished by length."""
        p = self.page_size
        owned = state.committed
        self.checkpoint(state, owned)
        for node in _path(state.last_node):
            node.requests += 1
        self.alloc.free_slots(state.row[state.protected:owned])
        self.tree.unlock(state.last_node)
        start = ceil_page(owned, p)
        if start < state.allocated:
            self.alloc.free_slots(state.row[start:state.allocated])
        state.last_node = None

    # -- PrefixCache interface -----------------------------------------------------
    def new_state(self, req: Request) -> RequestState:
        """Generation length and finish as SGLang decides them (§3.3)."""
        prompt = np.asarray(req.prompt, np.int64)
        logged = max(len(req.output), 1)
        if self.finish_mode == "length":
            wanted = logged
        else:
            wanted = rules.UNCAPPED_MAX_NEW if self.max_new_tokens is None else int(self.max_new_tokens)
        max_new = rules.max_new_tokens_for_memory(len(prompt), wanted, self.capacity, self.page_size)
        start = int(req.logprob_start_len)
        aborted = rules.logprob_aborts(len(prompt), start)
        if aborted:  # the placeholder: prompt [0], one sampled token, no logprobs
            prompt, k, start = np.zeros(1, np.int64), 1, -1
        else:
            k = min(logged, max(max_new, 1))
        outputs = np.asarray(req.output[:k], np.int64)
        row = np.zeros(len(prompt) + k + 1 + self.page_size, np.int64)
        state = RequestState(prompt, outputs, namespace(req.lora, req.cache_salt), max_new, row, start, aborted)
        # overlap builds the next decode batch before it sees the stop token; only a
        # finish by length is known in advance (skip-finishing-decode)
        stops = self.finish_mode == "stop" or aborted
        state.extra_step = self.overlap and stops and k < max_new
        return state

    def admit(self, req: Request) -> Admission | None:
        state = self.new_state(req)
        self.calc_priority(state)
        self.init_next_round_input(state)
        if not self.add_one_req(state):
            self.last_rejected = state
            return None
        self.active[req.request_id] = state
        self.alloc_extend(state)
        while state.extend_end < len(state.prompt):   # chunked prefill
            self.checkpoint(state, state.extend_end)
            self.add_chunked_req(state)
            self.alloc_extend(state)
        state.generated = 1
        req.num_generated = 1
        if state.k > 1:
            if self.overlap:
                state.pending_checkpoint = True
            else:
                self.checkpoint(state, len(state.prompt))
        p = self.page_size
        table = state.row[:len(state.prompt)]
        table = table if p == 1 else table[::p] // p
        return Admission(state.cached_tokens, table.copy(), state.evicted_tokens, state.evicted_leaves)

    def decode(self, req: Request) -> int:
        state = self.active[req.request_id]
        before = state.evicted_tokens
        self.decode_step(state)
        if state.pending_checkpoint:  # overlap: the prefill result lands after this step
            self.checkpoint(state, len(state.prompt))
            state.pending_checkpoint = False
        state.generated += 1
        req.num_generated = state.generated
        return state.evicted_tokens - before

    def finish(self, req: Request) -> int:
        state = self.active.pop(req.request_id)
        before = state.evicted_tokens
        if state.extra_step:   # the wasted step computes the last token's KV
            self.decode_step(state)
        self.release(state)
        return state.evicted_tokens - before

    def block_table(self, req: Request) -> np.ndarray | None:
        """A running request's ``req_to_token`` row: one KV slot per token so far."""
        state = self.active.get(req.request_id)
        return None if state is None else state.row[:state.committed]

    def serve(self, req: Request) -> Served:
        """Admit, decode every token, finish: one request of a sequential replay."""
        state_before = self.log_input_tokens
        if self.admit(req) is None:
            st = self.last_rejected
            return Served(0, True, st.evicted_tokens, st.evicted_leaves, st.max_new, 0)
        state = self.active[req.request_id]
        for _ in range(state.k - 1):
            self.decode(req)
        self.finish(req)
        return Served(state.cached_tokens, state.aborted, state.evicted_tokens, state.evicted_leaves,
                      state.max_new, self.log_input_tokens - state_before)

    @property
    def peak_used_tokens(self) -> int:
        return self.peak_used


def _path(node: Node | None):
    while node is not None and node.parent is not None:
        yield node
        node = node.parent
