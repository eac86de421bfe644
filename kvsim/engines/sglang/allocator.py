"""SGLang's KV allocators: where a request's tokens live (``docs/engines/radix.md §5.5``).

Two pools behind one set of request-level operations, which the request life
(:mod:`kvsim.engines.sglang.request`) calls:

* :class:`PageAllocator` — SGLang's token (page 1) or paged allocator with real slot ids:
  free pages handed out from the front; freed pages appended (page 1) or prepended (paged).
  A request's ``row`` (``req_to_token``) holds the slot of each position. The readable
  model and the scheduler use it (gpu-validate reads the rows as block tables).
* :class:`TokenCounter` — the same allocator as counts only (the fast engine): the tokens
  it would hand out and take back, no slot ids, so a decode run is one subtraction.

``extend``, ``decode``, ``free`` and ``free_evicted`` change the same amounts in both;
``tests/test_radix_fast.py`` holds the replays through both equal.
"""
from __future__ import annotations

import numpy as np

from kvsim.engines.sglang.rules import ceil_page, decode_starts_page

UNLIMITED = 1 << 62


class PageAllocator:
    """Free pages in a numpy ring (page 0 is padding); ``capacity`` None: unlimited, fresh ids."""

    tracks_slots = True

    def __init__(self, capacity: int | None, page_size: int) -> None:
        self.page_size = p = page_size
        self.unlimited = capacity is None
        self.num_pages = 0 if capacity is None else capacity // p
        self.ring = np.arange(1, self.num_pages + 2, dtype=np.int64)
        self.cap = len(self.ring)
        self.head = 0
        self.size = self.num_pages
        self._next = 1                # unlimited: the next fresh page
        self.in_use = 0               # pages handed out and not yet freed
        self.peak_in_use = 0

    def available(self) -> int | float:
        return float("inf") if self.unlimited else self.size * self.page_size

    @property
    def used_tokens(self) -> int:
        return self.in_use * self.page_size

    @property
    def peak_used_tokens(self) -> int:
        return self.peak_in_use * self.page_size

    def _positions(self, start: int, n: int) -> np.ndarray:
        return (start + np.arange(n)) % self.cap

    def alloc_pages(self, n: int) -> np.ndarray:
        self.in_use += n
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        if self.unlimited:
            out = np.arange(self._next, self._next + n, dtype=np.int64)
            self._next += n
            return out
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
        """``free_segment``: a page-aligned run of slots releases each page it touches once."""
        if len(slots) == 0:
            return
        p = self.page_size
        pages = np.asarray(slots[::p]) // p
        m = len(pages)
        self.in_use -= m
        if self.unlimited:
            return
        if p == 1:                                   # token allocator appends
            self.ring[self._positions(self.head + self.size, m)] = pages
        else:                                        # paged allocator prepends
            self.head = (self.head - m) % self.cap
            self.ring[self._positions(self.head, m)] = pages
        self.size += m

    # -- a request's operations -----------------------------------------------------------
    def extend(self, state, start: int, end: int) -> None:
        """``alloc_for_extend``: slots for positions ``[start, end)``; a partly filled last page
        is finished first."""
        p, row = self.page_size, state.row
        if p == 1:
            row[start:end] = self.alloc_pages(end - start)
            return
        pos = start
        if start % p:
            fill_end = min(end, ceil_page(start, p))
            row[start:fill_end] = row[start - 1] + 1 + np.arange(fill_end - start)
            pos = fill_end
        pages = self.alloc_pages(ceil_page(end, p) // p - ceil_page(pos, p) // p)
        row[pos:end] = (pages[:, None] * p + np.arange(p)).reshape(-1)[: end - pos]

    def decode(self, state, steps: int) -> None:
        """Slots for the next ``steps`` positions of one request (a new page where one starts)."""
        c, p, row = state.committed, self.page_size, state.row
        if p == 1:
            row[c:c + steps] = self.alloc_pages(steps)
            return
        for j in range(c, c + steps):
            row[j] = self.alloc_pages(1)[0] * p if decode_starts_page(j, p) else row[j - 1] + 1

    def decode_batch(self, states: list, k: int) -> None:
        """``k`` decode steps of a batch: slots handed out step by step, in batch order."""
        p, bs = self.page_size, len(states)
        if p == 1:
            slots = self.alloc_pages(k * bs).reshape(k, bs)
            for b, state in enumerate(states):
                state.row[state.committed:state.committed + k] = slots[:, b]
            return
        # a request opens a page at each position that is a multiple of p
        opens = sorted((j, b) for b, st in enumerate(states) for j in range((-st.committed) % p, k, p))
        pages = dict(zip(opens, self.alloc_pages(len(opens)).tolist()))
        for b, state in enumerate(states):
            c, row = state.committed, state.row
            for j in range(k):
                row[c + j] = pages[(j, b)] * p if (c + j) % p == 0 else row[c + j - 1] + 1

    def free(self, state, start: int, end: int) -> None:
        """Free the request's slots ``[start, end)`` (pages they touch, once)."""
        self.free_slots(state.row[start:end])

    def free_evicted(self, freed_tokens: int, values: list[np.ndarray]) -> None:
        """Evicted leaves' slots return to the pool."""
        for v in values:
            self.free_slots(v)

    def adopt(self, state, tree, node, start: int, end: int) -> None:
        """The request's row takes the tree's slots of ``[start, end)`` on the path to ``node``."""
        path = tree.path_value(node)
        assert len(path) == end
        state.row[start:end] = path[start:]

    @staticmethod
    def value(state, end: int) -> np.ndarray:
        """What the tree stores for the request's ``[0, end)``: its slots."""
        return state.row[:end]


class TokenCounter:
    """SGLang's allocator as counts: free tokens and the fewest ever free."""

    tracks_slots = False

    def __init__(self, capacity: int | None, page_size: int) -> None:
        self.page_size = page_size
        self.capacity = UNLIMITED if capacity is None else int(capacity)
        self.avail = self.capacity
        self.min_avail = self.capacity

    def available(self) -> int:
        return self.avail

    @property
    def used_tokens(self) -> int:
        return self.capacity - self.avail

    @property
    def peak_used_tokens(self) -> int:
        return self.capacity - self.min_avail

    def _take(self, tokens: int) -> None:
        self.avail -= tokens
        if self.avail < self.min_avail:
            self.min_avail = self.avail

    def extend(self, state, start: int, end: int) -> None:
        p = self.page_size
        self._take(ceil_page(end, p) - ceil_page(start, p))

    def decode(self, state, steps: int) -> None:
        p, c = self.page_size, state.committed
        if p == 1:
            self._take(steps)
        else:   # a page at each position that is a multiple of p
            self._take(((c + steps - 1) // p - (c - 1) // p) * p)

    def free(self, state, start: int, end: int) -> None:
        self.avail += ceil_page(end - start, self.page_size)

    def free_evicted(self, freed_tokens: int, values: list) -> None:
        self.avail += freed_tokens

    def adopt(self, state, tree, node, start: int, end: int) -> None:
        """No slots to adopt."""

    @staticmethod
    def value(state, end: int) -> None:
        return None
