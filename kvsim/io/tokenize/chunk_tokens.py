"""cl100k text in bulk without compiled code: each distinct ASCII chunk encoded once.

tiktoken cuts ordinary text with its pattern and byte-pair encodes each match on its own. In
cl100k's pattern no match holds an ASCII letter followed by an ASCII non-letter (a match
holding a letter ends at the first non-letter after it: ``\\p{L}++``, the contractions), and no
alternative looks behind, so an ASCII text cut after each letter that a non-letter follows
encodes as its chunks' encodings one after another (the same argument as
:mod:`kvsim.io.tokenize.word_scan`'s cuts). A log repeats its vocabulary, so few of a batch's
chunks are new: :class:`ChunkTokens` finds the chunks and their distinct values with numpy
(a chunk of at most 16 bytes is its bytes, packed into two 64-bit words; longer ones are
looked up by their bytes), asks tiktoken for the chunks it has not seen, and assembles every
text from its chunks' ids. Texts that are not ASCII, or hold a NUL or the first character of a
special token, are left to the caller. The ids equal ``encode(text, allowed_special="all")``
(``tests/test_io_word_tokens.py``).

This is the numba-free counterpart of :mod:`kvsim.io.tokenize.word_tokens`: it splits less
finely (a chunk may hold several words) and holds the GIL for the new chunks only.
"""
from __future__ import annotations

import threading
from typing import Callable, Sequence

import numpy as np

#: tiktoken's cl100k_base pattern, the one this module and :mod:`kvsim.io.tokenize.word_scan`
#: rely on
CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
                  r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
#: the low k bytes of a little-endian 64-bit word
_MASK = np.array([(1 << (8 * k)) - 1 for k in range(8)] + [(1 << 64) - 1], np.uint64)
_MIX = np.uint64(0x9E3779B97F4A7C15)
#: distinct chunks kept; beyond it the ones seen so far are forgotten
MAX_CHUNKS = 1 << 20


class ChunkTokens:
    """The ids of every distinct chunk seen, for one tiktoken encoding of cl100k's pattern."""

    @staticmethod
    def usable(enc) -> bool:
        """Does this encoding cut text as cl100k does (and fit its ids in int32)?"""
        return enc._pat_str == CL100K_PATTERN and enc.n_vocab <= 2**31

    def __init__(self, enc, special_ids: dict[str, int]) -> None:
        self._enc = enc
        self._firsts = tuple({s[0] for s in special_ids if s} | {"\x00"})
        # a special token none of the chunks holds (they hold no first character of one)
        self._sep, self._sep_id = min(special_ids.items(), key=lambda kv: kv[1]) if special_ids else (None, None)
        self._lock = threading.Lock()
        self._forget()

    def _forget(self) -> None:
        self._keys = np.zeros(0, np.uint64)    # short chunks' keys, sorted, and for each
        self._words = np.zeros((0, 2), np.uint64)  # its two words (to check that a key is the chunk)
        self._entry = np.zeros(0, np.int64)    # its entry
        self._long: dict[bytes, int] = {}      # longer chunks' entries
        self._ids = np.zeros(1 << 12, np.int32)    # every entry's ids: entry e is ids[starts[e]:starts[e + 1]]
        self._starts = np.zeros(1, np.int64)

    def usable_text(self, text: str) -> bool:
        """Can this text be encoded here (ASCII, no NUL, no character that starts a special token)?"""
        return text.isascii() and not any(c in text for c in self._firsts)

    def encode(self, texts: Sequence[str], fallback: Callable[[Sequence[str]], list[np.ndarray]]) -> list[np.ndarray]:
        """Token ids of each text (int32); ``fallback`` encodes the texts this class does not
        (and every text, should two chunks' keys meet)."""
        usable = [self.usable_text(t) for t in texts]
        here = [i for i, u in enumerate(usable) if u]
        out: list = [None] * len(texts)
        if len(here) < len(texts):
            rest = [i for i, u in enumerate(usable) if not u]
            for i, a in zip(rest, fallback([texts[i] for i in rest])):
                out[i] = a
        if here:
            done = self._encode_ascii([texts[i] for i in here])
            if done is None:
                done = fallback([texts[i] for i in here])
            for i, a in zip(here, done):
                out[i] = a
        return out

    def _encode_ascii(self, texts: list[str]) -> list[np.ndarray] | None:
        data = "".join(texts).encode("ascii")
        n = len(data)
        if n == 0:
            return [np.zeros(0, np.int32) for _ in texts]
        buf = np.frombuffer(data + bytes(16), np.uint8)
        text_ends = np.cumsum([len(t) for t in texts], dtype=np.int64)
        letter = np.bitwise_or(buf[:n], 0x20)  # A-Z to a-z, and no other byte to a letter
        letter -= 97
        letter = letter < 26  # (uint8: below 'a' wraps around)
        # chunk starts: every text's start, and after each letter that a non-letter follows
        is_start = np.zeros(n, bool)
        np.greater(letter[:-1], letter[1:], out=is_start[1:])
        is_start[text_ends[:-1][text_ends[:-1] < n]] = True
        is_start[0] = True
        starts = np.flatnonzero(is_start)
        ends = np.empty_like(starts)
        ends[:-1] = starts[1:]
        ends[-1] = n
        inner = np.searchsorted(text_ends, starts, side="right")  # the text of each chunk
        np.minimum(ends, text_ends[inner], out=ends)
        lengths = ends - starts
        windows = np.lib.stride_tricks.as_strided(buf, shape=(n, 16), strides=(1, 1))[starts]
        words = np.ascontiguousarray(windows).view(np.uint64)  # (chunks, 2), little-endian
        short = lengths <= 16
        words[:, 0] &= _MASK[np.minimum(lengths, 8)]
        words[:, 1] &= _MASK[np.clip(lengths - 8, 0, 8)]
        keys = words[:, 0] ^ (words[:, 1] * _MIX)
        with self._lock:
            if len(self._starts) > MAX_CHUNKS:
                self._forget()
            entry = self._entries(keys, words, short, data, starts, ends)
            if entry is None:
                self._forget()
                return None
            ids, id_starts = self._ids, self._starts
        begin = id_starts[entry]
        sizes = id_starts[entry + 1] - begin
        total = int(sizes.sum())
        offsets = np.cumsum(sizes)
        index = np.repeat(begin - (offsets - sizes), sizes)
        index += np.arange(total, dtype=np.int64)
        tokens = ids[index]
        # each text's ids end where its last chunk's do (an empty text has no chunk)
        last_chunk = np.searchsorted(inner, np.arange(len(texts)), side="right") - 1
        bounds = np.where(last_chunk >= 0, offsets[np.maximum(last_chunk, 0)], 0).tolist()
        return [tokens[a:b] for a, b in zip([0, *bounds[:-1]], bounds)]

    def _entries(self, keys, words, short, data: bytes, starts, ends) -> np.ndarray | None:
        """The entry of every chunk (new chunks encoded and added); None if two chunks' keys meet."""
        entry = np.empty(len(keys), np.int64)
        s_idx = np.flatnonzero(short)
        s_keys = keys[s_idx]
        order = np.argsort(s_keys)  # (searching sorted keys is about twice as fast)
        pos = np.empty(len(s_keys), np.int64)
        pos[order] = np.searchsorted(self._keys, s_keys[order])
        np.minimum(pos, max(len(self._keys) - 1, 0), out=pos)
        known = (self._keys[pos] == s_keys) if len(self._keys) else np.zeros(len(s_idx), bool)
        if not np.array_equal(self._words[pos[known]], words[s_idx[known]]):
            return None  # a chunk with the key of another
        entry[s_idx[known]] = self._entry[pos[known]]
        miss = s_idx[~known]
        uniq, first, inverse = np.unique(keys[miss], return_index=True, return_inverse=True)
        rep = miss[first]
        if not np.array_equal(words[rep[inverse]], words[miss]):
            return None
        texts = [data[a:b].decode("ascii") for a, b in zip(starts[rep].tolist(), ends[rep].tolist())]
        long_idx = np.flatnonzero(~short)
        long_bytes = [data[a:b] for a, b in zip(starts[long_idx].tolist(), ends[long_idx].tolist())]
        long_new = list(dict.fromkeys(b for b in long_bytes if b not in self._long))
        first_new = len(self._starts) - 1
        self._add([*texts, *(b.decode("ascii") for b in long_new)])
        u_entry = first_new + np.arange(len(uniq))
        entry[miss] = u_entry[inverse]
        for k, b in enumerate(long_new):
            self._long[b] = first_new + len(uniq) + k
        if len(long_idx):
            entry[long_idx] = [self._long[b] for b in long_bytes]
        if len(uniq):
            keys_all = np.concatenate([self._keys, uniq])
            order = np.argsort(keys_all, kind="stable")
            self._keys = keys_all[order]
            self._words = np.concatenate([self._words, words[rep]])[order]
            self._entry = np.concatenate([self._entry, u_entry])[order]
        return entry

    def _add(self, chunks: list[str]) -> None:
        """Encode new chunks (each on its own: joined at a special token tiktoken cuts at) and
        store their ids as the next entries."""
        if not chunks:
            return
        ids = None
        if self._sep is not None and len(chunks) > 1:
            joined = self._enc.encode_to_numpy(self._sep.join(chunks), allowed_special="all").view(np.int32)
            cut = np.flatnonzero(joined == self._sep_id)
            if len(cut) == len(chunks) - 1:
                ids = np.delete(joined, cut)
                lengths = np.diff(cut, prepend=-1, append=len(joined)) - 1
        if ids is None:
            arrays = [self._enc.encode_to_numpy(c, allowed_special="all").view(np.int32) for c in chunks]
            ids = np.concatenate(arrays)
            lengths = np.fromiter(map(len, arrays), np.int64, count=len(arrays))
        end = int(self._starts[-1])
        need = end + len(ids)
        if need > len(self._ids):
            grown = np.zeros(max(need, 2 * len(self._ids)), np.int32)
            grown[:end] = self._ids[:end]
            self._ids = grown
        self._ids[end:need] = ids
        self._starts = np.concatenate([self._starts, end + np.cumsum(lengths)])
