"""The compiled fast hash (numba) of :mod:`kvsim.engines.vllm.hashing`, in its own module so
that importing the hashing rules does not import numba. Every kernel follows
:func:`~kvsim.engines.vllm.hashing.fast_block_hash_py` (``tests/test_apc_hashing.py``)."""
from __future__ import annotations

import numpy as np

from kvsim.engines.vllm.hashing import _F1, _F2, _P1, _P2, _P3, FAST_ROOT
from kvsim.kernels.jit import njit


@njit(cache=True, inline="always")
def _fmix(h):
    h ^= h >> np.uint64(33)
    h *= np.uint64(_F1)
    h ^= h >> np.uint64(33)
    h *= np.uint64(_F2)
    return h ^ (h >> np.uint64(33))


# The compiled hash in three steps, shared by every chained-key kernel (APC's blocks, the
# sweep's prompt blocks, the analyzer's prefix index): start a block under its parent,
# add its tokens, finish it with its length.

@njit(cache=True, inline="always")
def _lane(value, position):
    return _fmix(value * np.uint64(_P2) + np.uint64(position) * np.uint64(_P1) + np.uint64(_P3))


@njit(cache=True, inline="always")
def block_start(parent, every_key, first_key):
    """The state of a block's hash before its tokens: its parent and its namespace keys."""
    return (_fmix(np.uint64(parent) ^ np.uint64(_P3)) + _lane(np.uint64(every_key), 0)
            + _lane(np.uint64(first_key), 1))


@njit(cache=True, inline="always")
def block_token(acc, token, position):
    """Add the token id at ``position`` (0-based, in the block) to a block's hash state."""
    return acc + _lane(np.uint64(np.int64(token)), position + 2)


@njit(cache=True, inline="always")
def block_end(acc, length):
    """A block's key from its hash state and its length in tokens (never 0)."""
    h = _fmix(acc ^ np.uint64(length))
    return h if h != np.uint64(0) else np.uint64(1)


@njit(cache=True)
def fast_hash_sequence(tokens, start_block, num_blocks, block_size, parent, every_key, first_key, out):
    """Hash blocks ``start_block .. start_block+num_blocks-1`` of one token array into ``out``."""
    h = np.uint64(parent)
    for j in range(num_blocks):
        b = start_block + j
        acc = block_start(h, every_key, np.uint64(first_key) if b == 0 else np.uint64(0))
        base = b * block_size
        for k in range(block_size):
            acc = block_token(acc, tokens[base + k], k)
        h = block_end(acc, block_size)
        out[j] = h


@njit(cache=True, inline="always")
def _hash_request(prompt_tok, p0, plen, out_tok, o0, num_blocks, block_size, every_key, first_key, out, k0):
    """The first ``num_blocks`` block keys of one request's prompt (``plen`` tokens of
    ``prompt_tok`` from ``p0``) followed by its outputs (``out_tok`` from ``o0``), to ``out[k0:]``."""
    h = np.uint64(FAST_ROOT)
    ek, fk = np.uint64(every_key), np.uint64(first_key)
    for j in range(num_blocks):
        acc = block_start(h, ek, fk if j == 0 else np.uint64(0))
        base = j * block_size
        for k in range(block_size):
            pos = base + k
            if pos < plen:
                acc = block_token(acc, prompt_tok[p0 + pos], k)
            else:
                acc = block_token(acc, out_tok[o0 + pos - plen], k)
        h = block_end(acc, block_size)
        out[k0 + j] = h


@njit(cache=True)
def fast_hash_requests(prompt_tok, prompt_off, out_tok, out_off, num_blocks, block_size,
                       every_keys, first_keys, hash_off, out):
    """Fast hashes of the first ``num_blocks[i]`` blocks of every request's prompt + output.

    Request i's sequence is its prompt followed by its output tokens; its hashes go to
    ``out[hash_off[i]:hash_off[i+1]]``.
    """
    for i in range(len(num_blocks)):
        _hash_request(prompt_tok, prompt_off[i], prompt_off[i + 1] - prompt_off[i], out_tok, out_off[i],
                      num_blocks[i], block_size, every_keys[i], first_keys[i], out, hash_off[i])


@njit(cache=True)
def hash_requests(prompt_tok, prompt_start, prompt_len, out_tok, out_start, out_len, block_size, every_keys,
                  first_keys, key_start, out):
    """Fast hashes of every full block of each request's prompt + outputs (request i: the
    ``prompt_len[i]`` tokens of ``prompt_tok`` from ``prompt_start[i]``, then ``out_len[i]`` of
    ``out_tok`` from ``out_start[i]``), to ``out[key_start[i]:]``: the keys
    :func:`fast_hash_sequence` gives the sequence block by block."""
    for i in range(len(prompt_len)):
        _hash_request(prompt_tok, prompt_start[i], prompt_len[i], out_tok, out_start[i],
                      (prompt_len[i] + out_len[i]) // block_size, block_size, every_keys[i], first_keys[i], out,
                      key_start[i])
