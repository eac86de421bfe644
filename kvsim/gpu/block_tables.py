"""Block tables as gpu-validate reads them: page ids from an Admission's table, and a ledger of
what each slot of the pool holds.

:class:`SlotLedger` records, per slot, which token at which position of which request was
written there, so a wrong block table is reported by position before any numbers are
compared. No torch here.
"""
from __future__ import annotations

import numpy as np


class SlotLedger:
    """Which (request, position, token) each slot of the pool holds; -1 where nothing was written."""

    def __init__(self, num_pages: int, page_size: int):
        self.page_size = page_size
        size = num_pages * page_size
        self.token = np.zeros(size, np.int64)
        self.position = np.full(size, -1, np.int64)
        self.request = np.full(size, -1, np.int64)

    def _slots(self, pages: np.ndarray, start: int, end: int) -> np.ndarray:
        pos = np.arange(start, end)
        return pages[pos // self.page_size].astype(np.int64) * self.page_size + pos % self.page_size

    def record(self, pages: np.ndarray, start: int, tokens: np.ndarray, request: int) -> None:
        """Token ``tokens[j]`` at position ``start + j`` of ``request`` was written to its slot."""
        slots = self._slots(pages, start, start + len(tokens))
        self.token[slots] = tokens
        self.position[slots] = np.arange(start, start + len(tokens))
        self.request[slots] = request

    def first_mismatch(self, pages: np.ndarray, tokens: np.ndarray, upto: int) -> tuple[int, str] | None:
        """First position below ``upto`` whose slot does not hold that token at that position."""
        if upto == 0:
            return None
        slots = self._slots(pages, 0, upto)
        bad = (self.position[slots] != np.arange(upto)) | (self.token[slots] != tokens[:upto])
        if not bad.any():
            return None
        p = int(np.argmax(bad))
        s = slots[p]
        if self.position[s] < 0:
            return p, f"slot {s} (page {s // self.page_size}) was never written"
        return p, (f"slot {s} (page {s // self.page_size}) holds position {self.position[s]} of request "
                   f"#{self.request[s]}, a different token or position")

    def writers(self, pages: np.ndarray, upto: int) -> np.ndarray:
        """Requests whose prefill or decode wrote positions ``0..upto-1`` (for the report)."""
        if upto == 0:
            return np.zeros(0, np.int64)
        return np.unique(self.request[self._slots(pages, 0, upto)])


def pages_from_block_table(block_table: np.ndarray, page_size: int, num_tokens: int,
                           token_slots: bool = False) -> np.ndarray:
    """Physical page ids of a request's first ``num_tokens`` tokens, from an Admission's table.

    vLLM APC tables list one block id per ``page_size`` tokens. SGLang's radix tree keeps
    one KV slot index per token (``token_slots``; ``docs/engines/radix.md §2``), pages being runs
    of ``page_size`` aligned slots; such a table is turned into page ids
    (``slot // page_size``) after checking that every token sits at its offset in its page.
    """
    bt = np.asarray(block_table, np.int64)
    need_pages = -(-num_tokens // page_size)
    if token_slots:
        if len(bt) < num_tokens:
            raise ValueError(f"slot table has {len(bt)} slots, fewer than the {num_tokens} tokens")
        slots = bt[:num_tokens]
        pages = slots[::page_size] // page_size
        expected = pages[np.arange(num_tokens) // page_size] * page_size + np.arange(num_tokens) % page_size
        if not np.array_equal(slots, expected):
            raise ValueError("token slot table is not page-aligned: a token does not sit at its offset in its page")
        return pages
    if len(bt) < need_pages:
        raise ValueError(f"block table has {len(bt)} pages, fewer than the {need_pages} that "
                         f"{num_tokens} tokens need at page size {page_size}")
    return bt[:need_pages]
