"""A compiled scanner that finds the messages of chat-log lines without parsing them.

For each line of a chat log (``{"messages": [{...}, {...}], ...}``) :func:`scan_chat_lines`
walks the top-level object and records where the ``messages`` array and each of its
elements sit in the line. The caller keys each element by its raw bytes, so a message
resent turn after turn is parsed, rendered and tokenized once, and reads the rest of the
line (the array cut out) with the ordinary JSON parser and validators.

Each element also gets a 128-bit key (MurmurHash3 x64-128 of its bytes) and each prefix of a
line's messages a key chained from its elements' keys. The scanner keeps the key of every
accepted line's message list (:class:`LineLists`, in :mod:`kvsim.kernels.table`) and gives, for
each line, how many of its first messages an earlier line held, all of them (turn k+1
resends turn k's messages), so that the caller looks that prefix up once and handles only
the messages after it, without hashing the history's bytes in Python. Two different byte
strings get the same key with a chance of about n²/2¹²⁹ for n distinct messages.

The scanner only *accepts* what it can cut exactly: one JSON object whose top-level keys
carry no escapes, holding ``messages`` once as a non-empty array of objects. It does not
validate the elements or the other values: the caller parses each distinct element and the
rest of the line with the JSON parser and hands any line that fails to the general reader,
which also produces the error.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from kvsim.io.readers.token_scan import (BLANK, DECLINED, FAST, _after_member, _is_key, _skip_string, _skip_value, _word, _ws,
                                  as_words, line_bounds)
from kvsim.kernels.table import grow_table, new_table, probe

MESSAGES_KEY = np.frombuffer(b"messages", np.uint8)

_QUOTE, _COMMA, _COLON = 34, 44, 58
_FNV_PRIME = np.uint64(0x100000001B3)
_GOLDEN, _K1, _K2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31, _ONE = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(1)
_ZERO = np.uint64(0)
# MurmurHash3 x64-128's constants
_C1, _C2 = np.uint64(0x87C37B91114253D5), np.uint64(0x4CF5AD432745937F)
_F1, _F2 = np.uint64(0xFF51AFD7ED558CCD), np.uint64(0xC4CEB9FE1A85EC53)
_N1, _N2, _FIVE = np.uint64(0x52DCE729), np.uint64(0x38495AB5), np.uint64(5)
#: columns of ChatScan.elems: byte span, the element's key, the key of the messages up to it
START, END, KEY1, KEY2, PREFIX1, PREFIX2 = range(6)
_LBRACE, _RBRACE, _LBRACKET, _RBRACKET = 123, 125, 91, 93

__all__ = ["BLANK", "DECLINED", "FAST", "ChatScan", "LineLists", "scan_chat_lines"]


@njit(cache=True, inline="always")
def _mix(h):
    """splitmix64's finalizer: every input bit moves every output bit."""
    h = (h ^ (h >> _S30)) * _K1
    h = (h ^ (h >> _S27)) * _K2
    return h ^ (h >> _S31)


@njit(cache=True, inline="always")
def _rotl(x, r):
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@njit(cache=True, inline="always")
def _fmix(k):
    k = (k ^ (k >> np.uint64(33))) * _F1
    k = (k ^ (k >> np.uint64(33))) * _F2
    return k ^ (k >> np.uint64(33))


@njit(cache=True)
def _key(buf, words, a, b, row):
    """A 128-bit key of buf[a:b]: MurmurHash3 x64-128 (seed 0), sixteen bytes a round."""
    h1 = h2 = np.uint64(0)
    i = a
    while i + 16 <= b:
        k1 = _rotl(_word(words, i) * _C1, 31) * _C2
        h1 = (_rotl(h1 ^ k1, 27) + h2) * _FIVE + _N1
        k2 = _rotl(_word(words, i + 8) * _C2, 33) * _C1
        h2 = (_rotl(h2 ^ k2, 31) + h1) * _FIVE + _N2
        i += 16
    k1 = k2 = np.uint64(0)
    for j in range(b - i):  # the last 0-15 bytes
        v = np.uint64(buf[i + j])
        if j < 8:
            k1 |= v << np.uint64(8 * j)
        else:
            k2 |= v << np.uint64(8 * (j - 8))
    h2 ^= _rotl(k2 * _C2, 33) * _C1
    h1 ^= _rotl(k1 * _C1, 31) * _C2
    n = np.uint64(b - a)
    h1 ^= n
    h2 ^= n
    h1 += h2
    h2 += h1
    h1 = _fmix(h1)
    h2 = _fmix(h2)
    h1 += h2
    h2 += h1
    row[KEY1] = np.int64(h1)
    row[KEY2] = np.int64(h2)


@njit(cache=True)
def _messages(buf, words, i, end, elems, epos):
    """Record the elements of the array at buf[i] == '['. Returns (index after ']', new epos),
    or (-1, epos) when it is empty or an element is not an object."""
    i = _ws(buf, i + 1, end)
    while i < end:
        if buf[i] != _LBRACE:
            return -1, epos
        j = _skip_value(buf, words, i, end)  # the ',' or ']' after the element
        if j < 0 or buf[j] == _RBRACE:
            return -1, epos
        last = j - 1
        while buf[last] == 32 or buf[last] == 9 or buf[last] == 13 or buf[last] == 10:
            last -= 1
        if buf[last] != _RBRACE:
            return -1, epos
        row = elems[epos]
        row[START] = i
        row[END] = last + 1
        _key(buf, words, i, last + 1, row)
        epos += 1
        if buf[j] == _RBRACKET:
            return j + 1, epos
        i = _ws(buf, j + 1, end)
    return -1, epos


@njit(cache=True)
def _scan_line(buf, words, start, end, elems, epos, span):
    """Scan one line; span[0:2] is the messages array's byte span. Returns (status, new epos)."""
    span[0] = span[1] = -1
    i = _ws(buf, start, end)
    if i == end:
        return BLANK, epos
    if buf[i] != _LBRACE:
        return DECLINED, epos
    e0 = epos
    i = _ws(buf, i + 1, end)
    while True:
        if i >= end or buf[i] != _QUOTE:
            return DECLINED, e0
        j, escaped = _skip_string(buf, words, i, end)
        if j < 0 or escaped:
            return DECLINED, e0
        ka, kb = i + 1, j - 1
        i = _ws(buf, j, end)
        if i >= end or buf[i] != _COLON:
            return DECLINED, e0
        i = _ws(buf, i + 1, end)
        if i >= end:
            return DECLINED, e0
        if _is_key(buf, ka, kb, MESSAGES_KEY):
            if span[0] >= 0 or buf[i] != _LBRACKET:
                return DECLINED, e0  # repeated key, or not an array
            j, epos = _messages(buf, words, i, end, elems, epos)
            if j < 0:
                return DECLINED, e0
            span[0], span[1] = i, j
            i = j
        elif buf[i] == _QUOTE:
            i, _ = _skip_string(buf, words, i, end)
            if i < 0:
                return DECLINED, e0
        else:
            i = _skip_value(buf, words, i, end)
            if i < 0:
                return DECLINED, e0
        state, i = _after_member(buf, i, end)
        if state < 0:
            return DECLINED, e0
        if state == 0:
            break
    if i != end or span[0] < 0:
        return DECLINED, e0
    return FAST, epos


@njit(cache=True, inline="always")
def _slot(keys, prefix1):
    """The slot of a message list keyed ``prefix1`` (its first key half) in the table of
    :class:`LineLists` (0 is no key there: it is stored as 1)."""
    key = np.uint64(prefix1)
    return probe(keys, key if key != _ZERO else _ONE)


@njit(cache=True, nogil=True)
def scan_chat_lines(buf, words, bounds, status, spans, counts, elems, known, keys, vals, filled):
    """Scan lines ``buf[bounds[k]:bounds[k+1]]``: ``status[k]``, ``spans[k]`` (the messages
    array's start and end), ``counts[k]`` (its elements) and each element's byte span in
    ``elems`` (rows in line order). ``words``: the same bytes as 8-byte words, at least 16
    bytes longer than the lines. ``known[k]``: how many of line k's first messages an
    earlier accepted line held, all of them (``keys``, ``vals``: the :mod:`kvsim.kernels.table`
    of those lines' message lists, ``filled[0]`` of them; room for this block's lines is made
    by the caller).
    Returns the rows written."""
    epos = np.int64(0)  # typed, not a literal 0: numba would compile _scan_line twice
    for k in range(len(bounds) - 1):
        e0 = epos
        status[k], epos = _scan_line(buf, words, bounds[k], bounds[k + 1], elems, epos, spans[k])
        counts[k] = epos - e0
        known[k] = 0
        p1 = p2 = np.uint64(0)
        for r in range(e0, epos):  # prefix keys: chained over the line's elements
            p1 = _mix(p1 * _GOLDEN + np.uint64(elems[r, KEY1]))
            p2 = _mix((p2 ^ np.uint64(elems[r, KEY2])) * _FNV_PRIME + _ONE)
            elems[r, PREFIX1] = np.int64(p1)
            elems[r, PREFIX2] = np.int64(p2)
        if status[k] != FAST:
            continue
        # the longest prefix that was a whole line's list (the table holds the key's second half
        # as the value: two lists whose first halves meet only make the count smaller, and the
        # reader checks the whole key)
        for r in range(epos - 1, e0 - 1, -1):
            s = _slot(keys, elems[r, PREFIX1])
            if keys[s] != _ZERO and vals[s] == elems[r, PREFIX2]:
                known[k] = r - e0 + 1
                break
        s = _slot(keys, elems[epos - 1, PREFIX1])
        if keys[s] == _ZERO:
            key = np.uint64(elems[epos - 1, PREFIX1])
            keys[s] = key if key != _ZERO else _ONE
            vals[s] = elems[epos - 1, PREFIX2]
            filled[0] += 1
    return epos


class LineLists:
    """The keys of the message lists of the lines scanned so far, in a
    :mod:`kvsim.kernels.table` (one per read of a log, used by one scanning thread at a time,
    block after block)."""

    def __init__(self) -> None:
        self.keys, self.vals = new_table(1 << 12)
        self.filled = np.zeros(1, np.int64)

    def room(self, lines: int) -> None:
        """Grow the table (at most half full) for ``lines`` more keys."""
        self.keys, self.vals = grow_table(self.keys, self.vals, int(self.filled[0]) + lines)


class ChatScan:
    """The scan of one block of lines: per-line status, messages span and element spans
    (``elem_offsets[k]:elem_offsets[k+1]`` are line k's rows of ``elems``). ``lists``: the
    message lists of the lines scanned before (those of earlier blocks of the same log)."""

    def __init__(self, block: np.ndarray, lists: LineLists | None = None) -> None:
        lists = LineLists() if lists is None else lists
        self.bounds = bounds = line_bounds(block)
        n = len(bounds) - 1
        self.status = np.empty(n, np.int8)
        self.spans = np.empty((n, 2), np.int64)
        counts = np.empty(n, np.int64)
        known = np.empty(n, np.int64)
        elems = np.empty((int(np.count_nonzero(block == _LBRACE)) + 1, 6), np.int64)  # every element opens a '{'
        words = as_words(block)
        lists.room(n)
        rows = scan_chat_lines(block, words, bounds, self.status, self.spans, counts, elems, known, lists.keys,
                               lists.vals, lists.filled)
        self.elems = elems[:rows]
        self.elem_offsets = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=self.elem_offsets[1:])

        is_bytes = type(block.base) is bytes and len(block.base) == len(block)  # no second copy then
        self.data = block.base if is_bytes else block.tobytes()
        self._bounds = bounds.tolist()
        self._spans = self.spans.tolist()
        self._offsets = self.elem_offsets.tolist()
        self._known = known.tolist()
        self._history = self._histories(known, counts)

    def _histories(self, known: np.ndarray, counts: np.ndarray) -> list[tuple]:
        """What the reader looks at on each line (a few values, not every row): see
        :meth:`history`."""
        rows, firsts = len(self.elems), self.elem_offsets[:-1]
        keys = self.elems if rows else np.zeros((1, 6), np.int64)
        known_rows = np.maximum(firsts + known - 1, 0)
        last_rows = np.maximum(self.elem_offsets[1:] - 1, 0)
        lookup = zip(keys[known_rows, PREFIX1].tolist(), keys[known_rows, PREFIX2].tolist())
        whole = zip(keys[last_rows, PREFIX1].tolist(), keys[last_rows, PREFIX2].tolist())
        line_of = np.repeat(np.arange(len(counts)), counts)
        after = self.elems[np.arange(rows) - firsts[line_of] >= known[line_of], :KEY2 + 1].tolist()
        ends = np.cumsum(counts - known).tolist()
        after_rows = [after[a:b] for a, b in zip([0, *ends], ends)]
        return [*zip(self._known, lookup, after_rows, whole)]

    def span(self, k: int) -> tuple[int, int]:
        """Byte span of line k's messages array (an accepted line)."""
        return self._spans[k]

    def elements(self, k: int) -> list[list[int]]:
        """Each message of line k (an accepted line): its byte span, key and prefix key
        (columns START ... PREFIX2)."""
        return self.elems[self._offsets[k]:self._offsets[k + 1]].tolist()

    def rest(self, k: int) -> bytes:
        """Line k with its messages array replaced by a 0 (an accepted line)."""
        data, bounds, (start, end) = self.data, self._bounds, self._spans[k]
        return data[bounds[k]:start] + b"0" + data[end:bounds[k + 1]]

    def history(self, k: int) -> tuple[int, tuple[int, int], list[list[int]], tuple[int, int]]:
        """What an accepted line k holds of the lines scanned before it: how many of its first
        messages were, all of them, an earlier line's (0 if none: the longest such prefix),
        their key, the messages after them (byte span and key, columns START ... KEY2) and the
        key of all its messages."""
        return self._history[k]

    def first_key(self, k: int, j: int) -> tuple[int, int]:
        """The key of line k's first j messages (j >= 1)."""
        if j == self._known[k]:
            return self._history[k][1]
        row = self._offsets[k] + j - 1
        return int(self.elems[row, PREFIX1]), int(self.elems[row, PREFIX2])

    def __len__(self) -> int:
        return len(self.status)
