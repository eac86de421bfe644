"""LRU stack depth in one pass (Mattson et al. 1970), compiled with numba.

An LRU stack is kept as the set of *live slots*: every access (or push) takes the next
slot number and frees the slot of its previous access, so the entries above a live slot
are the live slots after it. The live slots are a bitset; a Fenwick tree counts them per
64-slot word (64 times smaller than the slot range, so it stays in cache): marking and
counting are O(log n). The one stack pass (:mod:`kvsim.sweep.stack`) counts depths this
way; its curves give the sweep, the report and ``kvsim analyze`` their capacities.
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
