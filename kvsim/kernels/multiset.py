"""A multiset of 64-bit keys (key -> how many times it was added), compiled with numba.

It lives on the open-addressing table of :mod:`.table` (0 is never a key): ``add`` counts
each key of an array once more, ``remove`` once less (a key whose count reaches zero leaves
the table), ``len`` is the number of distinct keys held. Callers hand whole arrays, so a
request's hundreds of keys are one call, not hundreds of dictionary operations.
"""
from __future__ import annotations

import numpy as np

from kvsim.kernels.jit import njit
from kvsim.kernels.table import delete, grow_table, new_table, probe

_ZERO = np.uint64(0)


@njit(cache=True, _nrt=False)
def _add(keys, vals, size, new):
    for x in new:
        s = probe(keys, x)
        if keys[s] == _ZERO:
            keys[s] = x
            vals[s] = 1
            size[0] += 1
        else:
            vals[s] += 1


@njit(cache=True, _nrt=False)
def _remove(keys, vals, size, old):
    for x in old:
        s = probe(keys, x)
        if keys[s] == _ZERO:
            continue
        if vals[s] > 1:
            vals[s] -= 1
        else:
            delete(keys, vals, s)
            size[0] -= 1


@njit(cache=True, _nrt=False)
def _held_prefix(keys, chain):
    # a prefix-chained key stands for its whole prefix, so the held keys of a chain whose
    # every key was added with its whole chain are a prefix of it: bisection
    lo, hi = 0, len(chain)
    while lo < hi:
        mid = (lo + hi) // 2
        if keys[probe(keys, chain[mid])] != _ZERO:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, _nrt=False)
def _count(keys, vals, key):
    s = probe(keys, key)
    return vals[s] if keys[s] != _ZERO else 0


class KeyMultiset:
    """Counted 64-bit keys (never 0), added and removed an array at a time."""

    __slots__ = ("keys", "vals", "size")

    def __init__(self) -> None:
        self.keys, self.vals = new_table(16, np.int64)
        self.size = np.zeros(1, np.int64)

    def add(self, new: np.ndarray) -> None:
        """Count each of ``new`` (uint64, no key twice) once more."""
        need = int(self.size[0]) + len(new)
        if 2 * need > len(self.keys):
            self.keys, self.vals = grow_table(self.keys, self.vals, need)
        _add(self.keys, self.vals, self.size, new)

    def remove(self, old: np.ndarray) -> None:
        """Count each of ``old`` (uint64, each held) once less; keys counted zero times leave."""
        _remove(self.keys, self.vals, self.size, old)

    def held_prefix(self, chain: np.ndarray) -> int:
        """How many leading keys of ``chain`` are held, where every chain was added whole (a
        prefix-chained key stands for its prefix, so the held keys are a prefix)."""
        return int(_held_prefix(self.keys, chain)) if self.size[0] else 0

    def count(self, key: int) -> int:
        """How many times ``key`` is held."""
        return int(_count(self.keys, self.vals, np.uint64(key)))

    def __contains__(self, key: int) -> bool:
        return self.count(key) > 0

    def __len__(self) -> int:
        return int(self.size[0])

    def as_dict(self) -> dict[int, int]:
        """Every key held and its count."""
        held = self.keys != _ZERO
        return dict(zip(self.keys[held].tolist(), self.vals[held].tolist()))
