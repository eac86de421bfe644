"""vLLM 0.33's KV-cache manager, compiled: the pool on arrays and one kernel per manager operation.

The same pool and manager as :mod:`kvsim.engines.vllm.manager` (``docs/engines/apc.md §2–§4``),
without a Python object per block. The pool (:class:`PoolArrays`) is a free queue as a
doubly linked list over block ids (two sentinels after the last block), each block's key
(0 = no hash) and reference count, and the cache map: an open-addressing table
(:mod:`kvsim.kernels.table`) from 64-bit block keys to the earliest block registered under
the key, with an insertion-ordered list per key for duplicates (vLLM never de-duplicates).

The kernels take the pool's arrays (``POOL`` order) and a request's block table and block
keys as regions of two arrays; one kernel per manager operation: :func:`lookup`
(``get_computed_blocks``), :func:`fits` and :func:`allocate` (``allocate_slots``),
:func:`cache_full` (``cache_blocks``), :func:`free`, and :func:`decode_steps` (several
decode steps of a batch). The compiled sequential replay (:func:`run_sequential`, the
request life of :mod:`kvsim.engines.vllm.sequential`) and the scheduler's manager
(:class:`JitKVCacheManager`) are both built from them.
"""
from __future__ import annotations

import os
from collections.abc import Sequence as Seq
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from kvsim.engines.vllm import hashing, rules
from kvsim.engines.vllm.hash_kernels import fast_hash_sequence, hash_requests
from kvsim.engines.vllm.hashing import BlockHasher
from kvsim.engines.vllm.manager import Sequence
from kvsim.engines.vllm.rules import fits_ever_jit, kept_blocks_jit, lookup_cap_blocks_jit, peak_blocks_jit
from kvsim.engines.vllm.settings import PROFILES
from kvsim.kernels.jit import njit
from kvsim.kernels.table import delete, grow_table, new_table, probe, table_size

_EMPTY = -1
#: a log of at least this many tokens is keyed on two threads (:meth:`JitKVCacheManager.log_keys`)
PARALLEL_KEYING_TOKENS = 1 << 20


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


#: the pool's one-block steps: compiled without reference counting, which numba would otherwise
#: do for every array each call passes (most of a replay's time; they take no new arrays)
_pool_step = njit(cache=True, _nrt=False)
# slots of the pool's scalar array ``st``
ST_FREE, ST_EMPTY, ST_PEAK_USED, ST_EVICTED, ST_KEYS = 0, 1, 2, 3, 4


class PoolArrays:
    """``num_blocks`` blocks on arrays, block 0 the null block (never handed out)."""

    def __init__(self, num_blocks: int, max_keys: int | None = None) -> None:
        n = num_blocks
        self.num_blocks = n
        head, tail = n, n + 1
        self.qnext = np.empty(n + 2, np.int32)
        self.qprev = np.empty(n + 2, np.int32)
        # initial queue: 1 .. n-1 (block 0 is the null block)
        ids = np.arange(1, n, dtype=np.int32)
        self.qnext[head] = 1 if n > 1 else tail
        self.qprev[tail] = n - 1 if n > 1 else head
        self.qnext[ids] = ids + 1
        self.qprev[ids] = ids - 1
        if n > 1:
            self.qnext[n - 1] = tail
            self.qprev[1] = head
        self.key = np.zeros(n, np.uint64)          # 0 = no hash
        self.dnext = np.full(n, -1, np.int32)      # next block with the same key
        self.dprev = np.full(n, -1, np.int32)      # previous one; the first holds the last
        self.ref = np.zeros(n, np.int32)
        # the cache map: block key -> the earliest block registered under it; at most one
        # key per block is registered, so ``num_blocks`` keys always fit
        self.tkeys, self.theads = new_table(table_size(min(n, max_keys or n)), np.int32)
        self.st = np.zeros(8, np.int64)
        self.st[ST_FREE] = self.st[ST_EMPTY] = n - 1

    @property
    def arrays(self) -> tuple[np.ndarray, ...]:
        """The arrays every kernel takes first: queue, keys, per-key lists, table, refs, scalars."""
        return (self.qnext, self.qprev, self.key, self.dnext, self.dprev, self.tkeys, self.theads, self.ref,
                self.st)

    def reserve(self, max_keys: int) -> None:
        """Grow the key table (rehashed) when later work may register more keys."""
        self.tkeys, self.theads = grow_table(self.tkeys, self.theads, min(self.num_blocks, max_keys))

    @property
    def num_free_blocks(self) -> int:
        return int(self.st[ST_FREE])

    @property
    def peak_used_blocks(self) -> int:
        return int(self.st[ST_PEAK_USED])

    @property
    def used_blocks(self) -> int:
        """Blocks holding KV: in use by a request, or free but still cached."""
        return self.num_blocks - 1 - int(self.st[ST_EMPTY])

    def num_cached_keys(self) -> int:
        return int(np.count_nonzero(self.tkeys))

    def free_block_ids(self) -> list[int]:
        """Free block ids, head (next victim) first."""
        out, tail, b = [], self.num_blocks + 1, int(self.qnext[self.num_blocks])
        while b != tail:
            out.append(b)
            b = int(self.qnext[b])
        return out

    def cached_blocks(self) -> dict[int, list[int]]:
        """key -> registered block ids, earliest first (for tests)."""
        out: dict[int, list[int]] = {}
        for s in np.flatnonzero(self.tkeys != 0):
            b, chain = int(self.theads[s]), []
            while b != -1:
                chain.append(b)
                b = int(self.dnext[b])
            out[int(self.tkeys[s])] = chain
        return out


# -- the cache map ---------------------------------------------------------------------------

@_pool_step
def _get(tkeys, theads, key):
    """The earliest block cached under ``key``, or -1."""
    s = probe(tkeys, key)
    return theads[s] if tkeys[s] == key else _EMPTY


@_pool_step
def _register(key, dnext, dprev, tkeys, theads, st, k, b):
    """Register block b under key k, after any blocks already there (no de-duplication)."""
    key[b] = k
    s = probe(tkeys, k)
    if tkeys[s] == k:
        first = theads[s]
        last = dprev[first]
        dnext[last] = b
        dprev[b] = last
        dnext[b] = -1
        dprev[first] = b
        return
    tkeys[s] = k
    theads[s] = b
    dprev[b] = b
    dnext[b] = -1
    st[ST_KEYS] += 1


@_pool_step
def _unregister(key, dnext, dprev, tkeys, theads, st, b):
    """Drop block b's hash (``_maybe_evict_cached_block``); the key stays while other blocks hold it."""
    k = key[b]
    key[b] = 0
    st[ST_EVICTED] += 1
    s = probe(tkeys, k)
    first = theads[s]
    nxt = dnext[b]
    if b == first:
        if nxt == -1:
            delete(tkeys, theads, s)
            st[ST_KEYS] -= 1
            return
        dprev[nxt] = dprev[b]
        theads[s] = nxt
    else:
        prv = dprev[b]
        dnext[prv] = nxt
        if nxt == -1:
            dprev[first] = prv
        else:
            dprev[nxt] = prv


# -- the free queue --------------------------------------------------------------------------

@_pool_step
def _unlink(qnext, qprev, b):
    p, n = qprev[b], qnext[b]
    qnext[p] = n
    qprev[n] = p


@_pool_step
def _link_after(qnext, qprev, p, b):
    n = qnext[p]
    qnext[p] = b
    qprev[b] = p
    qnext[b] = n
    qprev[n] = b


@_pool_step
def _pop_new(qnext, qprev, key, dnext, dprev, tkeys, theads, ref, st):
    """``get_new_blocks(1)``: the queue head; a cached block loses its hash now (§3.3)."""
    b = qnext[len(qnext) - 2]
    _unlink(qnext, qprev, b)
    st[ST_FREE] -= 1
    if key[b] != 0:
        _unregister(key, dnext, dprev, tkeys, theads, st, b)
    else:
        st[ST_EMPTY] -= 1
    ref[b] = 1
    return b


@_pool_step
def _note_peak(key, st):
    used = len(key) - 1 - st[ST_EMPTY]
    if used > st[ST_PEAK_USED]:
        st[ST_PEAK_USED] = used


# -- the manager's operations ----------------------------------------------------------------

@njit(cache=True)
def lookup(tkeys, theads, keys, koff, num_blocks, out):
    """``get_computed_blocks``: hit blocks of the first ``num_blocks`` keys until the first miss (§2.2)."""
    h = 0
    while h < num_blocks:
        b = _get(tkeys, theads, keys[koff + h])
        if b < 0:
            break  # chained keys: every later block misses too
        out[h] = b
        h += 1
    return h


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
def fits(hits, held, num_tokens, gate_tokens, free, ref, B):
    """Whether ``num_tokens`` slots (and, with ``gate_tokens`` >= 0, the full-sequence
    gate) fit ``free`` blocks (§3.3, §4.4)."""
    if gate_tokens >= 0 and _to_allocate(gate_tokens, B, hits, held, ref) > free:
        return False
    return _to_allocate(num_tokens, B, hits, held, ref) <= free


@njit(cache=True)
def cache_full(key, dnext, dprev, tkeys, theads, st, tbl, toff, keys, koff, num_cached, num_keys, num_tokens, B):
    """``cache_blocks``: register the blocks full up to ``num_tokens``; returns blocks cached (§4.1)."""
    num_full = min(num_tokens, num_keys * B) // B
    if num_cached >= num_full:
        return num_cached
    for i in range(num_cached, num_full):
        b = tbl[toff + i]
        k = keys[koff + i]
        if b == 0 or key[b] == k:
            continue
        _register(key, dnext, dprev, tkeys, theads, st, k, b)
    return num_full


@njit(cache=True)
def allocate(qnext, qprev, key, dnext, dprev, tkeys, theads, ref, st, tbl, toff, keys, koff,
             num_blocks, num_cached, allocated, num_keys, num_slots, cache_upto, hits,
             gate_tokens, reserve, caching, B):
    """``allocate_slots``: -1 (nothing changed) when the blocks do not fit ``free - reserve``,
    else the new (blocks held, blocks cached). A request's first allocation touches its hits
    before popping new blocks, so it never evicts its own hits (§3.2, S6)."""
    held = num_blocks if allocated else 0
    if not fits(hits, held, num_slots, gate_tokens, st[ST_FREE] - reserve, ref, B):
        return -1, num_cached
    if not allocated:
        for j in range(len(hits)):
            b = hits[j]
            if caching:
                if ref[b] == 0:
                    _unlink(qnext, qprev, b)
                    st[ST_FREE] -= 1
                ref[b] += 1
            tbl[toff + j] = b
        num_blocks = num_cached = len(hits)
    # get_new_blocks: unlink from the head first, then drop the hashes the blocks held (the
    # same state as one block at a time; the table lookups of a batch then overlap in memory)
    start, head = num_blocks, len(qnext) - 2
    for _ in range((num_slots + B - 1) // B - num_blocks):
        b = qnext[head]
        _unlink(qnext, qprev, b)
        tbl[toff + num_blocks] = b
        num_blocks += 1
    st[ST_FREE] -= num_blocks - start
    for j in range(start, num_blocks):
        b = tbl[toff + j]
        ref[b] = 1
        if key[b] != 0:   # lazy eviction: the hash goes when the block is reused (§3.3)
            _unregister(key, dnext, dprev, tkeys, theads, st, b)
        else:
            st[ST_EMPTY] -= 1
    _note_peak(key, st)
    if caching:
        num_cached = cache_full(key, dnext, dprev, tkeys, theads, st, tbl, toff, keys, koff, num_cached,
                                num_keys, cache_upto, B)
    return num_blocks, num_cached


@njit(cache=True)
def free(qnext, qprev, key, dnext, dprev, tkeys, theads, ref, st, tbl, toff, num_blocks, caching,
         unhashed_to_head):
    """Release a request's blocks, last first: blocks without a hash to the queue head
    (0.24+), the others to the tail (§3.5)."""
    tail = len(qnext) - 1
    p = tail - 1                      # the head sentinel
    for j in range(num_blocks - 1, -1, -1):
        b = tbl[toff + j]
        if b != 0:
            ref[b] -= 1
            if ref[b] == 0 and key[b] == 0:
                st[ST_EMPTY] += 1
    for j in range(num_blocks - 1, -1, -1):
        b = tbl[toff + j]
        if b != 0 and ref[b] == 0 and unhashed_to_head and (key[b] == 0 or not caching):
            _link_after(qnext, qprev, p, b)
            p = b
            st[ST_FREE] += 1
    for j in range(num_blocks - 1, -1, -1):
        b = tbl[toff + j]
        if b != 0 and ref[b] == 0 and not (unhashed_to_head and (key[b] == 0 or not caching)):
            _link_after(qnext, qprev, qprev[tail], b)
            st[ST_FREE] += 1


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
                _note_peak(key, st)
            if caching:
                num_cached[r] = cache_full(key, dnext, dprev, tkeys, theads, st, tbl, offs[r], keys, offs[r],
                                           num_cached[r], num_keys[r], c + 1 - lag, B)


@njit(cache=True)
def run_sequential(i0, i1, L, M, read, keys, key_off, B, unhashed_to_head,
                   qnext, qprev, key, dnext, dprev, tkeys, theads, ref, st, tbl, hits,
                   out_cached, out_rejected, out_evicted, peak_in_use):
    """Replay requests i0..i1-1, one at a time, each from admission to free: the request life
    of :mod:`kvsim.engines.vllm.sequential` on the kernels above."""
    N = len(key)
    for i in range(i0, i1):
        if not fits_ever_jit(L[i], M[i], B, N):
            out_rejected[i] = True  # can never be scheduled (§1 note)
            continue
        k0 = key_off[i]
        cap = lookup_cap_blocks_jit(L[i], B) if read[i] else 0
        h = lookup(tkeys, theads, keys, k0, cap, hits)
        evicted = st[ST_EVICTED]
        slots = L[i] + M[i] - 1          # the last sampled token is never computed
        nblocks, _ = allocate(qnext, qprev, key, dnext, dprev, tkeys, theads, ref, st, tbl, 0, keys, k0,
                              0, 0, False, kept_blocks_jit(L[i], M[i], B), slots, slots, hits[:h], -1, 0, True, B)
        peak_in_use[0] = max(peak_in_use[0], peak_blocks_jit(L[i], M[i], B))
        free(qnext, qprev, key, dnext, dprev, tkeys, theads, ref, st, tbl, 0, nblocks, True, unhashed_to_head)
        out_cached[i] = h * B
        out_evicted[i] = st[ST_EVICTED] - evicted


@njit(cache=True)
def run_unlimited(order, L, read, keys, key_off, B, tkeys, out_cached):
    """:func:`run_sequential` on a pool that never evicts, over the requests ``order`` (in that
    order, from an empty cache): a request hits the longest prefix of its lookup blocks that a
    request before it kept, then keeps every block it filled (a set of keys: with nothing evicted
    the free queue, the block ids and the duplicates change no hit; §3.3). ``tkeys``: an empty
    table (:mod:`kvsim.kernels.table`) with room for every key of ``order``'s requests."""
    for i in order:
        if L[i] <= 0:
            continue                    # never scheduled (fits_ever): keeps nothing
        k0 = key_off[i]
        cap = lookup_cap_blocks_jit(L[i], B) if read[i] else 0
        h = 0
        while h < cap and tkeys[probe(tkeys, keys[k0 + h])] == keys[k0 + h]:
            h += 1
        out_cached[i] = h * B
        for j in range(k0, key_off[i + 1]):
            s = probe(tkeys, keys[j])
            tkeys[s] = keys[j]


# -- the scheduler's manager -----------------------------------------------------------------

_NO_HITS = np.zeros(0, np.int32)


def _lengths(index: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    return (offsets[index + 1] - offsets[index]).astype(np.int64)


def _starts(counts: np.ndarray) -> np.ndarray:
    """Where each of consecutive runs of ``counts`` starts."""
    off = np.zeros(len(counts), np.int64)
    if len(counts):
        np.cumsum(counts[:-1], out=off[1:])
    return off


@dataclass(frozen=True)
class LogKeys:
    """A log's requests keyed once (:meth:`JitKVCacheManager.log_keys`): request i's keys,
    prompt then outputs, are ``keys[off[i]:off[i] + count[i]]``, the first ``prompt[i]`` its
    prompt's full blocks (0 keys for requests left out)."""

    block_size: int
    keys: np.ndarray        # uint64
    off: np.ndarray         # int64 (n,)
    count: np.ndarray       # int64 (n,)
    prompt: np.ndarray      # int64 (n,)
    every: np.ndarray       # uint64 (n,): each request's namespace keys (LoRA, on every block;
    first: np.ndarray       # uint64 (n,): salt, on block 0), what its keys were hashed under


class JitSequence:
    """A request as the compiled manager sees it: its arena region and its scalars."""

    __slots__ = ("request_id", "num_prompt_tokens", "n", "off", "cap", "num_blocks", "num_cached",
                 "allocated", "tail", "every", "first", "exact", "cache", "num_computed_tokens",
                 "planned_ids", "skip_read")

    @property
    def block_hashes(self) -> np.ndarray:
        """The keys of the full blocks known so far (a view)."""
        nk = self.n // self.cache.block_size
        return self.cache.keys[self.off:self.off + nk]

    @property
    def num_tokens(self) -> int:
        return self.n


class JitKVCacheManager:
    """vLLM 0.33's ``KVCacheManager`` operations, as its scheduler calls them, on the kernels above.

    The same operations and results as :class:`kvsim.engines.vllm.manager.KVCacheManager`
    (``tests/test_sched_vllm_fast.py``). Block tables and block keys live in two arenas; a
    request holds a region of each (released when it finishes; the arenas are compacted when
    full). A request's prompt, and the outputs it will sample when they are known (a replay's
    logged ones), are hashed once at arrival; a key counts once its tokens have been appended,
    and a sampled token off the plan is hashed when it fills a block (the fast hash; exact
    sha256 keys are vLLM's digests numbered in order of first appearance).
    """

    def __init__(self, num_gpu_blocks: int, block_size: int, enable_caching: bool = True,
                 max_model_len: int = 1 << 62, watermark: float = 0.0, hash_algo: str = "fast") -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.unhashed_to_head = PROFILES["0.33"].free_unhashed_to_head
        self.pool = PoolArrays(num_gpu_blocks)
        self.hasher = BlockHasher(block_size, hash_algo)
        self._digest_ids: dict[bytes, int] = {}
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self._hits = np.zeros(16, np.int32)
        # the arenas: request tables and keys, regions handed out in order, compacted when full
        self.tbl = np.zeros(1 << 12, np.int32)
        self.keys = np.zeros(1 << 12, np.uint64)
        self._top = 0
        self._live: dict[int, JitSequence] = {}
        self.log: LogKeys | None = None     # a fleet's requests, keyed once (prompt_keys reads it)

    # -- requests ----------------------------------------------------------------------
    def new_sequence(self, request_id: str, prompt: Seq[int], lora: str | None = None,
                     cache_salt: str | None = None, outputs: Seq[int] | None = None,
                     skip_reading_prefix_cache: bool = False) -> JitSequence:
        """A request; ``outputs``, the tokens it will sample if known, are hashed ahead (the
        keys count once those tokens are appended; a different token drops the plan).
        ``skip_reading_prefix_cache``: a prompt-logprob request, whose lookups always miss (§2.1)."""
        B = self.block_size
        prompt = np.asarray(prompt)
        if prompt.dtype.kind not in "iu":
            prompt = prompt.astype(np.int64)
        L = len(prompt)
        max_outputs = 0 if outputs is None else len(outputs)
        seq = JitSequence()
        seq.request_id, seq.num_prompt_tokens, seq.n, seq.cache = request_id, L, L, self
        seq.num_blocks = seq.num_cached = seq.num_computed_tokens = 0
        seq.allocated = False
        seq.skip_read = skip_reading_prefix_cache
        seq.every, seq.first = self.hasher.fast_namespace_keys(lora, cache_salt)
        seq.cap = 0
        self._place(seq, (L + max_outputs) // B + 2)
        nfull = L // B
        seq.tail = prompt[nfull * B:].tolist() + [0] * (B - L + nfull * B)   # the partial block's tokens
        seq.planned_ids = None
        if self.hasher.algo == "fast":
            seq.exact = None
            fast_hash_sequence(prompt, 0, nfull, B, np.uint64(hashing.FAST_ROOT), np.uint64(seq.every),
                               np.uint64(seq.first), self.keys[seq.off:seq.off + nfull])
            if max_outputs:             # the blocks after the prompt's full ones, planned outputs included
                planned = np.asarray(outputs, np.int64)
                seq.planned_ids = planned.tolist()
                rest = np.concatenate([prompt[nfull * B:], planned])
                if len(rest) >= B:
                    self._hash_filled(seq, rest, nfull, len(rest) // B)
        else:
            seq.exact = Sequence(request_id, [], L, None, lora, cache_salt)
            seq.exact.tokens = [int(t) for t in prompt.tolist()]
            self._exact_keys(seq, 0)
        return seq

    def key_requests(self, index: np.ndarray, prompt_tok: np.ndarray, prompt_off: np.ndarray, out_tok: np.ndarray,
                     out_off: np.ndarray, loras: list | None, salts: list | None) -> tuple[JitSequence, np.ndarray]:
        """The keys of requests ``index`` (prompt ``prompt_tok[prompt_off[i]:prompt_off[i+1]]``,
        then its outputs, all known: a replay's), the fast hash, in one call: the arena offset
        of each request's keys, and the one region holding them all (release it when done).
        Each request's keys are those :meth:`new_sequence` gives it with those outputs; without
        prefix caching nothing reads them, and none are computed."""
        L, M = _lengths(index, prompt_off), _lengths(index, out_off)
        caps = (L + M) // self.block_size + 2
        region = JitSequence()
        region.request_id, region.cap, region.cache = "", 0, self
        self._place(region, max(int(caps.sum()), 1))
        off = _starts(caps) + region.off
        if self.enable_caching:
            every, first = self._namespace_keys(index, loras, salts)
            hash_requests(prompt_tok, prompt_off[index], L, out_tok, out_off[index], M, self.block_size, every, first,
                          off, self.keys)
        return region, off

    def log_keys(self, index: np.ndarray, prompt_tok: np.ndarray, prompt_off: np.ndarray, out_tok: np.ndarray,
                 out_off: np.ndarray, loras: list | None, salts: list | None) -> LogKeys:
        """:meth:`key_requests` into arrays of their own (a fleet's requests, keyed once for
        every replica and the router: :meth:`place_keys`, :meth:`prompt_keys`)."""
        L, M = _lengths(index, prompt_off), _lengths(index, out_off)
        B = self.block_size
        counts = np.zeros(len(prompt_off) - 1, np.int64)
        counts[index] = (L + M) // B
        off = _starts(counts)
        keys = np.zeros(int(counts.sum()), np.uint64)
        every, first = self._namespace_keys(index, loras, salts)
        starts, ostarts, kstarts = prompt_off[index], out_off[index], off[index]
        parts = [slice(0, len(index))]
        if len(index) > 1 and int(L.sum() + M.sum()) >= PARALLEL_KEYING_TOKENS and _cores() > 1:
            parts = [slice(0, len(index) // 2), slice(len(index) // 2, len(index))]
        # each part's requests into their own key regions, the first on a thread of its own
        # (the kernel built ahead of time runs without the GIL)
        work = [(prompt_tok, starts[p], L[p], out_tok, ostarts[p], M[p], B, every[p], first[p], kstarts[p], keys)
                for p in parts]
        if len(work) == 1:
            hash_requests(*work[0])
        else:               # (the thread ends here: nothing is left running should the process fork)
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvsim-keys") as helper:
                first_part = helper.submit(hash_requests, *work[0])
                hash_requests(*work[1])
                first_part.result()
        prompt = np.zeros(len(counts), np.int64)
        prompt[index] = L // B
        all_every, all_first = np.zeros(len(counts), np.uint64), np.zeros(len(counts), np.uint64)
        all_every[index], all_first[index] = every, first
        return LogKeys(B, keys, off, counts, prompt, all_every, all_first)

    def _namespace_keys(self, index: np.ndarray, loras: list | None, salts: list | None) -> tuple[np.ndarray, np.ndarray]:
        picked = index.tolist()
        return self.hasher.fast_namespace_arrays([None] * len(picked) if loras is None else [loras[i] for i in picked],
                                                 [None] * len(picked) if salts is None else [salts[i] for i in picked])

    def place_keys(self, keys: np.ndarray, cap: int) -> JitSequence:
        """A request whose keys are known (a :class:`LogKeys` view): a region of ``cap`` blocks
        holding them, as :meth:`new_sequence` would place and key it."""
        seq = JitSequence()
        seq.request_id, seq.cap, seq.cache = "", 0, self
        self._place(seq, cap)
        self.keys[seq.off:seq.off + len(keys)] = keys
        return seq

    def append(self, seq: JitSequence, token: int) -> None:
        """A sampled token joins the sequence; a block it fills is hashed at once."""
        n = seq.n
        if seq.planned_ids is not None:
            i = n - seq.num_prompt_tokens
            if i < len(seq.planned_ids) and seq.planned_ids[i] == token:
                seq.n = n + 1           # its key, if it fills a block, is there already
                return
            self._drop_plan(seq)
        B = self.block_size
        if seq.exact is not None:
            seq.exact.tokens.append(int(token))
        seq.tail[n % B] = token
        seq.n = n = n + 1
        if n % B == 0:
            self._hash_filled(seq, np.array(seq.tail, np.int64), n // B - 1, 1)

    def append_many(self, seq: JitSequence, tokens: np.ndarray) -> None:
        """Several sampled tokens at once (the same keys as one by one)."""
        if seq.planned_ids is not None:
            i = seq.n - seq.num_prompt_tokens
            if seq.planned_ids[i:i + len(tokens)] == np.asarray(tokens).tolist():
                seq.n += len(tokens)
                return
            self._drop_plan(seq)
        B = self.block_size
        if seq.exact is not None:
            seq.exact.tokens.extend(int(t) for t in tokens)
        part = seq.n % B
        joined = np.concatenate([np.array(seq.tail[:part], np.int64), np.asarray(tokens, np.int64)])
        nfull = len(joined) // B
        seq.n += len(tokens)
        if nfull:
            self._hash_filled(seq, joined, seq.n // B - nfull, nfull)
        rest = len(joined) - nfull * B
        seq.tail[:rest] = joined[nfull * B:].tolist()

    def _drop_plan(self, seq: JitSequence) -> None:
        """The sampled tokens leave the plan: keys are computed as blocks fill from now on."""
        B, L, n = self.block_size, seq.num_prompt_tokens, seq.n
        known = seq.tail[:L % B] + seq.planned_ids[:n - L]     # tokens from block L // B on
        start = (n // B) * B - (L // B) * B
        seq.tail = known[start:] + [0] * (B - (n - (n // B) * B))
        seq.planned_ids = None

    def _hash_filled(self, seq: JitSequence, tokens: np.ndarray, first_block: int, count: int) -> None:
        """Keys of the ``count`` blocks from ``first_block`` on; ``tokens`` starts at that block."""
        if seq.exact is not None:
            self._exact_keys(seq, first_block)
            return
        self._room(seq, first_block + count + 2)
        o = seq.off + first_block
        parent = self.keys[o - 1] if first_block else np.uint64(hashing.FAST_ROOT)
        fast_hash_sequence(tokens, 0, count, self.block_size, parent, np.uint64(seq.every),
                           np.uint64(seq.first if first_block == 0 else 0), self.keys[o:o + count])

    def _exact_keys(self, seq: JitSequence, start: int) -> None:
        """vLLM's digests of the newly full blocks, numbered in order of first appearance."""
        self.hasher.extend(seq.exact)
        digests = seq.exact.block_hashes[start:]
        self._room(seq, start + len(digests) + 2)
        ids = self._digest_ids
        self.keys[seq.off + start:seq.off + start + len(digests)] = [ids.setdefault(d, len(ids) + 1)
                                                                     for d in digests]

    # -- arenas --------------------------------------------------------------------------
    def _room(self, seq: JitSequence, blocks: int) -> None:
        if blocks > seq.cap:
            self._place(seq, max(blocks, 2 * seq.cap))

    def _place(self, seq: JitSequence, cap: int) -> None:
        """Give ``seq`` a region of ``cap`` blocks (moving what it holds), compacting when full."""
        held = None
        if seq.cap:
            held = (self.tbl[seq.off:seq.off + seq.cap].copy(), self.keys[seq.off:seq.off + seq.cap].copy())
        self._live.pop(id(seq), None)
        if self._top + cap > len(self.tbl):
            self._compact(cap)
        seq.off, seq.cap = self._top, cap
        self._top += cap
        if held is not None:
            self.tbl[seq.off:seq.off + len(held[0])] = held[0]
            self.keys[seq.off:seq.off + len(held[1])] = held[1]
        self._live[id(seq)] = seq

    def _compact(self, extra: int) -> None:
        live = list(self._live.values())
        need = sum(s.cap for s in live) + extra
        size = len(self.tbl)
        while size < 2 * need:
            size *= 2
        tbl, keys, top = np.zeros(size, np.int32), np.zeros(size, np.uint64), 0
        for s in live:
            tbl[top:top + s.cap] = self.tbl[s.off:s.off + s.cap]
            keys[top:top + s.cap] = self.keys[s.off:s.off + s.cap]
            s.off, top = top, top + s.cap
        self.tbl, self.keys, self._top = tbl, keys, top

    def release(self, seq: JitSequence) -> None:
        """A finished request: its regions may be reused."""
        self._live.pop(id(seq), None)

    # -- what a router reads (kvsim.engines.vllm.events.DeviceBlocks) ------------------
    def prompt_keys(self, tokens: np.ndarray, lora: str | None = None, cache_salt: str | None = None,
                    index: int | None = None) -> np.ndarray:
        """The keys this pool gives the full blocks of ``tokens`` (the fast hash); of request
        ``index``'s prompt, a view of the fleet's :class:`LogKeys` where it was keyed once."""
        logged = None if index is None else self.logged_prompt_keys(index)
        if logged is not None:
            return logged
        B = self.block_size
        every, first = self.hasher.fast_namespace_keys(lora, cache_salt)
        out = np.zeros(len(tokens) // B, np.uint64)
        fast_hash_sequence(np.asarray(tokens), 0, len(out), B, np.uint64(hashing.FAST_ROOT), np.uint64(every),
                           np.uint64(first), out)
        return out

    def logged_prompt_keys(self, index: int) -> np.ndarray | None:
        """Request ``index``'s prompt keys as a view of the fleet's :class:`LogKeys`, where the
        log was keyed once for this pool's block size; else None."""
        log = self.log
        if log is None or log.block_size != self.block_size:
            return None
        o = log.off[index]
        return log.keys[o:o + log.prompt[index]]

    def held_prefix(self, keys: np.ndarray) -> int:
        """How many leading ``keys`` are cached in the pool (no last-token cap)."""
        if len(self._hits) < len(keys):
            self._hits = np.zeros(2 * len(keys), np.int32)
        p = self.pool
        return int(lookup(p.tkeys, p.theads, keys, 0, len(keys), self._hits))

    # -- the manager's operations ------------------------------------------------------
    def lookup(self, seq: JitSequence) -> tuple[np.ndarray, int]:
        """``get_computed_blocks``: cached full blocks, at most ``num_tokens - 1`` tokens."""
        if not self.enable_caching or seq.skip_read:
            return _NO_HITS, 0
        cap = rules.lookup_cap_blocks(seq.n, self.block_size)
        if len(self._hits) < cap:
            self._hits = np.zeros(2 * cap, np.int32)
        p = self.pool
        h = lookup(p.tkeys, p.theads, self.keys, seq.off, cap, self._hits)
        return self._hits[:h].copy(), h * self.block_size

    def allocate(self, seq: JitSequence, num_computed: int, num_new_tokens: int, num_new_computed: int = 0,
                 hits: np.ndarray | None = None, full_sequence_must_fit: bool = False,
                 apply_watermark: bool = False) -> bool:
        """``allocate_slots``; False (nothing changed) when the blocks do not fit.

        The watermark adds ``watermark_blocks`` to the blocks needed by both of vLLM's
        checks (docs/engines/vllm-scheduler.md §3.3).
        """
        B = self.block_size
        computed = num_computed + num_new_computed
        num_slots = computed + num_new_tokens
        if num_slots > self.max_model_len:
            num_slots = self.max_model_len
        if hits is None and seq.allocated and not full_sequence_must_fit and seq.num_blocks * B >= num_slots:
            # the blocks already hold the new tokens: nothing to do unless a block becomes full
            if not self.enable_caching or (num_slots if num_slots < seq.n else seq.n) // B <= seq.num_cached:
                return True
        if hits is None or len(hits) == 0:
            hits = _NO_HITS
        self._room(seq, -(-num_slots // B) + 1)
        reserve = self.watermark_blocks if apply_watermark else 0
        gate = min(seq.n, self.max_model_len) if full_sequence_must_fit else -1
        nb, nc = allocate(*self.pool.arrays, self.tbl, seq.off, self.keys, seq.off, seq.num_blocks,
                          seq.num_cached, seq.allocated, seq.n // B, num_slots, min(computed + num_new_tokens, seq.n),
                          hits, gate, reserve, self.enable_caching, B)
        if nb < 0:
            return False
        seq.num_blocks, seq.num_cached, seq.allocated = nb, nc, True
        return True

    def fits(self, seq: JitSequence, num_new_tokens: int, num_hits: int, hits: np.ndarray,
             full_sequence_must_fit: bool, apply_watermark: bool) -> bool:
        """Whether ``allocate`` would admit this waiting request now (a dry run: nothing changes)."""
        p, mml = self.pool, self.max_model_len
        free = p.num_free_blocks - (self.watermark_blocks if apply_watermark else 0)
        held = seq.num_blocks if seq.allocated else 0
        gate = min(seq.n, mml) if full_sequence_must_fit else -1
        return bool(fits(hits if len(hits) else _NO_HITS, held, min(num_hits + num_new_tokens, mml),
                         gate, free, p.ref, self.block_size))

    def num_cached_blocks(self, seq: JitSequence) -> int:
        return seq.num_cached if seq.allocated else 0

    def cache_blocks(self, seq: JitSequence, num_tokens: int) -> None:
        B = self.block_size
        if (num_tokens if num_tokens < seq.n else seq.n) // B <= seq.num_cached:
            return
        p = self.pool
        seq.num_cached = cache_full(p.key, p.dnext, p.dprev, p.tkeys, p.theads, p.st, self.tbl, seq.off, self.keys,
                                    seq.off, seq.num_cached, seq.n // B, num_tokens, B)

    block_openings = staticmethod(rules.block_openings)

    def decode_steps(self, seqs: list[JitSequence], computed: list[int], k: int, lag: int) -> None:
        """``k`` decode steps of running requests at once, in vLLM's order of pool operations
        (tokens appended already; the blocks must fit: the caller checks)."""
        B = self.block_size
        for s, c in zip(seqs, computed):
            self._room(s, (c + k) // B + 2)
        offs = np.array([s.off for s in seqs], np.int64)
        nb = np.array([s.num_blocks for s in seqs], np.int64)
        nc = np.array([s.num_cached for s in seqs], np.int64)
        nk = np.array([s.n // B for s in seqs], np.int64)
        decode_steps(*self.pool.arrays, self.tbl, self.keys, offs, np.asarray(computed, np.int64), nb, nc, nk, k,
                     lag, self.enable_caching, B)
        for s, b, c in zip(seqs, nb.tolist(), nc.tolist()):
            s.num_blocks, s.num_cached = b, c

    def free(self, seq: JitSequence) -> None:
        """Release every block of a finished or preempted request, last block first."""
        if not seq.allocated:
            return
        free(*self.pool.arrays, self.tbl, seq.off, seq.num_blocks, self.enable_caching, self.unhashed_to_head)
        seq.num_blocks = seq.num_cached = 0
        seq.allocated = False

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def free_block_ids(self) -> list[int]:
        return self.pool.free_block_ids()
