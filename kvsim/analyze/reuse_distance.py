"""Reuse distance: how much cache the upper bound needs under LRU.

Every full block of every request is an access, in arrival order (a request touches its
prompt blocks, then the blocks its reply fills). For a block that was seen before, its
LRU stack distance is the number of distinct blocks accessed since its previous access
(Mattson et al. 1970; one Fenwick-tree pass). An LRU cache of C blocks keeps it iff the
distance is below C, so the capacity that captures X% of the unlimited-cache block hits
is the X-th percentile of distance + 1. This is a block-level LRU over the access stream:
it ignores that engines evict leaves first and protect running requests, so treat the
capacities as estimates and check them with ``kvsim simulate``.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from kvsim.analyze.reuse import PrefixIndex
from kvsim.kernels.stack import stack_distances

TARGETS = (50, 80, 90, 99)
CURVE = (1e4, 1e5, 1e6, 1e7, 5e7, 1e8, 1e9)
GiB = 1024**3


def block_accesses(index: PrefixIndex, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(node ids, is-prompt flag) of the block-size-``block`` accesses, in order.

    ``block`` must be a multiple of the index granularity: a B-block is identified by the
    chained key of its last G-block."""
    G = index.block
    step = block // G
    counts = np.diff(index.blk_off)
    pos = np.arange(len(index.ids), dtype=np.int64) - np.repeat(index.blk_off[:-1], counts)
    take = (pos + 1) % step == 0
    in_prompt = pos < np.repeat(index.prompt_blocks, counts)
    return index.ids[take], in_prompt[take]


def reuse_distance(index: PrefixIndex, block: int, prompt_tokens: int,
                   kv_bytes_per_token: int | None = None) -> dict[str, Any]:
    """Distance distribution and the LRU capacity for 50/80/90/99% of the block hits."""
    ids, in_prompt = block_accesses(index, block)
    dist = stack_distances(ids, index.num_nodes) if len(ids) else np.zeros(0, np.int64)
    hits = dist[in_prompt & (dist >= 0)]
    out: dict[str, Any] = {"block_size": block, "accesses": int(len(ids)), "hit_blocks": int(len(hits)),
                           "hit_tokens": int(len(hits) * block)}
    if len(hits) == 0:
        out.update(distance_tokens={}, capacity=[], curve=[])
        return out
    need = np.sort(hits + 1)  # blocks of LRU capacity each hit needs
    q = np.percentile(hits * block, (10, 50, 90, 99))
    out["distance_tokens"] = {"p10": float(q[0]), "p50": float(q[1]), "p90": float(q[2]), "p99": float(q[3]),
                              "max": int(hits.max() * block)}
    caps = []
    for x in TARGETS:
        c = int(need[max(0, int(np.ceil(x / 100 * len(need))) - 1)]) * block
        row = {"share_of_bound": x, "tokens": c}
        if kv_bytes_per_token is not None:
            row["gib"] = c * kv_bytes_per_token / GiB
        caps.append(row)
    out["capacity"] = caps
    out["curve"] = [{"capacity_tokens": c,
                     "hit_share": float(np.searchsorted(need, c // block, side="right") * block / prompt_tokens)
                     if prompt_tokens else 0.0}
                    for c in CURVE if c <= max(CURVE[0], 10 * need[-1] * block)]
    return out


def reuse_distances(index: PrefixIndex, prompt_tokens: int, hash_block: int | None,
                    kv_bytes_per_token: int | None) -> list[dict[str, Any]]:
    """Section 7: at 16-token blocks, and at a hash-id trace's own block size."""
    sizes = [index.block]
    if hash_block and hash_block != index.block and hash_block % index.block == 0:
        sizes.append(hash_block)
    return [reuse_distance(index, b, prompt_tokens, kv_bytes_per_token) for b in sizes]
