"""Prompt tokens synthesized from block hash ids (Mooncake, kv-cache-tester traces).

Such traces hold no text: request *i* is a list of ids, one per block of ``B`` tokens, where
an equal id means an equal token prefix up to and including that block. We rebuild token
sequences with exactly that property:

- the ids of one file are renumbered densely (0..D-1, equal ids stay equal), and block id
  ``d`` at position ``j`` becomes token ``base + d*B + j``: equal ids give equal blocks,
  different ids give blocks that differ from their first token on;
- a partial last block that *has* an id (Mooncake: ceil(L/B) ids) keeps its real length,
  ``L - (k-1)*B`` tokens, i.e. the first tokens of that id's block;
- a partial tail *without* an id (kv-cache-tester: floor(L/B) ids) gets fresh tokens above
  every block (``base + D*B + ...``), used once, so it matches nothing.

Ids are local to their file (kv-cache-tester says so: ``hash_id_scope: local``), so every
file gets its own range of token values: two files never share a block by accident.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_CHUNK_TOKENS = 1 << 22  # tokens materialized per step (bounds the int64 temporaries)


@dataclass
class HashIdPrompts:
    """The prompts of one file, as hash ids; tokens are written at build time."""

    block_size: int
    input_lengths: np.ndarray   # int64 (n,)
    id_counts: np.ndarray       # int64 (n,): ids per request
    ids: np.ndarray             # int64: all ids, concatenated
    tail_has_id: bool           # True: the partial last block has an id (Mooncake)

    def __post_init__(self) -> None:
        self._dense: np.ndarray | None = None
        self._num_blocks = 0

    def _dense_ids(self) -> np.ndarray:
        if self._dense is None:
            uniq, inv = np.unique(self.ids, return_inverse=True)
            self._dense, self._num_blocks = inv.astype(np.int64).reshape(-1), len(uniq)
        return self._dense

    def tail_lengths(self) -> np.ndarray:
        """Tokens after the last full block that have no id (zero for Mooncake)."""
        if self.tail_has_id:
            return np.zeros(len(self.input_lengths), np.int64)
        return self.input_lengths - self.id_counts * self.block_size

    def token_range(self) -> int:
        self._dense_ids()
        return self._num_blocks * self.block_size + int(self.tail_lengths().sum())

    def segments(self, base: int) -> tuple[np.ndarray, np.ndarray]:
        """(first token value, length) of every block and tail, in prompt order."""
        B = self.block_size
        dense = self._dense_ids()
        n = len(self.input_lengths)
        seg_start = base + dense * B
        seg_len = np.full(len(dense), B, np.int64)
        ends = np.cumsum(self.id_counts)
        if self.tail_has_id:
            # the last block of each request is cut to the request's real length
            has = self.id_counts > 0
            last = ends[has] - 1
            seg_len[last] = self.input_lengths[has] - (self.id_counts[has] - 1) * B
            return seg_start, seg_len
        tails = self.tail_lengths()
        t_req = np.flatnonzero(tails > 0)
        if t_req.size == 0:
            return seg_start, seg_len
        t_len = tails[t_req]
        t_start = base + self._num_blocks * B + np.concatenate([[0], np.cumsum(t_len)[:-1]])
        # a request's tail follows its blocks: stable sort by (request, tail after blocks)
        block_req = np.repeat(np.arange(n), self.id_counts)
        key = np.concatenate([block_req * 2, t_req * 2 + 1])
        order = np.argsort(key, kind="stable")
        return (np.concatenate([seg_start, t_start])[order],
                np.concatenate([seg_len, t_len])[order])

    def write(self, out: np.ndarray, base: int) -> None:
        starts, lens = self.segments(base)
        assert int(lens.sum()) == len(out), "hash-id segments disagree with the prompt lengths"
        pos, s = 0, 0
        cum = np.cumsum(lens)
        while s < len(lens):
            # take whole segments up to about _CHUNK_TOKENS tokens
            e = max(int(np.searchsorted(cum, (cum[s - 1] if s else 0) + _CHUNK_TOKENS, side="right")), s + 1)
            ln = lens[s:e]
            total = int(ln.sum())
            first = np.zeros(len(ln), np.int64)
            np.cumsum(ln[:-1], out=first[1:])
            # token k of the chunk = start of its segment + (k - first position of the segment)
            vals = np.repeat(starts[s:e] - first, ln)
            vals += np.arange(total, dtype=np.int64)
            out[pos:pos + total] = vals
            pos += total
            s = e
