"""The SGLang scheduler model's only door into the radix cache model (``kvsim.cache.radix``).

SGLang's scheduler drives its tree cache, token allocator and request-to-token rows
through a few calls (``match_prefix``, ``lock``/``unlock``, ``evict``, ``alloc``,
``checkpoint_kv_cache``, ``release_kv_cache``); this module exposes exactly those, on
kvsim's reference ``RadixReference``, so moving the cache layer means editing this one
file. A request's KV bookkeeping (its row of slots, protected / inserted / allocated /
committed lengths, locked node) is a ``radix.reference.RequestState``. Citations name the cache
rules' page, ``docs/engines/radix.md``.
"""
from __future__ import annotations

from collections.abc import Hashable

import numpy as np

from kvsim.engines.sglang.reference import RadixReference, RequestState
from kvsim.engines.sglang.rules import ceil_page, decode_starts_page, max_new_tokens_for_memory, namespace
from kvsim.engines.sglang.settings import RadixSettings
from kvsim.engines.sglang.tree import Node, RadixTree

__all__ = ["SglangKVCache", "RequestState", "ceil_page", "namespace"]


class RingSlotAllocator:
    """``radix.reference.SlotAllocator`` with its free pages in a numpy ring: the same pages in
    the same order (taken from the front; freed pages appended (page 1) or prepended (paged)),
    without a Python operation per slot."""

    def __init__(self, capacity: int, page_size: int) -> None:
        self.page_size = page_size
        self.unlimited = False
        self.num_pages = capacity // page_size
        self.ring = np.arange(1, self.num_pages + 2, dtype=np.int64)   # page 0 is padding
        self.cap = len(self.ring)
        self.head = 0
        self.size = self.num_pages

    def available_size(self) -> int:
        return self.size * self.page_size

    def _positions(self, start: int, n: int) -> np.ndarray:
        return (start + np.arange(n)) % self.cap

    def alloc_pages(self, n: int) -> np.ndarray:
        if n > self.size:
            raise RuntimeError("out of KV memory (the admission check should prevent this)")
        if self.head + n <= self.cap:
            out = self.ring[self.head:self.head + n].copy()
        else:
            out = self.ring[self._positions(self.head, n)]
        self.head = (self.head + n) % self.cap
        self.size -= n
        return out

    def free_slots(self, slots: np.ndarray) -> None:
        if len(slots) == 0:
            return
        p = self.page_size
        pages = np.asarray(slots[::p]) // p
        m = len(pages)
        if p == 1:                                   # token allocator appends
            self.ring[self._positions(self.head + self.size, m)] = pages
        else:                                        # paged allocator prepends
            self.head = (self.head - m) % self.cap
            self.ring[self._positions(self.head, m)] = pages
        self.size += m


class SglangKVCache:
    """SGLang 0.5.23's ``UnifiedRadixCache`` + token allocator, as the scheduler calls them."""

    def __init__(self, capacity: int, page_size: int = 1, eviction_policy: str = "lru",
                 flavor: str = "unified") -> None:
        self.model = RadixReference(RadixSettings(page_size=page_size, capacity=capacity,
                                                  eviction_policy=eviction_policy, tree=flavor))
        self.model.alloc = RingSlotAllocator(capacity, page_size)
        self.tree: RadixTree = self.model.tree
        self.page_size = page_size
        self.capacity = capacity
        self.eviction_policy = eviction_policy

    # -- requests --------------------------------------------------------------------
    def max_new_tokens_for_memory(self, prompt_len: int, wanted: int) -> int:
        """``init_req_max_new_tokens``: generation clipped to what an empty pool holds."""
        return max_new_tokens_for_memory(prompt_len, wanted, self.capacity, self.page_size)

    def new_state(self, prompt: np.ndarray, outputs: np.ndarray, max_new: int, ns: Hashable = None) -> RequestState:
        row = np.zeros(len(prompt) + len(outputs) + 2 * self.page_size + 2, np.int64)
        return RequestState(np.asarray(prompt, np.int64), np.asarray(outputs, np.int64), ns, max_new, row)

    def reset_row(self, state: RequestState) -> None:
        """A retracted request starts over with an empty row."""
        state.row[:] = 0
        state.prefix_len = state.extend_end = state.protected = state.inserted = 0
        state.allocated = state.committed = 0
        state.last_node = None

    # -- the tree ----------------------------------------------------------------------
    def match(self, state: RequestState, length: int, limit: int | None = None) -> None:
        """``match_kv_cache`` on the first ``length`` tokens (at most ``limit`` matched).

        Sets the request's prefix and locked-to-be node and copies the prefix's slots into
        its row; it stamps the tree and may split an edge (radix.md §2).
        """
        n = length if limit is None else min(length, limit)
        tokens = state.fill(length)[:n]
        state.prefix_len, state.last_node = self.tree.match_prefix(tokens, state.ns)
        if state.prefix_len:
            state.row[:state.prefix_len] = self.tree.path_value(state.last_node)[:state.prefix_len]

    def touch(self, state: RequestState, length: int) -> None:
        """``touch_prefix``: refresh the recency of the request's cached path."""
        self.tree.match_prefix(state.fill(length), state.ns)

    def lock(self, node: Node | None) -> None:
        if node is not None:
            self.tree.lock(node)

    def unlock(self, node: Node | None) -> None:
        if node is not None:
            self.tree.unlock(node)

    @property
    def evictable_size(self) -> int:
        return self.tree.evictable_size

    @property
    def available_size(self) -> int:
        return int(self.model.available())

    def evict_to_free(self, num_tokens: int) -> None:
        """``evict_to_free_tokens``: evict the shortfall below ``num_tokens``, whole leaves."""
        self.model.evict_to_free(None, num_tokens)

    # -- KV slots ----------------------------------------------------------------------
    def alloc_extend(self, state: RequestState) -> None:
        """Slots for ``[prefix_len, extend_end)``; the batch's eviction already ran."""
        self.model.alloc_extend(state)

    def alloc_decode(self, states: list[RequestState]) -> None:
        """One slot each for the next decode position, in batch order; the eviction already ran."""
        p, alloc = self.page_size, self.model.alloc
        if p == 1:
            for state, slot in zip(states, alloc.alloc_pages(len(states)).tolist()):
                state.row[state.committed] = slot
                state.allocated += 1
                state.committed += 1
            return
        opening = [st for st in states if decode_starts_page(st.committed, p)]
        pages = iter(alloc.alloc_pages(len(opening)).tolist())
        for state in states:
            c = state.committed
            state.row[c] = next(pages) * p if c % p == 0 else state.row[c - 1] + 1
            state.allocated += 1
            state.committed += 1

    def alloc_decode_steps(self, states: list[RequestState], k: int) -> None:
        """``k`` decode steps of the batch at once: slots handed out step by step, in batch order."""
        p, alloc, bs = self.page_size, self.model.alloc, len(states)
        if p == 1:
            slots = alloc.alloc_pages(k * bs).reshape(k, bs)
            for b, state in enumerate(states):
                c = state.committed
                state.row[c:c + k] = slots[:, b]
                state.allocated += k
                state.committed += k
            return
        # a request opens a page at each position that is a multiple of p
        opens = sorted((j, b) for b, st in enumerate(states) for j in range((-st.committed) % p, k, p))
        pages = dict(zip(opens, alloc.alloc_pages(len(opens)).tolist()))
        for b, state in enumerate(states):
            c, row = state.committed, state.row
            for j in range(k):
                row[c + j] = pages[(j, b)] * p if (c + j) % p == 0 else row[c + j - 1] + 1
            state.allocated += k
            state.committed += k

    def checkpoint(self, state: RequestState, upto: int) -> None:
        """``checkpoint_kv_cache``: publish ``[0, upto)`` and move the lock (radix.md §3.2)."""
        self.model.checkpoint(state, upto)

    def release(self, state: RequestState) -> None:
        """``release_kv_cache(checkpoint=True)`` of a finished request (radix.md §3.3)."""
        self.model.release(state)

    def release_uncached(self, state: RequestState) -> None:
        """``release_kv_cache(checkpoint=False)``: a retracted request's private KV is freed."""
        alloc, p = self.model.alloc, self.page_size
        owned = state.committed
        alloc.free_slots(state.row[state.protected:owned])
        self.unlock(state.last_node)
        start = ceil_page(owned, p)
        if start < state.allocated:
            alloc.free_slots(state.row[start:state.allocated])
        state.last_node = None
