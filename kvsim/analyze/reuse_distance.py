"""KV capacity for a share of the upper bound, read off the one-pass APC curve.

The capacity that keeps X% of the unlimited cache's hits is where the APC hit-rate curve
of :mod:`kvsim.sweep.curves` (one Mattson stack pass, tail-first, with APC's lookup cap and
request footprint) first stays at X% of its unlimited value: the same function and the same
pass as the "KV needed for 90% of the upper bound" of ``kvsim report``, so the two commands
always agree. The curve is exact for APC at capacities that reject no request; for radix
and for smaller capacities it is an estimate: check a capacity with ``kvsim simulate``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from kvsim.io.trace.columns import Trace

TARGETS = (50, 80, 90, 99)
CURVE = (1e4, 1e5, 1e6, 1e7, 5e7, 1e8, 1e9)
GiB = 1024**3


def reuse_distance(trace: Trace, block: int, warmup: float = 0.0,
                   kv_bytes_per_token: int | None = None) -> dict[str, Any]:
    """The capacity each hit needs (percentiles) and the capacity for 50/80/90/99% of the hits."""
    from kvsim.sweep.curves import apc_curve, capacity_for_share

    model = apc_curve(trace, block, warmup=warmup)
    hits = int(model.hit_cum[-1]) if len(model.hit_cum) else 0
    out: dict[str, Any] = {"block_size": block, "hit_tokens": hits}
    if hits == 0:
        out.update(need_tokens={}, capacity=[], curve=[])
        return out
    need = model.hit_thr * block           # capacity (tokens) from which each step's hits count
    at = np.searchsorted(model.hit_cum, np.array([0.1, 0.5, 0.9, 0.99]) * hits, side="left")
    out["need_tokens"] = {"p10": int(need[at[0]]), "p50": int(need[at[1]]), "p90": int(need[at[2]]),
                          "p99": int(need[at[3]]), "max": int(need[-1])}
    caps = []
    for x in TARGETS:
        c = capacity_for_share(model, x / 100)
        if c is None:
            continue
        row: dict[str, Any] = {"share_of_bound": x, "tokens": int(c)}
        if kv_bytes_per_token is not None:
            row["gib"] = c * kv_bytes_per_token / GiB
        caps.append(row)
    out["capacity"] = caps
    top = max(CURVE[0], 10 * model.saturation_units * block)
    grid = [c for c in CURVE if c <= top]
    out["curve"] = [{"capacity_tokens": c, "hit_rate": float(r)} for c, r in zip(grid, model.hit_rate(grid))]
    return out


def reuse_distances(trace: Trace, block: int, hash_block: int | None, warmup: float,
                    kv_bytes_per_token: int | None) -> list[dict[str, Any]]:
    """Section 7: at ``block``-token blocks, and at a hash-id trace's own block size."""
    sizes = [block]
    if hash_block and hash_block != block:
        sizes.append(hash_block)
    return [reuse_distance(trace, b, warmup, kv_bytes_per_token) for b in sizes]
