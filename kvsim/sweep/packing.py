"""A min segment tree with range add, for packing reuse intervals under slot capacities.

Slots ``0 .. n-1`` hold a free capacity each. :func:`seg_min` returns the smallest free
capacity in a range and :func:`seg_add` adds to a range, both O(log n). The tree is an
array of ``2*size`` minima plus ``size`` pending adds (size a power of two); leaves past
``n`` hold a huge value so they never win a minimum.
"""
from __future__ import annotations

import numpy as np
from numba import njit

BIG = np.int64(1) << np.int64(61)


@njit(cache=True)
def seg_new(values):
    """A tree over ``values`` (int64): returns (size, height, t, d)."""
    n = len(values)
    size, h = 1, 0
    while size < max(n, 1):
        size *= 2
        h += 1
    t = np.full(2 * size, BIG, np.int64)
    d = np.zeros(size, np.int64)
    for i in range(n):
        t[size + i] = values[i]
    for i in range(size - 1, 0, -1):
        t[i] = min(t[2 * i], t[2 * i + 1])
    return size, h, t, d


@njit(cache=True, inline="always")
def _apply(t, d, size, p, v):
    t[p] += v
    if p < size:
        d[p] += v


@njit(cache=True, inline="always")
def _rebuild(t, d, p):
    while p > 1:
        p >>= 1
        t[p] = min(t[2 * p], t[2 * p + 1]) + d[p]


@njit(cache=True, inline="always")
def _push(t, d, size, h, p):
    for s in range(h, 0, -1):
        i = p >> s
        if d[i] != 0:
            _apply(t, d, size, 2 * i, d[i])
            _apply(t, d, size, 2 * i + 1, d[i])
            d[i] = 0


@njit(cache=True)
def seg_add(t, d, size, h, lo, hi, v):
    """Add ``v`` to slots ``lo .. hi`` (inclusive)."""
    l = lo + size
    r = hi + size + 1
    l0, r0 = l, r
    _push(t, d, size, h, l0)
    _push(t, d, size, h, r0 - 1)
    while l < r:
        if l & 1:
            _apply(t, d, size, l, v)
            l += 1
        if r & 1:
            r -= 1
            _apply(t, d, size, r, v)
        l >>= 1
        r >>= 1
    _rebuild(t, d, l0)
    _rebuild(t, d, r0 - 1)


@njit(cache=True)
def seg_min(t, d, size, h, lo, hi):
    """The smallest value in slots ``lo .. hi`` (inclusive)."""
    l = lo + size
    r = hi + size + 1
    _push(t, d, size, h, l)
    _push(t, d, size, h, r - 1)
    res = BIG
    while l < r:
        if l & 1:
            res = min(res, t[l])
            l += 1
        if r & 1:
            r -= 1
            res = min(res, t[r])
        l >>= 1
        r >>= 1
    return res
