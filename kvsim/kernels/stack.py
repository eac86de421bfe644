"""LRU stack depth in one pass (Mattson et al. 1970), compiled with numba.

An LRU stack is kept as the set of *live slots*: every access (or push) takes the next
slot number and frees the slot of its previous access, so the entries above a live slot
are the live slots after it. The live slots are a bitset; a Fenwick tree counts them per
64-slot word (64 times smaller than the slot range, so it stays in cache): marking and
counting are O(log n). The sweep's capacity curves (:mod:`kvsim.sweep.stack`) and the
analyzer's reuse distances (:func:`stack_distances`) both count depths this way.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _fen_add(tree, i, v):
    n = len(tree) - 1
    while i <= n:
        tree[i] += v
        i += i & (-i)


@njit(cache=True, inline="always")
def _fen_prefix(tree, i):
    s = 0
    while i > 0:
        s += tree[i]
        i &= i - 1
    return s


@njit(cache=True, inline="always")
def _popcount(x):
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return np.int64((x * np.uint64(0x0101010101010101)) >> np.uint64(56))


# The live push slots are a bitset; a Fenwick tree counts live slots per 64-slot word, so
# the tree is 64 times smaller than the slot range and stays in cache.

@njit(cache=True, inline="always")
def set_live(bits, tree, s):
    """Mark slot ``s`` live."""
    w = s >> 6
    bits[w] |= np.uint64(1) << np.uint64(s & 63)
    _fen_add(tree, w + 1, 1)


@njit(cache=True, inline="always")
def clear_live(bits, tree, s):
    """Mark slot ``s`` dead."""
    w = s >> 6
    bits[w] &= ~(np.uint64(1) << np.uint64(s & 63))
    _fen_add(tree, w + 1, -1)


@njit(cache=True, inline="always")
def live_upto(bits, tree, s):
    """Live slots <= s."""
    w = s >> 6
    sh = np.uint64(s & 63)
    word = bits[w] & ((np.uint64(2) << sh) - np.uint64(1)) if sh < np.uint64(63) else bits[w]
    return _fen_prefix(tree, w) + _popcount(word)


@njit(cache=True)
def stack_distances(ids, num_ids):
    """LRU stack distance of every access in ``ids`` (dense ids below ``num_ids``).

    dist[t] = number of distinct ids accessed strictly between the previous access of
    ids[t] and t; -1 for a first access.
    """
    m = len(ids)
    bits = np.zeros((m >> 6) + 1, np.uint64)          # live slots: the latest access of each id
    tree = np.zeros((m >> 6) + 2, np.int32)
    last = np.full(num_ids, -1, np.int64)
    dist = np.full(m, -1, np.int64)
    live = 0
    for t in range(m):
        x = ids[t]
        p = last[x]
        if p >= 0:
            dist[t] = live - live_upto(bits, tree, p)   # live slots after p: the ids seen since
            clear_live(bits, tree, p)
            live -= 1
        set_live(bits, tree, t)
        live += 1
        last[x] = t
    return dist
