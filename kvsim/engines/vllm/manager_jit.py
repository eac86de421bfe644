"""vLLM's block pool on arrays, one ``KVCacheManager`` operation at a time (compiled).

The same pool as ``pool.py`` / ``reference.py`` (``docs/engines/apc.md §2–§4``), for
callers that interleave many requests step by step (the scheduler replay,
``kvsim.sched``): the arrays of the sequential engine (:class:`kvsim.engines.vllm.fast.FastState`:
free queue as a doubly linked list over block ids, the block-key table with its
per-key duplicate lists) plus reference counts, and one compiled function per manager
operation: lookup, allocate (touch hits, pop new blocks, cache full ones), cache, free,
and several decode steps of a batch at once.

A request's block table and block keys live in two arenas shared by all requests
(``tbl``, ``keys``): request r owns ``[off, off + cap)`` in both. Its scalars (blocks
held, blocks cached, tokens known) are the caller's; the functions take and return them.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from kvsim.engines.vllm.fast import FastState, _get, _insert, _remove

Q_FREE = 0          # slot of the free-block count in ``st``


@njit(cache=True, inline="always")
def _unlink(qnext, qprev, b):
    p, n = qprev[b], qnext[b]
    qnext[p] = n
    qprev[n] = p


@njit(cache=True, inline="always")
def _link_after(qnext, qprev, p, b):
    n = qnext[p]
    qnext[p] = b
    qprev[b] = p
    qnext[b] = n
    qprev[n] = b


@njit(cache=True, inline="always")
def _pop_new(qnext, qprev, key, dnext, dprev, tkeys, theads, ref, st):
    """``get_new_blocks(1)``: the queue head; a cached block loses its hash now (§3.3)."""
    head = len(qnext) - 2
    b = qnext[head]
    _unlink(qnext, qprev, b)
    st[Q_FREE] -= 1
    k = key[b]
    if k != 0:
        _remove(tkeys, theads, dnext, dprev, k, b)
        key[b] = 0
    ref[b] = 1
    return b


@njit(cache=True, inline="always")
def _to_allocate(num_tokens, B, hits, held, ref):
    """``_num_blocks_to_allocate``: new blocks, plus hits that leave the free queue (§3.2)."""
    need = (num_tokens + B - 1) // B - len(hits) - held
    if need < 0:
        need = 0
    for b in hits:
        if ref[b] == 0:
            need += 1
    return need


@njit(cache=True)
def lookup(keys, off, num_blocks, tkeys, theads, out):
    """``get_computed_blocks``: hit blocks of the first ``num_blocks`` keys until the first miss."""
    h = 0
    while h < num_blocks:
        b = _get(tkeys, theads, keys[off + h])
        if b < 0:
            break
        out[h] = b
        h += 1
    return h


@njit(cache=True)
def fits(hits, held, num_tokens, gate_tokens, free, ref, B):
    """Whether ``num_tokens`` slots (and, with ``gate_tokens`` >= 0, the full-sequence
    gate) fit ``free`` blocks (§3.3, §4.4)."""
    if gate_tokens >= 0 and _to_allocate(gate_tokens, B, hits, held, ref) > free:
        return False
    return _to_allocate(num_tokens, B, hits, held, ref) <= free


@njit(cache=True)
def cache_full(key, dnext, dprev, tkeys, theads, tbl, keys, off, num_cached, num_keys, num_tokens, B):
    """``cache_blocks``: register the blocks full up to ``num_tokens``; returns blocks cached (§4.1)."""
    num_full = min(num_tokens, num_keys * B) // B
    if num_cached >= num_full:
        return num_cached
    for i in range(num_cached, num_full):
        b = tbl[off + i]
        k = keys[off + i]
        if b == 0 or key[b] == k:
            continue
        key[b] = k
        _insert(tkeys, theads, dnext, dprev, k, b)
    return num_full


@njit(cache=True)
def allocate(qnext, qprev, key, dnext, dprev, tkeys, theads, ref, st, tbl, keys, off,
             num_blocks, num_cached, allocated, num_keys, num_slots, cache_upto, hits,
             gate_tokens, reserve, caching, B):
    """``allocate_slots``: -1 (nothing changed) when the blocks do not fit ``free - reserve``,
    else the new (blocks held, blocks cached). A request's first allocation touches its hits
    before popping new blocks, so it never evicts its own hits (§3.2, S6)."""
    held = num_blocks if allocated else 0
    if not fits(hits, held, num_slots, gate_tokens, st[Q_FREE] - reserve, ref, B):
        return -1, num_cached
    if not allocated:
        for j in range(len(hits)):
            b = hits[j]
            if caching:
                if ref[b] == 0:
                    _unlink(qnext, qprev, b)
                    st[Q_FREE] -= 1
                ref[b] += 1
            tbl[off + j] = b
        num_blocks = num_cached = len(hits)
    # get_new_blocks: unlink from the head first, then drop the hashes the blocks held (the
    # same state as one block at a time; the table lookups of a batch then overlap in memory)
    start, head = num_blocks, len(qnext) - 2
    for _ in range((num_slots + B - 1) // B - num_blocks):
        b = qnext[head]
        _unlink(qnext, qprev, b)
        tbl[off + num_blocks] = b
        num_blocks += 1
    st[Q_FREE] -= num_blocks - start
    for j in range(start, num_blocks):
        b = tbl[off + j]
        ref[b] = 1
        k = key[b]
        if k != 0:
            _remove(tkeys, theads, dnext, dprev, k, b)
            key[b] = 0
    if caching:
        num_cached = cache_full(key, dnext, dprev, tkeys, theads, tbl, keys, off, num_cached, num_keys,
                                cache_upto, B)
    return num_blocks, num_cached


@njit(cache=True)
def free(qnext, qprev, key, ref, st, tbl, off, num_blocks, caching, unhashed_to_head):
    """Release a request's blocks, last first: blocks without a hash to the queue head
    (0.24+), the others to the tail (§3.5)."""
    tail = len(qnext) - 1
    p = tail - 1                      # the head sentinel
    for j in range(num_blocks - 1, -1, -1):
        b = tbl[off + j]
        if b != 0:
            ref[b] -= 1
    for j in range(num_blocks - 1, -1, -1):
        b = tbl[off + j]
        if b != 0 and ref[b] == 0 and unhashed_to_head and (key[b] == 0 or not caching):
            _link_after(qnext, qprev, p, b)
            p = b
            st[Q_FREE] += 1
    for j in range(num_blocks - 1, -1, -1):
        b = tbl[off + j]
        if b != 0 and ref[b] == 0 and not (unhashed_to_head and (key[b] == 0 or not caching)):
            _link_after(qnext, qprev, qprev[tail], b)
            st[Q_FREE] += 1


@njit(cache=True)
def decode_steps(qnext, qprev, key, dnext, dprev, tkeys, theads, ref, st, tbl, keys,
                 offs, computed, num_blocks, num_cached, num_keys, k, lag, caching, B):
    """``k`` decode steps of a batch in vLLM's order of pool operations (§4.4).

    In step j, in batch order, the request computing position ``c + j`` takes a new block
    when that position starts one, and caches the blocks full with the tokens known by then
    (``c + j + 1 - lag`` of them). ``num_blocks`` / ``num_cached`` are updated in place.
    """
    for j in range(k):
        for r in range(len(offs)):
            c = computed[r] + j
            if c % B != 0 and (c + 1 - lag) % B != 0:
                continue
            if num_blocks[r] * B < c + 1:
                tbl[offs[r] + num_blocks[r]] = _pop_new(qnext, qprev, key, dnext, dprev, tkeys, theads, ref, st)
                num_blocks[r] += 1
            if caching:
                num_cached[r] = cache_full(key, dnext, dprev, tkeys, theads, tbl, keys, offs[r], num_cached[r],
                                           num_keys[r], c + 1 - lag, B)


class StepPool:
    """The pool's arrays: ``num_blocks`` blocks, block 0 the null block (never handed out)."""

    def __init__(self, num_blocks: int) -> None:
        s = FastState(num_blocks, num_blocks, 1)    # at most one key per block is registered
        self.qnext, self.qprev, self.key, self.dnext, self.dprev = s.qnext, s.qprev, s.key, s.dnext, s.dprev
        self.tkeys, self.theads = s.tkeys, s.theads
        self.ref = np.zeros(num_blocks, np.int32)
        self.st = np.zeros(2, np.int64)
        self.st[Q_FREE] = num_blocks - 1
        self._state = s

    @property
    def num_free_blocks(self) -> int:
        return int(self.st[Q_FREE])

    def free_block_ids(self) -> list[int]:
        """The free queue, head (next victim) first."""
        return self._state.free_queue()

    def num_cached_keys(self) -> int:
        return int(np.count_nonzero(self.tkeys))
