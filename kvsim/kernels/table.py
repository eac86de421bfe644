"""One open-addressing hash table for 64-bit keys, compiled with numba.

A table is two arrays of the same power-of-two length: ``keys`` (uint64, 0 marks an empty
slot, so 0 is never a key) and ``vals`` (any integer type). Linear probing from a
multiplicative hash; deletion shifts later entries back (no tombstones). Callers keep the
load at or below one half (:func:`new_table`, :func:`grow_table`).
"""
from __future__ import annotations

import numpy as np

from kvsim.kernels.jit import njit

_GOLD = np.uint64(0x9E3779B97F4A7C15)
_ZERO = np.uint64(0)


@njit(inline="always")
def home(key, mask):
    """The slot a key's probe starts at."""
    return ((key * _GOLD) >> np.uint64(20)) & mask


@njit(inline="always")
def probe(keys, key):
    """Slot holding ``key``, or the empty slot where it would go."""
    mask = np.uint64(len(keys) - 1)
    s = home(key, mask)
    while True:
        k = keys[s]
        if k == key or k == _ZERO:
            return np.int64(s)
        s = (s + np.uint64(1)) & mask


@njit(cache=True, _nrt=False)   # no reference counting: called once per key by callers' loops
def delete(keys, vals, s):
    """Empty slot ``s``, moving later entries of its probe run back into the gap."""
    mask = np.uint64(len(keys) - 1)
    i = np.uint64(s)
    keys[i] = _ZERO
    j = i
    while True:
        j = (j + np.uint64(1)) & mask
        if keys[j] == _ZERO:
            return
        k = home(keys[j], mask)
        # the entry at j stays when its home lies cyclically in (i, j]
        if (i <= j and i < k <= j) or (i > j and (k > i or k <= j)):
            continue
        keys[i] = keys[j]
        vals[i] = vals[j]
        keys[j] = _ZERO
        i = j


@njit(cache=True)
def rehash(keys, vals, new_keys, new_vals):
    """Copy every entry into a (larger) empty table."""
    for s in range(len(keys)):
        k = keys[s]
        if k != _ZERO:
            t = probe(new_keys, k)
            new_keys[t] = k
            new_vals[t] = vals[s]


def table_size(entries: int) -> int:
    """The power-of-two length that holds ``entries`` at load <= 1/2 (at least 16)."""
    size = 16
    while size < 2 * max(entries, 1):
        size *= 2
    return size


def new_table(slots: int, val_dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
    """An empty table of at least ``slots`` slots (a power of two, at least 16)."""
    size = 1 << max(4, int(slots - 1).bit_length())
    return np.zeros(size, np.uint64), np.zeros(size, val_dtype)


def grow_table(keys: np.ndarray, vals: np.ndarray, need: int) -> tuple[np.ndarray, np.ndarray]:
    """A table with room for ``need`` entries at load <= 1/2, holding the old entries."""
    size = len(keys)
    while size < 2 * need:
        size *= 2
    if size == len(keys):
        return keys, vals
    nk, nv = np.zeros(size, np.uint64), np.zeros(size, vals.dtype)
    rehash(keys, vals, nk, nv)
    return nk, nv
