r"""Compiled cutting of text into the words of tiktoken's cl100k pattern.

tiktoken encodes a text by cutting it at its special tokens, splitting each run of ordinary
text between them with the encoding's pattern, for cl100k_base::

    '(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s

and byte-pair encoding each match (a *word*) on its own. A word's tokens depend on its bytes
only, so :class:`~kvsim.io.tokenize.word_tokens.WordTokens` asks tiktoken once per distinct word. This
module does the cutting, in one pass over the UTF-8 bytes:

* special tokens are found as tiktoken finds them: the leftmost one (the set is overlap-free,
  so at most one starts at a place);
* ASCII text is split by :func:`_word_end`, the pattern written out for ASCII characters
  (letters, digits, the six whitespace characters of Unicode's White_Space, the rest);
* a run holding any other character is cut into pieces (:func:`_safe_cut`) after a newline
  that an ASCII non-whitespace character follows, and between an ASCII letter and an ASCII
  non-letter. No word spans such a cut (only whitespace and the newlines after punctuation
  can follow a newline in a word; a word holding a letter ends at the first non-letter after
  it), the text before it ends in the same word alone (the whitespace before the newline is
  ``\s*[\r\n]`` there, ``\s++$`` alone), and matching after it never looks back. A piece
  holding a non-ASCII character is *foreign*: tiktoken encodes it.

Words get a handle the first time they are seen, in a table of their bytes
(:mod:`kvsim.kernels.table`, keys FNV-1a of the bytes, a clash checked byte for byte).
``tests/test_io_word_tokens.py`` checks the whole against tiktoken on any text.
"""
from __future__ import annotations

import numpy as np

from kvsim.kernels.jit import njit
from kvsim.kernels.table import probe

#: items: a word's handle (>= 0), a special token (-1 - id) or a foreign span (FOREIGN - index)
FOREIGN = -(1 << 30)
#: split_words' status: done, out of room for words, for foreign spans, two words' keys clash
DONE, ROOM, FULL, CLASH = 0, 1, 2, 3
#: state: words so far, items used, foreign spans used
WORDS, ITEMS, SPANS = 0, 1, 2

_LETTER, _DIGIT, _SPACE, _OTHER, _HIGH = 0, 1, 2, 3, 4
_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


def _classes() -> np.ndarray:
    """Each byte's class. Whitespace is Unicode's White_Space (what the pattern's ``\\s``
    means): tab to carriage return and space, not the separators 0x1c-0x1f."""
    classes = np.full(256, _HIGH, np.uint8)
    for b in range(128):
        ch = chr(b)
        classes[b] = (_LETTER if ch.isalpha() else _DIGIT if ch.isdigit()
                      else _SPACE if b in (9, 10, 11, 12, 13, 32) else _OTHER)
    return classes


_CLASS = _classes()


@njit(cache=True, inline="always")
def _newline(b):
    return b == 10 or b == 13


@njit(cache=True)
def _word_end(data, i, end):
    """End of the word that starts at ``i`` in the ASCII text ``data[:end]`` (the pattern's
    alternatives in order; the first that matches wins)."""
    c = data[i]
    k = _CLASS[c]
    if c == 39 and i + 1 < end:  # '(?i:[sdmt]|ll|ve|re)   (x | 32 lowers an ASCII letter)
        a = data[i + 1] | 32
        if a == 115 or a == 100 or a == 109 or a == 116:
            return i + 2
        if i + 2 < end:
            b = data[i + 2] | 32
            if (a == 108 and b == 108) or (a == 118 and b == 101) or (a == 114 and b == 101):
                return i + 3
    if k == _LETTER or (k != _DIGIT and not _newline(c) and i + 1 < end and _CLASS[data[i + 1]] == _LETTER):
        j = i + 1  # [^\r\n\p{L}\p{N}]?+\p{L}++
        while j < end and _CLASS[data[j]] == _LETTER:
            j += 1
        return j
    if k == _DIGIT:  # \p{N}{1,3}+
        j = i + 1
        while j < end and j < i + 3 and _CLASS[data[j]] == _DIGIT:
            j += 1
        return j
    j = i + 1 if c == 32 and i + 1 < end and _CLASS[data[i + 1]] == _OTHER else i
    if _CLASS[data[j]] == _OTHER:  # ' ?[^\s\p{L}\p{N}]++[\r\n]*+'
        j += 1
        while j < end and _CLASS[data[j]] == _OTHER:
            j += 1
        while j < end and _newline(data[j]):
            j += 1
        return j
    r = i + 1  # whitespace: the run is data[i:r]
    while r < end and _CLASS[data[r]] == _SPACE:
        r += 1
    if r == end:  # \s++$
        return end
    for m in range(r - 1, i - 1, -1):  # \s*[\r\n]: up to the run's last newline
        if _newline(data[m]):
            return m + 1
    if r - i >= 2:  # \s+(?!\S): all but the last, which goes with what follows
        return r - 1
    return i + 1  # \s


@njit(cache=True)
def _special_at(data, p, end, sp_bytes, sp_starts):
    """Index of the special token (sorted by bytes) that ``data[p:end]`` starts with, or -1.
    The last special <= the text is the only candidate: one between it and the text would
    start with it, and the set is overlap-free."""
    lo, hi = 0, len(sp_starts) - 1  # find the last special <= the text
    while lo < hi:
        mid = (lo + hi) // 2
        s0, s1 = sp_starts[mid], sp_starts[mid + 1]
        order = 0
        for t in range(s1 - s0):
            if p + t >= end:
                order = 1
                break
            x, y = sp_bytes[s0 + t], data[p + t]
            if x != y:
                order = -1 if x < y else 1
                break
        if order <= 0:
            lo = mid + 1
        else:
            hi = mid
    k = lo - 1
    if k < 0:
        return -1
    s0, s1 = sp_starts[k], sp_starts[k + 1]
    if p + (s1 - s0) > end:
        return -1
    for t in range(s1 - s0):
        if sp_bytes[s0 + t] != data[p + t]:
            return -1
    return k


@njit(cache=True)
def _add_word(data, s, e, keys, vals, wbytes, wstarts, state, items):
    """Append the handle of the word ``data[s:e]`` (a new one for a new word); False on a
    clash of two words' keys."""
    h = _FNV_OFFSET
    for q in range(s, e):
        h = (h ^ np.uint64(data[q])) * _FNV_PRIME
    if h == np.uint64(0):
        h = np.uint64(1)
    slot = probe(keys, h)
    if keys[slot] == 0:
        w = state[WORDS]
        keys[slot] = h
        vals[slot] = w
        b = wstarts[w]
        for q in range(s, e):
            wbytes[b + q - s] = data[q]
        wstarts[w + 1] = b + e - s
        state[WORDS] = w + 1
    else:
        w = vals[slot]
        b = wstarts[w]
        if wstarts[w + 1] - b != e - s:
            return False
        for q in range(s, e):
            if wbytes[b + q - s] != data[q]:
                return False
    items[state[ITEMS]] = w
    state[ITEMS] += 1
    return True


@njit(cache=True)
def _split_ascii(data, s, e, keys, vals, wbytes, wstarts, state, items):
    i = s
    while i < e:
        j = _word_end(data, i, e)
        if not _add_word(data, i, j, keys, vals, wbytes, wstarts, state, items):
            return False
        i = j
    return True


@njit(cache=True, inline="always")
def _safe_cut(data, p, e):
    """Can text be cut before ``p`` (0 < p < e) and each side split alone? After a newline
    that an ASCII non-whitespace character follows, and between an ASCII letter and an ASCII
    character that is not one (a word holding a letter ends at the first non-letter after it)."""
    c = data[p]
    if c >= 128:
        return False
    if data[p - 1] == 10:
        return _CLASS[c] != _SPACE
    return _CLASS[data[p - 1]] == _LETTER and _CLASS[c] != _LETTER


@njit(cache=True)
def _split_run(data, s, e, high, keys, vals, wbytes, wstarts, state, items, foreign):
    """Items of the ordinary text ``data[s:e]`` (``high``: it holds a non-ASCII byte).
    False on a clash, or when ``foreign`` is full (state[SPANS] is then len(foreign) + 1)."""
    if not high:
        return _split_ascii(data, s, e, keys, vals, wbytes, wstarts, state, items)
    piece = s
    piece_high = False
    for p in range(s, e + 1):
        if p < e and not (p > piece and _safe_cut(data, p, e)):
            piece_high = piece_high or data[p] >= 128
            continue
        if piece_high:  # p ends the piece data[piece:p]
            f = state[SPANS]
            if f == len(foreign):
                state[SPANS] = f + 1
                return False
            foreign[f, 0], foreign[f, 1] = piece, p
            state[SPANS] = f + 1
            items[state[ITEMS]] = FOREIGN - f
            state[ITEMS] += 1
        elif not _split_ascii(data, piece, p, keys, vals, wbytes, wstarts, state, items):
            return False
        piece = p
        piece_high = p < e and data[p] >= 128
    return True


@njit(cache=True, nogil=True)
def split_words(data, bounds, first, sp_bytes, sp_starts, sp_ids, sp_first,
                keys, vals, wbytes, wstarts, state, items, text_ends, foreign):
    """Cut texts ``first``, ``first + 1``, ... (``data[bounds[t]:bounds[t + 1]]``) into items,
    recording where each text's items end (``text_ends``). Stops before a text the table or
    the word arrays may lack room for (ROOM), or when ``foreign`` is full (FULL). Returns
    (texts done, status)."""
    room = len(keys) // 2
    for t in range(first, len(bounds) - 1):
        a, b = bounds[t], bounds[t + 1]
        w = state[WORDS]
        if w + (b - a) > room or w + (b - a) + 1 > len(wstarts) or wstarts[w] + (b - a) > len(wbytes):
            return t, ROOM
        mark_items, mark_spans = state[ITEMS], state[SPANS]
        p = a
        run = a
        high = np.bool_(False)  # typed, not a literal: numba would compile _split_run twice
        while p <= b:
            k = -1
            if p < b:
                c = data[p]
                if not sp_first[c]:
                    high = high or c >= 128
                    p += 1
                    continue
                k = _special_at(data, p, b, sp_bytes, sp_starts)
                if k < 0:
                    high = high or c >= 128
                    p += 1
                    continue
            if p > run and not _split_run(data, run, p, high, keys, vals, wbytes, wstarts, state, items, foreign):
                if state[SPANS] > len(foreign):  # out of room: this text again, with more
                    state[ITEMS], state[SPANS] = mark_items, mark_spans
                    return t, FULL
                return t, CLASH
            if k < 0:
                break
            items[state[ITEMS]] = -1 - sp_ids[k]
            state[ITEMS] += 1
            p += sp_starts[k + 1] - sp_starts[k]
            run = p
            high = np.bool_(False)
        text_ends[t] = state[ITEMS]
    return len(bounds) - 1, DONE


@njit(cache=True, nogil=True)
def assemble(items, text_ends, wtok, wtstarts, ftok, fstarts):
    """Every text's token ids in one array, and where each text starts in it."""
    n = len(text_ends)
    offsets = np.empty(n + 1, np.int64)
    offsets[0] = 0
    total = 0
    it = 0
    for t in range(n):
        while it < text_ends[t]:
            x = items[it]
            if x >= 0:
                total += wtstarts[x + 1] - wtstarts[x]
            elif x > FOREIGN:
                total += 1
            else:
                total += fstarts[FOREIGN - x + 1] - fstarts[FOREIGN - x]
            it += 1
        offsets[t + 1] = total
    out = np.empty(total, np.int32)
    k = 0
    for i in range(it):
        x = items[i]
        if x >= 0:
            for q in range(wtstarts[x], wtstarts[x + 1]):
                out[k] = wtok[q]
                k += 1
        elif x > FOREIGN:
            out[k] = -1 - x
            k += 1
        else:
            f = FOREIGN - x
            for q in range(fstarts[f], fstarts[f + 1]):
                out[k] = ftok[q]
                k += 1
    return out, offsets
