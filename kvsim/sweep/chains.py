"""Prefix-chained block keys of every prompt, the partial last block included.

Block j of a prompt gets a 64-bit key from its parent's key, its tokens and its length
(APC's ``fast`` chained hash, :mod:`kvsim.engines.vllm.hashing`, with the namespace on every
block), so equal keys mean equal prefixes up to and including the block. Unlike APC, the partial last block has
a key too: this is the unit of hash-id traces such as Mooncake's (one id per 512 tokens,
the last partial block included) and of the block-LRU model of Mooncake's Fig. 9.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from kvsim.engines.vllm.hashing import FAST_ROOT, block_end, block_start, block_token


@njit(cache=True)
def _prefix_block_keys(tokens, offsets, block_size, ns_keys, key_off, out, last_len):
    n = len(offsets) - 1
    for i in range(n):
        p0 = offsets[i]
        L = offsets[i + 1] - p0
        h = np.uint64(FAST_ROOT)
        nb = key_off[i + 1] - key_off[i]
        for j in range(nb):
            acc = block_start(h, ns_keys[i], 0)
            start = j * block_size
            stop = min(start + block_size, L)
            for k in range(start, stop):
                acc = block_token(acc, tokens[p0 + k], k - start)
            h = block_end(acc, stop - start)
            out[key_off[i] + j] = h
        last_len[i] = L - (nb - 1) * block_size if nb > 0 else 0


def prompt_block_keys(tokens: np.ndarray, offsets: np.ndarray, block_size: int,
                      namespaces: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Keys of every prompt's ``ceil(L / block_size)`` blocks.

    Returns ``(keys, key_off, last_len)``: keys of request i are ``keys[key_off[i]:key_off[i+1]]``
    and its last block holds ``last_len[i]`` tokens. ``namespaces`` (uint64 per request, 0 = none)
    separates tenants (salt / LoRA) as the engines do.
    """
    offsets = np.asarray(offsets, np.int64)
    L = np.diff(offsets)
    nb = -(-L // block_size)
    key_off = np.zeros(len(L) + 1, np.int64)
    key_off[1:] = np.cumsum(nb)
    keys = np.zeros(int(key_off[-1]), np.uint64)
    last_len = np.zeros(len(L), np.int64)
    ns = np.zeros(len(L), np.uint64) if namespaces is None else np.asarray(namespaces, np.uint64)
    _prefix_block_keys(tokens, offsets, int(block_size), ns, key_off, keys, last_len)
    return keys, key_off, last_len
