"""Content keys of prompt blocks, as routers compute them from tokens.

A block's key is a hash of its parent's key and its own tokens, so equal keys mean equal
prefixes (positional, as Dynamo's radix tree and llm-d's chained hashes are) and a
cache namespace (LoRA adapter, cache salt) gives a different chain. The values are
Python hashes (64-bit, stable within one process): routers use them only as identities.
"""
from __future__ import annotations

from collections.abc import Hashable

import numpy as np


def root_key(namespace: Hashable = None) -> int:
    """The key a chain in ``namespace`` starts from."""
    return hash(("kvsim-fleet-root", namespace))


def chain_keys(tokens: np.ndarray, block_size: int, parent: int, *, partial: bool = False) -> list[int]:
    """Keys of the full blocks of ``tokens`` (and of the last partial one when ``partial``), chained from ``parent``."""
    toks = np.ascontiguousarray(tokens, dtype=np.int64)
    n_full = len(toks) // block_size
    out: list[int] = []
    key = parent
    raw = toks.tobytes()
    step = 8 * block_size
    for i in range(n_full):
        key = hash((key, raw[i * step:(i + 1) * step]))
        out.append(key)
    if partial and len(toks) % block_size:
        out.append(hash((key, raw[n_full * step:])))
    return out


def block_keys(tokens: np.ndarray, block_size: int, namespace: Hashable = None, *,
               partial: bool = False) -> list[int]:
    """Keys of a prompt's blocks from the root of ``namespace``."""
    return chain_keys(tokens, block_size, root_key(namespace), partial=partial)
