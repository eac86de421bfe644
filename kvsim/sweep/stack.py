"""One pass over a trace that gives the hit length of every request at *every* capacity.

The model (a Mattson stack adapted to prefix chains). Each request is a chain of units
(blocks or pages, identified by prefix-chained keys). After a request ends, its units go
on top of a recency stack, **tail first**: the last unit lowest, the first unit on top —
vLLM's free order (``docs/engines/apc.md §3.5``: released in reverse, so a sequence's tail is
evicted before its prefix) and the radix tree's leaf-first LRU eviction (``docs/engines/radix.md
§5``). A cache of C units holds the C top units. While request i runs it also holds
``phi[i]`` transient units (a partial last block) that are not kept afterwards, so a unit
survives request i only if its depth plus ``phi[i]`` fits. The cache of every size is the
same stack cut at a different depth, and

    unit x hits at capacity C  <=>  D(x) <= C,
    D(x) = 1 + (units above x at the lookup)
             + max phi over the requests since the last one that put a unit above x.

(x's depth only grows between its pushes, so its deepest moment is the last request that
raised it or a later one with a larger phi.) A unit's prefix is always pushed after it,
so D grows along a chain and every cache is prefix-closed: a request's hit at C is its
leading units with D <= C. The phi term is exact when phi is 0 or 1 (APC's partial block)
and an approximation for larger phi. Depths come from a Fenwick tree over 64-slot words
of a bitset of live push slots (:mod:`kvsim.kernels.stack`): O(log n) per unit.

Where it is not exact (callers state it): a request that cannot fit at capacity C is
skipped by the engine but still pushes its units here; a unit re-used while an older
duplicate copy survives (vLLM touches the oldest copy, the model the newest) shifts the
depth of units between the two copies by one.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from kvsim.kernels.stack import clear_live, live_upto, set_live
from kvsim.kernels.table import probe

NEVER = np.int64(1) << np.int64(60)   # a threshold no capacity reaches
_LOW = np.uint64(0xFFFFFFFF)


@njit(cache=True, inline="always")
def _lower_bound(values, top, x):
    """The first index of the ascending ``values[:top]`` whose value is ``>= x`` (``top``
    when there is none): a binary search."""
    a, z = 0, top
    while a < z:
        mid = (a + z) >> 1
        if values[mid] < x:
            a = mid + 1
        else:
            z = mid
    return a


@njit(cache=True)
def stack_pass(keys, key_off, cap, phi, foot, measured, unit_w, last_w, ghost_phi, forward, dedup,
               out_thr, out_w):
    """Walk the requests once; write one (threshold, tokens) event per hittable seen unit.

    Args:
        keys: uint64 unit keys of every request, concatenated (prefix-chained: equal key means
            equal prefix up to and including that unit).
        key_off: int64 (n+1,) offsets of each request's units (all units it leaves cached).
        cap: int64 (n,) leading units that may hit (the engine's lookup cap).
        phi: int64 (n,) transient units held while the request runs, not kept after it.
        foot: int64 (n,) peak units of the request; below that capacity it is rejected.
        measured: bool (n,) whether the request's hits are counted.
        unit_w: tokens credited per hit unit; last_w: int64 (n,) tokens of each request's
            last unit (a partial block).
        ghost_phi: transient units stay in the stack after the request (vLLM <= 0.23 frees
            unhashed blocks to the queue tail).
        forward: push a request's units first-to-last (plain LRU order) instead of tail first.
        dedup: a unit past the lookup cap that is still cached is re-used (radix insert),
            instead of written again as a second copy (vLLM, ``docs/engines/apc.md §3.3``).
        out_thr, out_w: int64 outputs, at least ``cap.sum()`` long.

    Returns:
        The number of events written: unit j of request r counts ``w`` tokens at every
        capacity (in units) >= ``thr``.
    """
    n = len(key_off) - 1
    nslots = len(keys) + 1
    if ghost_phi:
        nslots += int(phi.sum())
    bits = np.zeros((nslots >> 6) + 1, np.uint64)      # the live push slots
    tree = np.zeros((nslots >> 6) + 2, np.int32)
    size = 16
    while size < (3 * len(keys)) // 2 + 2:
        size *= 2
    # key -> its current push slot | the request that pushed it << 32 (0: never pushed)
    tkeys = np.zeros(size, np.uint64)
    tvals = np.zeros(size, np.uint64)
    probes = np.empty(max(1, int(cap.max()) if len(cap) else 1), np.int64)
    # candidates for "the last request that put something new above slot s": (request, min old slot)
    mst_i = np.empty(n + 1, np.int64)
    mst_v = np.empty(n + 1, np.int64)
    mtop = 0
    # candidates for "max phi over the requests since i": (request, phi), phi strictly decreasing
    pst_i = np.empty(n + 1, np.int64)
    pst_v = np.empty(n + 1, np.int64)
    ptop = 0
    live = 0
    nxt = 1
    ne = 0
    for r in range(n):
        b = key_off[r]
        m = key_off[r + 1] - b
        c = cap[r]
        dmax = 0
        looked = 0  # units whose table place is known from the lookup (all found ones)
        for j in range(c):
            h = probe(tkeys, keys[b + j])
            probes[j] = h
            v = tvals[h]
            s = np.int64(v & _LOW)
            if s == 0:
                break  # never seen: a miss at every capacity, and so is everything after it
            looked = j + 1
            above = live - live_upto(bits, tree, s)
            lo = np.int64(v >> np.uint64(32)) + 1
            extra = 0
            if lo <= r - 1 and ptop > 0:
                # latest request with min-old-slot < s (stack values increase bottom to top)
                a = _lower_bound(mst_v, mtop, s)
                start = lo
                if a > 0 and mst_i[a - 1] > start:
                    start = mst_i[a - 1]
                # max phi over requests start..r-1: first candidate with index >= start
                a = _lower_bound(pst_i, ptop, start)
                if a < ptop:
                    extra = pst_v[a]
            d = above + 1 + extra
            if d > dmax:
                dmax = d
            if measured[r]:
                out_thr[ne] = dmax if dmax > foot[r] else foot[r]
                out_w[ne] = last_w[r] if j == m - 1 else unit_w
                ne += 1
        # push the request's units on top
        mr = NEVER
        if ghost_phi and phi[r] > 0:
            for _ in range(phi[r]):
                set_live(bits, tree, nxt)
                nxt += 1
                live += 1
            mr = -1
        for q in range(m):
            j = q if forward else m - 1 - q
            k = keys[b + j]
            h = probes[j] if j < looked else probe(tkeys, k)
            old = np.int64(tvals[h] & _LOW)
            if old != 0 and (j < c or dedup):
                # looked up: a hit at capacities where it was cached (moved), else gone anyway
                clear_live(bits, tree, old)
                live -= 1
                if old < mr:
                    mr = old
            else:
                # new, or past the lookup cap: a new copy; an old copy stays where it is
                mr = -1
                tkeys[h] = k
            tvals[h] = np.uint64(nxt) | (np.uint64(r) << np.uint64(32))
            set_live(bits, tree, nxt)
            nxt += 1
            live += 1
        if mr != NEVER:
            while mtop > 0 and mst_v[mtop - 1] >= mr:
                mtop -= 1
            mst_i[mtop] = r
            mst_v[mtop] = mr
            mtop += 1
        ph = 0 if ghost_phi else phi[r]
        while ptop > 0 and pst_v[ptop - 1] <= ph:
            ptop -= 1
        pst_i[ptop] = r
        pst_v[ptop] = ph
        ptop += 1
    return ne
