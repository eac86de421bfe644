"""tiktoken's cl100k encoding, each distinct word byte-pair encoded once.

tiktoken spends most of its time splitting text with its pattern and encoding the same words
again and again: a log repeats its vocabulary. :class:`WordTokens` splits texts in compiled
code (:mod:`kvsim.io.tokenize.word_scan`), asks tiktoken for the tokens of each word it has not seen
(``encode_single_piece``: what tiktoken does to each match), and assembles every text from
its words' tokens. Pieces holding non-ASCII characters are encoded by tiktoken itself. The
ids equal ``encode(text, allowed_special="all")`` (``tests/test_io_word_tokens.py``).
"""
from __future__ import annotations

import threading
from itertools import chain
from typing import Callable, Sequence

import numpy as np

from kvsim.io.tokenize.chunk_tokens import CL100K_PATTERN
from kvsim.io.tokenize.word_scan import CLASH, DONE, FULL, ITEMS, SPANS, WORDS, assemble, split_words
from kvsim.kernels.table import grow_table, new_table

#: distinct words kept; beyond it the words seen so far are forgotten
MAX_WORDS = 1 << 20


class WordTokens:
    """The tokens of every distinct word seen, for one tiktoken encoding of cl100k's pattern."""

    def __init__(self, enc, special_ids: dict[str, int]) -> None:
        self._piece = enc._core_bpe.encode_single_piece
        ordered = sorted((s.encode("utf-8"), i) for s, i in special_ids.items())
        self._sp_bytes = np.frombuffer(b"".join(s for s, _ in ordered) or b"\0", np.uint8)
        self._sp_starts = np.cumsum([0, *(len(s) for s, _ in ordered)], dtype=np.int64)
        self._sp_ids = np.array([i for _, i in ordered] or [0], np.int64)
        self._sp_first = np.zeros(256, np.bool_)
        for s, _ in ordered:
            self._sp_first[s[0]] = True
        self._lock = threading.Lock()
        self._forget()

    @staticmethod
    def usable(enc, special_ids: dict[str, int]) -> bool:
        """Does :mod:`kvsim.io.tokenize.word_scan` split text as this encoding does?"""
        from kvsim.io.tokenize.tokenizers import overlap_free

        return (enc._pat_str == CL100K_PATTERN and enc.n_vocab <= 2**31 and overlap_free(tuple(special_ids))
                and all(s and 0 <= i < 2**30 - 1 for s, i in special_ids.items()))

    def _forget(self) -> None:
        self._keys, self._vals = new_table(1 << 14, np.int32)
        self._wbytes = np.empty(1 << 16, np.uint8)
        self._wstarts = np.zeros(1 << 13, np.int64)
        self._wtok = np.empty(1 << 14, np.int32)
        self._wtstarts = np.zeros(1 << 13, np.int64)  # the first `known` words have their tokens
        self._state = np.zeros(3, np.int64)
        self._known = 0

    def encode(self, texts: Sequence[str], fallback: Callable[[Sequence[str]], list[np.ndarray]]) -> list[np.ndarray]:
        """Token ids of each text (int32); ``fallback`` encodes the foreign spans (and every
        text, on a clash of two words' keys)."""
        raw = [t.encode("utf-8", "surrogatepass") for t in texts]
        data = np.frombuffer(b"".join(raw) or b"\0", np.uint8)
        bounds = np.cumsum([0, *map(len, raw)], dtype=np.int64)
        with self._lock:
            if self._known > MAX_WORDS:
                self._forget()
            cut = self._split(data, bounds)
            # the words' tokens are only appended to, or the arrays replaced: these stay valid
            wtok, wtstarts = self._wtok, self._wtstarts
        if cut is None:
            return fallback(texts)
        items, text_ends, spans = cut
        foreign = fallback([data[s:e].tobytes().decode("utf-8", "surrogatepass") for s, e in spans])
        fstarts = np.cumsum([0, *map(len, foreign)], dtype=np.int64)
        ftok = np.concatenate(foreign).astype(np.int32, copy=False) if foreign else np.zeros(0, np.int32)
        out, offsets = assemble(items, text_ends, wtok, wtstarts, ftok, fstarts)
        return [out[offsets[i]:offsets[i + 1]] for i in range(len(texts))]

    def _split(self, data: np.ndarray, bounds: np.ndarray):
        """Items of every text, where each text's items end, and the foreign spans' byte
        spans; None on a clash (the words seen are then forgotten)."""
        n = len(bounds) - 1
        items = np.empty(len(data) + 1, np.int32)
        text_ends = np.zeros(n, np.int64)
        foreign = np.empty((16, 2), np.int64)
        state = self._state
        state[ITEMS] = state[SPANS] = 0
        done = 0
        while True:
            done, status = split_words(data, bounds, done, self._sp_bytes, self._sp_starts, self._sp_ids,
                                       self._sp_first, self._keys, self._vals, self._wbytes, self._wstarts, state,
                                       items, text_ends, foreign)
            if status == DONE:
                break
            if status == CLASH:
                self._forget()
                return None
            if status == FULL:
                foreign = _grown(foreign, 2 * len(foreign))
                continue
            need = int(bounds[done + 1] - bounds[done])  # the text that did not fit, at most one word per byte
            words = int(state[WORDS])
            self._keys, self._vals = grow_table(self._keys, self._vals, words + need)
            self._wbytes = _grown(self._wbytes, int(self._wstarts[words]) + need)
            self._wstarts = _grown(self._wstarts, words + need + 1)
        self._learn()
        return items, text_ends, foreign[:state[SPANS]]

    def _learn(self) -> None:
        """Ask tiktoken for the tokens of the words new since the last call."""
        first, stop = self._known, int(self._state[WORDS])
        if stop == first:
            return
        wbytes, wstarts = self._wbytes, self._wstarts
        piece = self._piece
        encoded = [piece(wbytes[wstarts[w]:wstarts[w + 1]].tobytes()) for w in range(first, stop)]
        lengths = np.fromiter(map(len, encoded), np.int64, count=len(encoded))
        end = int(self._wtstarts[first])
        self._wtstarts = _grown(self._wtstarts, stop + 1)
        self._wtstarts[first + 1:stop + 1] = end + np.cumsum(lengths)
        total = int(self._wtstarts[stop])
        self._wtok = _grown(self._wtok, total)
        self._wtok[end:total] = np.fromiter(chain.from_iterable(encoded), np.int64, count=total - end)
        self._known = stop


def _grown(a: np.ndarray, need: int) -> np.ndarray:
    """``a``, or a copy at least twice as long when it is shorter than ``need``."""
    if len(a) >= need:
        return a
    size = max(need, 2 * len(a))
    b = np.zeros((size, *a.shape[1:]), a.dtype)
    b[:len(a)] = a
    return b
