"""A compiled scanner that reads token-id arrays straight out of JSON lines.

For each line of a pre-tokenized log (``{"prompt_token_ids": [...], "output_token_ids": [...],
...}``) :func:`scan_lines` walks the top-level object, parses the two id arrays into integer
buffers and records where they sit in the line, without building a Python integer per token.
The caller reads the rest of the line (the line with both arrays cut out) with the ordinary
JSON parser and validators, so every other field means exactly what it meant before.

The scanner only *accepts* what it fully understands; anything else is *declined* and read
by the general reader, which also produces the error message. A line is accepted when it is
one JSON object whose top-level keys carry no escapes, holds ``prompt_token_ids`` once as a
non-empty array of plain non-negative integers (at most 18 digits, JSON number syntax) and
``output_token_ids`` at most once as such an array (empty allowed). Nothing here validates
the other values: the JSON parser does that on the rest of the line.
"""
from __future__ import annotations

import numpy as np

from kvsim.kernels.jit import njit

#: per-line outcome
FAST, BLANK, DECLINED = 0, 1, 2
MAX_DIGITS = 18  # every 18-digit integer fits in int64; longer ids go to the general reader
PARALLEL_MIN_BYTES = 1 << 20  # blocks are scanned on several cores in runs of at least this size

PROMPT_KEY = np.frombuffer(b"prompt_token_ids", np.uint8)
OUTPUT_KEY = np.frombuffer(b"output_token_ids", np.uint8)

_QUOTE, _BACKSLASH, _COMMA, _COLON = 34, 92, 44, 58
_U0, _U9, _U10, _U48 = np.uint64(0), np.uint64(9), np.uint64(10), np.uint64(48)
_LBRACE, _RBRACE, _LBRACKET, _RBRACKET = 123, 125, 91, 93
# eight bytes at once: a byte equal to '"' or '\\' (SWAR zero-byte test)
_ONES, _HIGHS = np.uint64(0x0101010101010101), np.uint64(0x8080808080808080)
_QUOTES, _BACKSLASHES = np.uint64(0x2222222222222222), np.uint64(0x5C5C5C5C5C5C5C5C)
_U3, _U64 = np.uint64(3), np.uint64(64)


@njit(cache=True, inline="always")
def _ws(buf, i, end):
    """Index of the first non-JSON-whitespace byte at or after i."""
    while i < end:
        c = buf[i]
        if c == 32 or c == 9 or c == 13 or c == 10:
            i += 1
        else:
            break
    return i


@njit(cache=True, inline="always")
def _after_member(buf, i, end):
    """Past an object member's value: (1, next member) at a comma, (0, past the object) at
    its closing brace, (-1, i) at anything else."""
    i = _ws(buf, i, end)
    if i < end and buf[i] == _COMMA:
        return 1, _ws(buf, i + 1, end)
    if i < end and buf[i] == _RBRACE:
        return 0, _ws(buf, i + 1, end)
    return -1, i


@njit(cache=True, inline="always")
def _word(words, i):
    """The eight bytes at byte offset i (any alignment) as a little-endian integer, from the
    8-byte words of the same buffer (which extends at least 8 bytes past i + 8)."""
    q = i >> 3
    shift = np.uint64(i & 7) << _U3
    if shift == 0:
        return words[q]
    return (words[q] >> shift) | (words[q + 1] << (_U64 - shift))


@njit(cache=True, inline="always")
def _plain8(words, i):
    """Do the eight bytes at i hold no '"' and no backslash? (SWAR zero-byte test)"""
    w = _word(words, i)
    x, y = w ^ _QUOTES, w ^ _BACKSLASHES
    return (((x - _ONES) & ~x) | ((y - _ONES) & ~y)) & _HIGHS == 0


@njit(cache=True)
def _skip_string(buf, words, i, end):
    """buf[i] is a quote: (index after the closing quote or -1, whether it holds a backslash).
    ``words``: the same bytes as 8-byte words (16 bytes longer), to skip eight bytes at a time
    where they hold neither a quote nor a backslash; None: byte by byte."""
    i += 1
    escaped = False
    while i < end:
        if words is not None:
            if i + 8 <= end and _plain8(words, i):
                i += 8
                continue
        c = buf[i]
        if c == _BACKSLASH:
            escaped = True
            i += 2
            continue
        if c == _QUOTE:
            return i + 1, escaped
        i += 1
    return -1, escaped


@njit(cache=True)
def _skip_value(buf, words, i, end):
    """Skip a non-string value; return the index of the ',' or '}' that ends it, or -1
    (``words`` as for :func:`_skip_string`)."""
    depth = 0
    while i < end:
        c = buf[i]
        if c == _QUOTE:
            j, _ = _skip_string(buf, words, i, end)
            if j < 0:
                return -1
            i = j
            continue
        if c == _LBRACE or c == _LBRACKET:
            depth += 1
        elif c == _RBRACE or c == _RBRACKET:
            if depth == 0:
                return i
            depth -= 1
        elif c == _COMMA and depth == 0:
            return i
        i += 1
    return -1


def as_words(block: np.ndarray) -> np.ndarray:
    """A copy of ``block`` as 8-byte words, 16 bytes or more to spare (for ``words`` above)."""
    words = np.empty(len(block) // 8 + 3, np.uint64)
    raw = words.view(np.uint8)
    raw[:len(block)] = block
    raw[len(block):] = 0
    return words


@njit(cache=True)
def _parse_ids(buf, i, end, out, pos, allow_empty):
    """Parse the id array at buf[i] == '['. Returns (index after ']', new pos, max id), or
    (-1, pos, 0) when the array is not plain non-negative integers."""
    i = _ws(buf, i + 1, end)
    top = _U0
    if i < end and buf[i] == _RBRACKET:
        if allow_empty:
            return i + 1, pos, 0
        return -1, pos, 0
    while i < end:
        first = i
        d = np.uint64(buf[i]) - _U48  # wraps around below '0': one comparison per byte
        if d > _U9:
            return -1, pos, 0
        v = d
        i += 1
        while i < end:
            d = np.uint64(buf[i]) - _U48
            if d > _U9:
                break
            v = v * _U10 + d
            i += 1
        n = i - first
        if n > MAX_DIGITS or (n > 1 and buf[first] == 48):
            return -1, pos, 0  # too long for int64, or a leading zero (not JSON)
        out[pos] = v
        pos += 1
        top = max(top, v)
        if i < end and buf[i] == _COMMA:  # the common case: no whitespace around the comma
            i += 1
            if i < end and buf[i] > 32:   # not JSON whitespace (all of it is <= 32): the next id
                continue
            i = _ws(buf, i, end)
            continue
        i = _ws(buf, i, end)
        if i >= end:
            return -1, pos, 0
        c = buf[i]
        if c == _COMMA:
            i = _ws(buf, i + 1, end)
        elif c == _RBRACKET:
            return i + 1, pos, np.int64(top)
        else:
            return -1, pos, 0
    return -1, pos, 0


@njit(cache=True, inline="always")
def _is_key(buf, a, b, key):
    if b - a != len(key):
        return False
    for k in range(len(key)):
        if buf[a + k] != key[k]:
            return False
    return True


@njit(cache=True)
def _scan_line(buf, start, end, tokens, tpos, outs, opos, spans):
    """Scan one line; fills spans[0:4] (prompt / output array byte spans, -1 if absent).
    Returns (status, new tpos, new opos, max id)."""
    spans[0] = spans[1] = spans[2] = spans[3] = -1
    i = _ws(buf, start, end)
    if i == end:
        return BLANK, tpos, opos, 0
    if buf[i] != _LBRACE:
        return DECLINED, tpos, opos, 0
    t0, o0 = tpos, opos
    top = 0
    i = _ws(buf, i + 1, end)
    if i < end and buf[i] == _RBRACE:
        return DECLINED, t0, o0, 0  # no prompt_token_ids
    while True:
        if i >= end or buf[i] != _QUOTE:
            return DECLINED, t0, o0, 0
        j, escaped = _skip_string(buf, None, i, end)
        if j < 0 or escaped:
            return DECLINED, t0, o0, 0
        ka, kb = i + 1, j - 1
        i = _ws(buf, j, end)
        if i >= end or buf[i] != _COLON:
            return DECLINED, t0, o0, 0
        i = _ws(buf, i + 1, end)
        if i >= end:
            return DECLINED, t0, o0, 0
        is_prompt = _is_key(buf, ka, kb, PROMPT_KEY)
        if is_prompt or _is_key(buf, ka, kb, OUTPUT_KEY):
            slot = 0 if is_prompt else 2
            if spans[slot] >= 0 or buf[i] != _LBRACKET:
                return DECLINED, t0, o0, 0  # repeated key, or not an array
            if is_prompt:
                j, tpos, m = _parse_ids(buf, i, end, tokens, tpos, slot == 2)
            else:
                j, opos, m = _parse_ids(buf, i, end, outs, opos, slot == 2)
            if j < 0:
                return DECLINED, t0, o0, 0
            if m > top:
                top = m
            spans[slot], spans[slot + 1] = i, j
            i = j
        elif buf[i] == _QUOTE:
            i, _ = _skip_string(buf, None, i, end)
            if i < 0:
                return DECLINED, t0, o0, 0
        else:
            i = _skip_value(buf, None, i, end)
            if i < 0:
                return DECLINED, t0, o0, 0
        state, i = _after_member(buf, i, end)
        if state < 0:
            return DECLINED, t0, o0, 0
        if state == 0:
            break
    if i != end or spans[0] < 0:
        return DECLINED, t0, o0, 0
    return FAST, tpos, opos, top


@njit(cache=True, nogil=True)
def scan_lines(buf, bounds, tokens, outs, status, spans, counts):
    """Scan lines ``buf[bounds[k]:bounds[k+1]]``.

    Writes accepted prompt ids to ``tokens`` and output ids to ``outs`` (concatenated, in line
    order), ``status[k]``, ``spans[k]`` (prompt start, end, output start, end) and
    ``counts[k]`` (prompt ids, output ids). Returns (ids in tokens, ids in outs, max id).
    """
    # typed zeros, not literals: a literal argument makes numba compile the callee once more
    tpos = np.int64(0)
    opos = np.int64(0)
    top = 0
    for k in range(len(bounds) - 1):
        t0, o0 = tpos, opos
        st, tpos, opos, m = _scan_line(buf, bounds[k], bounds[k + 1], tokens, tpos, outs, opos, spans[k])
        status[k] = st
        counts[k, 0] = tpos - t0
        counts[k, 1] = opos - o0
        if m > top:
            top = m
    return tpos, opos, top


_NEWLINES = np.uint64(0x0A0A0A0A0A0A0A0A)


@njit(cache=True, inline="always")
def _newline_in(w):
    """Does the 8-byte word hold a newline? (SWAR zero-byte test)"""
    x = w ^ _NEWLINES
    return ((x - _ONES) & ~x & _HIGHS) != 0


@njit(cache=True, nogil=True)
def line_bounds(buf):
    """Start of every line of ``buf`` plus len(buf): line k is buf[b[k]:b[k+1]], newline included."""
    n = len(buf)
    m = n - (n & 7)
    words = buf[:m].view(np.uint64)  # eight bytes at a time where they hold no newline
    count = 0
    for q in range(len(words)):
        if _newline_in(words[q]):
            for i in range(8 * q, 8 * q + 8):
                count += buf[i] == 10
    for i in range(m, n):
        count += buf[i] == 10
    if n > 0 and buf[n - 1] != 10:
        count += 1  # a last line without a newline
    out = np.empty(count + 1, np.int64)
    out[0] = 0
    k = 1
    for q in range(len(words)):
        if _newline_in(words[q]):
            for i in range(8 * q, 8 * q + 8):
                if buf[i] == 10:
                    out[k] = i + 1
                    k += 1
    for i in range(m, n):
        if buf[i] == 10:
            out[k] = i + 1
            k += 1
    out[count] = n
    return out


class ScannedBlock:
    """The scan of one block of lines: per-line status, array spans and id counts, and the
    accepted ids (prompt ids in ``tokens``, output ids in ``outputs``, in line order).

    A large block is cut into runs of lines scanned at the same time on several cores (the
    compiled scanner releases the GIL)."""

    def __init__(self, block: np.ndarray, scratch: "Scratch", parts: int | None = None) -> None:
        from kvsim.io.workers import executor, workers

        self.bounds = bounds = line_bounds(block)
        n = len(bounds) - 1
        self.status = np.empty(n, np.int8)
        self.spans = np.empty((n, 4), np.int64)
        counts = np.empty((n, 2), np.int64)
        k = parts or max(1, min(workers(), len(block) // PARALLEL_MIN_BYTES))
        cuts = np.unique(np.searchsorted(bounds, [len(block) * j // k for j in range(1, k)]).clip(0, n))
        lines = [(int(a), int(b)) for a, b in zip([0, *cuts], [*cuts, n]) if b > a]
        caps = [int(bounds[b] - bounds[a]) // 2 + 1 for a, b in lines]  # most ids a run can hold
        tokens, outs = scratch.buffers(sum(caps))
        starts = np.concatenate([[0], np.cumsum(caps)]).astype(int)

        def scan(j: int):
            (a, b), lo, hi = lines[j], starts[j], starts[j + 1]
            return scan_lines(block, bounds[a:b + 1], tokens[lo:hi], outs[lo:hi], self.status[a:b],
                              self.spans[a:b], counts[a:b])

        found = list(executor().map(scan, range(len(lines)))) if len(lines) > 1 else [scan(0)] if lines else []
        top = max((t for _, _, t in found), default=0)
        dtype = np.int32 if top < 2**31 else np.int64
        self.tokens = _joined(tokens, starts, [nt for nt, _, _ in found], dtype)
        self.outputs = _joined(outs, starts, [no for _, no, _ in found], dtype)
        self.token_offsets = np.zeros(n + 1, np.int64)
        np.cumsum(counts[:, 0], out=self.token_offsets[1:])
        self.output_offsets = np.zeros(n + 1, np.int64)
        np.cumsum(counts[:, 1], out=self.output_offsets[1:])

    def __len__(self) -> int:
        return len(self.status)


def _joined(scratch: np.ndarray, starts, counts: list[int], dtype) -> np.ndarray:
    """The runs' ids (``counts[j]`` from ``starts[j]`` of ``scratch``) in one array of ``dtype``
    (one copy, converting as it goes)."""
    out = np.empty(sum(counts), dtype)
    pos = 0
    for lo, n in zip(starts, counts):
        out[pos:pos + n] = scratch[lo:lo + n]
        pos += n
    return out


class Scratch:
    """int64 buffers the scanner writes into, reused from block to block."""

    def __init__(self) -> None:
        self._tokens = np.empty(0, np.int64)
        self._outs = np.empty(0, np.int64)

    def buffers(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self._tokens) < size:
            self._tokens = np.empty(size, np.int64)
            self._outs = np.empty(size, np.int64)
        return self._tokens, self._outs
