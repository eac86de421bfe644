"""The fast APC engine: the sequential replay of ``apc.py`` as one compiled loop over flat arrays.

Same rules as the reference model (``docs/engines/apc.md §2–§4``), on arrays instead of
objects: the free queue is a doubly linked list over block ids, the cache map an
open-addressing table (:mod:`kvsim.kernels.table`) from 64-bit block keys to the earliest
block registered under the key,
with an insertion-ordered list per key for duplicates. In a sequential replay one request
runs alone from admission to free, so its whole life is applied at once, which gives the
same state as vLLM's step-by-step calls:

1. lookup: walk the request's block keys up to ``(L-1)//B`` blocks until the first miss;
2. touch the hits (they leave the free queue), then pop the ``ceil((L+M-1)/B) - hits``
   blocks its prefill and decode steps take from the queue head, evicting their hashes;
3. register the blocks that became full, ``floor((L+M-1)/B)`` in all (the block of the
   final sampled token is never computed, so never cached);
4. free in reverse order: unhashed blocks to the queue head (0.24+), hashed ones to the tail.

Block keys are precomputed for every request (``fast`` 64-bit hashes, or vLLM's exact
sha256 digests numbered in order of first appearance).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from kvsim.engines.vllm import hashing

from kvsim.engines.vllm import rules
from kvsim.engines.vllm.pool import PoolState
from kvsim.engines.vllm.rules import fits_ever_jit, kept_blocks_jit, lookup_cap_blocks_jit, peak_blocks_jit
from kvsim.engines.vllm.settings import APCSettings
from kvsim.engines.base import Progress, Request, SequentialCache, Served, ServedColumns, Workload
from kvsim.errors import ConfigError
from kvsim.kernels.table import delete, grow_table, new_table, probe, table_size

_EMPTY = -1


@dataclass
class FastWorkload:
    """A trace flattened for the engine: per request L, M, read flag, and its block keys."""

    prompt_len: np.ndarray     # int64 (n,)
    output_len: np.ndarray     # int64 (n,), >= 1
    read: np.ndarray           # bool (n,): may read the cache (no prompt logprobs)
    keys: np.ndarray           # uint64: keys of blocks 0..floor((L+M-1)/B)-1 of every request
    key_off: np.ndarray        # int64 (n+1,)
    block_size: int

    @property
    def blocks_needed(self) -> np.ndarray:
        """Peak blocks of each request (rules.peak_blocks)."""
        return rules.peak_blocks(self.prompt_len, self.output_len, self.block_size)


def build_workload(prompt_tok: np.ndarray, prompt_off: np.ndarray, out_tok: np.ndarray,
                   out_off: np.ndarray, read: np.ndarray, lora: list[tuple[str, str] | None],
                   salt: list[str | None], block_size: int, algo: str = "fast",
                   digest_ids: dict[bytes, int] | None = None) -> FastWorkload:
    """Compute every request's block keys (prompt + outputs) with the chosen hash.

    Exact digests are numbered in order of first appearance in ``digest_ids`` (pass the
    same dict to keep the numbering across calls)."""
    L = np.diff(prompt_off).astype(np.int64)
    M = np.maximum(np.diff(out_off).astype(np.int64), 1)
    nblocks = np.where(L > 0, rules.kept_blocks(L, M, block_size), 0).astype(np.int64)
    key_off = np.zeros(len(L) + 1, np.int64)
    key_off[1:] = np.cumsum(nblocks)
    keys = np.zeros(int(key_off[-1]), np.uint64)
    if algo == "fast":
        every = np.array([0 if ns is None else hashing.namespace_key("lora", *ns) for ns in lora], np.uint64)
        first = np.array([hashing.namespace_key("cache_salt", s) if s else 0 for s in salt], np.uint64)
        hashing.fast_hash_requests(prompt_tok, prompt_off, out_tok, out_off, nblocks, block_size,
                                   every, first, key_off, keys)
    else:
        ids = {} if digest_ids is None else digest_ids
        for i in range(len(L)):
            if nblocks[i] == 0:
                continue
            seq = np.concatenate([prompt_tok[prompt_off[i]:prompt_off[i + 1]],
                                  out_tok[out_off[i]:out_off[i + 1]]]).tolist()
            digests = hashing.exact_block_hashes(seq[: nblocks[i] * block_size], block_size, algo,
                                                 lora[i], salt[i])
            keys[key_off[i]:key_off[i + 1]] = [ids.setdefault(d, len(ids) + 1) for d in digests]
    return FastWorkload(L, M, np.asarray(read, bool), keys, key_off, block_size)


# -- state ---------------------------------------------------------------------------------

# slots of the scalar state array
ST_EMPTY, ST_PEAK_USED, ST_PEAK_IN_USE, ST_EVICTED, ST_KEYS = 0, 1, 2, 3, 4


class FastState:
    """The engine's arrays: free queue, block keys, the key table and the per-key lists."""

    def __init__(self, num_blocks: int, max_keys: int, max_request_blocks: int) -> None:
        n = num_blocks
        self.num_blocks = n
        self.head, self.tail = n, n + 1
        self.qnext = np.empty(n + 2, np.int32)
        self.qprev = np.empty(n + 2, np.int32)
        # initial queue: 1 .. n-1 (block 0 is the null block)
        ids = np.arange(1, n, dtype=np.int32)
        self.qnext[self.head] = 1 if n > 1 else self.tail
        self.qprev[self.tail] = n - 1 if n > 1 else self.head
        self.qnext[ids] = ids + 1
        self.qprev[ids] = ids - 1
        if n > 1:
            self.qnext[n - 1] = self.tail
            self.qprev[1] = self.head
        self.key = np.zeros(n, np.uint64)          # 0 = no hash
        self.dnext = np.full(n, -1, np.int32)      # next block with the same key
        self.dprev = np.full(n, -1, np.int32)      # previous one; the first holds the last
        # the cache map: block key -> the earliest block registered under it (kvsim.kernels.table)
        self.tkeys, self.theads = new_table(table_size(max_keys), np.int32)
        self.st = np.zeros(8, np.int64)
        self.st[ST_EMPTY] = n - 1
        self.buf = np.zeros(max(max_request_blocks, 1), np.int32)

    def reserve(self, max_keys: int, max_request_blocks: int) -> None:
        """Grow the key table (rehashed) and the request buffer when later work needs more."""
        self.tkeys, self.theads = grow_table(self.tkeys, self.theads, max_keys)
        if len(self.buf) < max_request_blocks:
            self.buf = np.zeros(max_request_blocks, np.int32)

    def free_queue(self) -> list[int]:
        """Free block ids, head (next victim) first."""
        out, b = [], int(self.qnext[self.head])
        while b != self.tail:
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


# -- compiled pieces -----------------------------------------------------------------------

@njit(cache=True)
def _get(tkeys, theads, key):
    """The earliest block cached under ``key``, or -1."""
    s = probe(tkeys, key)
    return theads[s] if tkeys[s] == key else _EMPTY


@njit(cache=True)
def _insert(tkeys, theads, dnext, dprev, key, b):
    """Register block b under key, after any blocks already there (no de-duplication)."""
    s = probe(tkeys, key)
    if tkeys[s] == key:
        first = theads[s]
        last = dprev[first]
        dnext[last] = b
        dprev[b] = last
        dnext[b] = -1
        dprev[first] = b
        return 0
    tkeys[s] = key
    theads[s] = b
    dprev[b] = b
    dnext[b] = -1
    return 1


@njit(cache=True)
def _remove(tkeys, theads, dnext, dprev, key, b):
    """Unregister block b from key; the key stays while other blocks hold it."""
    s = probe(tkeys, key)
    first = theads[s]
    nxt = dnext[b]
    if b == first:
        if nxt == -1:
            delete(tkeys, theads, s)
            return 1
        dprev[nxt] = dprev[b]
        theads[s] = nxt
    else:
        prv = dprev[b]
        dnext[prv] = nxt
        if nxt == -1:
            dprev[first] = prv
        else:
            dprev[nxt] = prv
    return 0


@njit(cache=True)
def run_sequential(i0, i1, L, M, read, keys, key_off, B, N, unhashed_to_head,
                   qnext, qprev, head, tail, key, dnext, dprev, tkeys, theads, st, buf,
                   out_cached, out_rejected, out_evicted):
    """Replay requests i0..i1-1, one at a time, each from admission to free."""
    for i in range(i0, i1):
        Li = L[i]
        if not fits_ever_jit(Li, M[i], B, N):
            out_rejected[i] = True  # can never be scheduled (§1 note)
            continue
        total = peak_blocks_jit(Li, M[i], B)
        k0 = key_off[i]
        # 1. lookup: hits capped so that at least one token is recomputed (§2.2)
        h = 0
        if read[i]:
            cap = lookup_cap_blocks_jit(Li, B)
            while h < cap:
                b = _get(tkeys, theads, keys[k0 + h])
                if b == _EMPTY:
                    break
                buf[h] = b
                h += 1
        # 2. touch hits (leave the queue) before popping new blocks (§3.2, S6)
        for j in range(h):
            b = buf[j]
            p, n = qprev[b], qnext[b]
            qnext[p] = n
            qprev[n] = p
        ev = 0
        for j in range(h, total):
            b = qnext[head]
            n = qnext[b]
            qnext[head] = n
            qprev[n] = head
            k = key[b]
            if k != 0:  # lazy eviction: the hash goes when the block is reused (§3.3)
                st[ST_KEYS] -= _remove(tkeys, theads, dnext, dprev, k, b)
                key[b] = 0
                ev += 1
            else:
                st[ST_EMPTY] -= 1
            buf[j] = b
        used = N - 1 - st[ST_EMPTY]
        st[ST_PEAK_USED] = max(st[ST_PEAK_USED], used)
        st[ST_PEAK_IN_USE] = max(st[ST_PEAK_IN_USE], total)
        # 3. cache the blocks that became full; never the final token's block (§4.1)
        nfull = kept_blocks_jit(Li, M[i], B)
        for j in range(h, nfull):
            b = buf[j]
            k = keys[k0 + j]
            key[b] = k
            st[ST_KEYS] += _insert(tkeys, theads, dnext, dprev, k, b)
        # 4. free, last block first (§3.5)
        if unhashed_to_head:
            for j in range(total):  # prepend_n(reversed blocks): the last block ends first
                b = buf[j]
                if key[b] == 0:
                    n = qnext[head]
                    qnext[head] = b
                    qprev[b] = head
                    qnext[b] = n
                    qprev[n] = b
                    st[ST_EMPTY] += 1
        for j in range(total - 1, -1, -1):
            b = buf[j]
            if unhashed_to_head and key[b] == 0:
                continue
            if key[b] == 0:
                st[ST_EMPTY] += 1
            p = qprev[tail]
            qnext[p] = b
            qprev[b] = p
            qnext[b] = tail
            qprev[tail] = b
        out_cached[i] = h * B
        out_evicted[i] = ev
        st[ST_EVICTED] += ev


class APCFast(SequentialCache):
    """vLLM APC's compiled sequential engine, on one pool that lives across calls.

    :meth:`replay` hashes a whole workload at once and runs the compiled loop over it in
    chunks; :meth:`serve` runs one request through the same loop. The pool is created on
    first use: ``num_gpu_blocks`` from the settings, or (unlimited) enough for the first
    workload replayed.
    """

    def __init__(self, settings: APCSettings) -> None:
        self.settings = settings
        self.state: FastState | None = None
        self.num_blocks: int | None = settings.num_gpu_blocks
        self._digest_ids: dict[bytes, int] = {}   # exact hashes -> keys, across calls

    def _lora_salt(self, lora: list, salt: list) -> tuple[list, list]:
        paths = self.settings.lora_paths
        return [None if n is None else (n, paths.get(n, n)) for n in lora], list(salt)

    def workload(self, work: Workload) -> FastWorkload:
        """Every request's block keys (prompt + outputs), hashed in one pass."""
        lora, salt = self._lora_salt(work.lora, work.cache_salt)
        return build_workload(work.prompt_tokens, work.prompt_offsets, work.output_tokens, work.output_offsets,
                              rules.reads_cache(work.prompt_logprobs), lora, salt, self.settings.block_size,
                              self.settings.hash_algo, self._digest_ids)

    def _pool(self, fw: FastWorkload) -> FastState:
        """The pool, created or grown so that the largest request of ``fw`` fits its buffer."""
        needed = fw.blocks_needed
        if self.num_blocks is None:  # unlimited: nothing is ever evicted
            self.num_blocks = rules.unlimited_num_blocks(fw.prompt_len, fw.output_len, fw.block_size)
        fits = rules.fits_ever(fw.prompt_len, fw.output_len, fw.block_size, self.num_blocks)
        max_req = int(needed[fits].max()) if fits.any() else 1
        if self.state is None:
            self.state = FastState(self.num_blocks, min(self.num_blocks, len(fw.keys) + 1), max_req)
        else:
            self.state.reserve(min(self.num_blocks, int(self.state.st[ST_KEYS]) + len(fw.keys) + 1), max_req)
        return self.state

    def replay(self, work: Workload, progress: Progress | None = None, chunk: int | None = None) -> ServedColumns:
        """Serve every request of ``work`` in order; the compiled loop runs ``chunk``
        requests per call (default: about 1/64 of the trace), reporting
        ``progress(done, total)`` in between."""
        return self.run(self.workload(work), progress, chunk)

    def run(self, fw: FastWorkload, progress: Progress | None = None, chunk: int | None = None) -> ServedColumns:
        """:meth:`replay` on an already hashed workload."""
        n = len(fw.prompt_len)
        chunk = chunk or max(1024, n // 64)
        s = self._pool(fw)
        B = fw.block_size
        cached = np.zeros(n, np.int64)
        rejected = np.zeros(n, np.bool_)
        evicted = np.zeros(n, np.int64)
        for i0 in range(0, n, chunk):
            i1 = min(n, i0 + chunk)
            run_sequential(i0, i1, fw.prompt_len, fw.output_len, fw.read, fw.keys, fw.key_off, B,
                           self.num_blocks, self.settings.profile.free_unhashed_to_head, s.qnext, s.qprev,
                           s.head, s.tail, s.key, s.dnext, s.dprev, s.tkeys, s.theads, s.st, s.buf,
                           cached, rejected, evicted)
            if progress is not None:
                progress(i1, n)
        return ServedColumns(cached, rejected, evicted * B, evicted, fw.output_len.copy(),
                             np.where(rejected, 0, fw.prompt_len - cached))

    def serve(self, req: Request) -> Served:
        if self.num_blocks is None:
            raise ConfigError("serving requests one by one needs a pool size (num_gpu_blocks)")
        one = Workload(np.asarray(req.prompt, np.int64), np.array([0, len(req.prompt)]),
                       np.asarray(req.output, np.int64), np.array([0, len(req.output)]), [req.lora],
                       [req.cache_salt], np.array([req.prompt_logprobs]), np.array([req.logprob_start_len]),
                       [req.request_id])
        cols = self.run(self.workload(one))
        return Served(*(col[0].item() for col in cols.__dict__.values()))

    # -- the pool ------------------------------------------------------------------------
    @property
    def peak_used_tokens(self) -> int:
        return 0 if self.state is None else int(self.state.st[ST_PEAK_USED]) * self.settings.block_size

    @property
    def peak_in_use_blocks(self) -> int:
        return 0 if self.state is None else int(self.state.st[ST_PEAK_IN_USE])

    def final_state(self) -> PoolState:
        chains = self.state.cached_blocks()
        return PoolState(self.state.free_queue(), len(chains), sum(map(len, chains.values())))
