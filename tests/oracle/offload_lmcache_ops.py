"""Random operation scripts for LMCache's engine and storage, and how chunks are named in logs.

Imported by the tier tests (kvsim's ``LMCacheStorage``) and by ``offload_lmcache_driver.py``
(the real ``LMCacheEngine``): it imports neither kvsim nor LMCache. A chunk is named in a
log by :func:`prefix_id` of the tokens up to its end, the same number in both processes.
Operations: ``["store", tokens, skip_chunks]`` (vLLM's save: the first ``skip_chunks`` chunks
masked off), ``["lookup", tokens, lookup_id, pin]`` and ``["unpin", lookup_id]``.
"""
from __future__ import annotations

import random
from typing import Any


def prefix_id(tokens: list[int]) -> int:
    """A process-independent name for a token prefix (int tuples hash without a seed)."""
    return hash(tuple(tokens)) & ((1 << 62) - 1)


def chunk_ids(tokens: list[int], chunk: int, save_unfull_chunk: bool = False) -> list[int]:
    end = len(tokens) if save_unfull_chunk else len(tokens) - len(tokens) % chunk
    return [prefix_id(tokens[:min(s + chunk, len(tokens))]) for s in range(0, end, chunk)]


def random_script(seed: int, chunk: int, n: int = 120, families: int = 4,
                  family_chunks: tuple[int, int] = (1, 3)) -> list[list[Any]]:
    """Requests over a few shared prefixes (multi-turn continuations too): each is looked up
    with pins (vLLM's lookup), stored past its hit, unpinned later; some plain lookups."""
    rng = random.Random(seed)
    fams = [[rng.randrange(1000) for _ in range(rng.randint(*family_chunks) * chunk)] for _ in range(families)]
    sessions: list[list[int]] = []
    ops: list[list[Any]] = []
    pinned: list[str] = []
    for i in range(n):
        if sessions and rng.random() < 0.3:
            base = sessions[rng.randrange(len(sessions))]
        else:
            f = fams[rng.randrange(families)]
            base = f if rng.random() < 0.7 else f[:rng.randint(0, len(f))]
        tokens = base + [rng.randrange(1000) for _ in range(rng.randint(1, 2 * chunk))]
        sessions = (sessions + [tokens])[-6:]
        rid = f"r{i}"
        ops.append(["lookup", tokens, rid, True])
        pinned.append(rid)
        ops.append(["store", tokens, -1])              # -1: skip what the lookup hit
        if rng.random() < 0.2:
            ops.append(["lookup", tokens[:rng.randint(1, len(tokens))], f"q{i}", False])
        while pinned and (len(pinned) > 2 or rng.random() < 0.5):
            ops.append(["unpin", pinned.pop(rng.randrange(len(pinned)))])
    ops += [["unpin", r] for r in pinned]
    return ops
