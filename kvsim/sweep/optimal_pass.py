"""The compiled pass behind the offline optimum: reuse intervals packed greedily.

See ``docs/optimal.md`` for the model and the proof. In short: unit ``j`` of request ``e``
can only hit if it was kept in the cache since the last earlier request ``s`` whose chain
holds it; keeping it occupies one unit of space at every request strictly between ``s``
and ``e`` (``resident`` mode: the engines, where request ``r`` itself holds ``demand[r]``
units while it runs) or in every gap from ``s`` to ``e`` (storage mode: a cache that
stores blocks and bypasses the request). Choosing the most intervals under those
capacities, earliest end first, is optimal when every unit weighs the same; the prefix
rule (a unit only hits when its whole prefix hits) costs nothing because a prefix unit's
interval always lies inside its descendant's.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from kvsim.sweep.packing import seg_add, seg_min, seg_new


@njit(cache=True, inline="always")
def _pack(t, d, size, h, s, e, resident, count):
    """Keep as many of ``count`` units reused from slot ``s`` at slot ``e`` as fit."""
    lo = s + 1 if resident else s
    hi = e - 1
    if lo > hi:
        return count            # nothing lies in between: free
    room = seg_min(t, d, size, h, lo, hi)
    x = count if count < room else room
    if x <= 0:
        return 0
    seg_add(t, d, size, h, lo, hi, -x)
    return x


@njit(cache=True)
def optimal_pass(path_off, path_nodes, d0, d1, num_nodes, admitted, chain, read_units, demand,
                 partial_at, partial_w, measured, unit, K, resident, out_hits):
    """Pack every reuse interval; returns (hit tokens, hit tokens with partial units at full weight).

    Per request r: ``admitted`` (False: it never runs and touches nothing), ``chain``
    (tokens of its chain, a node boundary of its path), ``read_units`` (leading full units
    its lookup may hit), ``demand`` (units it holds while running; resident mode),
    ``partial_at`` (chain position closing a partial last unit of ``partial_w`` tokens,
    or -1), ``measured`` (its hits count). ``out_hits[r]`` receives r's packed tokens.
    """
    n = len(admitted)
    rank = np.full(n, -1, np.int64)
    a = 0
    for r in range(n):
        if admitted[r]:
            rank[r] = a
            a += 1
    free = np.empty(max(a, 1), np.int64)
    for r in range(n):
        if admitted[r]:
            free[rank[r]] = K - demand[r] if resident else K
    size, h, t, d = seg_new(free[:a] if a > 0 else free[:0])
    last = np.full(num_nodes, -1, np.int64)
    hits = 0
    upper = 0
    for r in range(n):
        if not admitted[r]:
            continue
        e = rank[r]
        cap = read_units[r]
        g_prev = -1
        g_cnt = 0
        p_prev = -1
        got = 0
        for k in range(path_off[r], path_off[r + 1]):
            c = path_nodes[k]
            if d1[c] > chain[r]:
                break
            prev = last[c]
            last[c] = r
            if not measured[r]:
                continue
            # full unit j ends at position j*unit - 1: units d0//unit + 1 .. d1//unit lie here
            lo = d0[c] // unit
            hi = min(d1[c] // unit, cap)
            if hi > lo:
                if prev != g_prev and g_cnt > 0:
                    if g_prev >= 0:
                        got += _pack(t, d, size, h, rank[g_prev], e, resident, g_cnt) * unit
                    g_cnt = 0
                g_prev = prev
                g_cnt += hi - lo
            if d0[c] <= partial_at[r] < d1[c]:
                p_prev = prev
        if g_cnt > 0 and g_prev >= 0:
            got += _pack(t, d, size, h, rank[g_prev], e, resident, g_cnt) * unit
        full = got
        if p_prev >= 0 and partial_w[r] > 0:
            x = _pack(t, d, size, h, rank[p_prev], e, resident, 1)
            got += x * partial_w[r]
            full += x * unit
        out_hits[r] = got
        hits += got
        upper += full
    return hits, upper
