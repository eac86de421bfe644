"""One vLLM request life, over either manager: the sequential replay (``docs/engines/apc.md §4``).

A request sent alone is looked up, allocated whole, decoded to its output length and freed:

1. lookup: the request's block keys up to ``(L-1)//B`` blocks, until the first miss (§2.2);
2. allocate: touch the hits (they leave the free queue), then pop the blocks its prefill
   and decode steps take from the queue head, evicting their hashes (§3.2, §3.3);
3. cache the blocks that became full, ``floor((L+M-1)/B)`` in all: the final sampled token
   is never computed, so its block is never cached (§4.1);
4. free in reverse order: unhashed blocks to the queue head (0.24+), hashed ones to the tail (§3.5).

With no other request running, nothing else touches the pool between the steps of one
request, so allocating a request's decode slots at once pops the same blocks, evicts the
same hashes and caches the same full blocks as vLLM's step-by-step calls.

:class:`APCReference` lives this life on the readable :class:`~kvsim.engines.vllm.manager.KVCacheManager`
(one scheduler step per token, as gpu-validate and small traces use it); :class:`APCFast`
runs it as one compiled loop over a whole workload
(:func:`kvsim.engines.vllm.manager_jit.run_sequential`), built from the manager's kernels;
numba is loaded only when it runs. Tests hold the two equal, per request and in the
pool's final state.

With an offload tier (``settings.offload``: vLLM's native CPU offloading or LMCache), each
request's connector calls run after its GPU life (:class:`~kvsim.tiers.setup.SequentialTier`):
in a sequential replay the GPU pool does not depend on the tier, because a load fills the
blocks the prefill would have popped, in the same order, and caches the same full blocks
(``docs/engines/offload.md §4``). The fast engine runs its compiled GPU loop, then the
readable tier for each request; the reported ``cached_tokens`` is vLLM's
``num_cached_tokens``, local + external (offload.md §1.12).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from kvsim.engines.base import Admission, PrefixCache, Progress, Request, SequentialCache, Served, ServedColumns, \
    Workload
from kvsim.engines.vllm import hashing, rules
from kvsim.engines.vllm.manager import KVCacheManager, PoolState, Sequence
from kvsim.engines.vllm.settings import APCSettings
from kvsim.errors import ConfigError


def _tier(settings: APCSettings):
    """The offload tier under the pool (its modules imported only with ``--offload``)."""
    from kvsim.tiers.setup import SequentialTier

    return SequentialTier(settings.offload, settings.block_size)


class APCReference(PrefixCache):
    """vLLM APC driven as the scheduler drives it: admit, one decode per token, free (§4).

    ``admit`` looks up and allocates the whole prompt, then samples the first output token;
    each ``decode`` computes the last sampled token (allocating one slot and caching blocks
    it completes) and samples the next; ``finish`` frees. The last sampled token is never
    computed, so the block it would complete is never cached (§4.1). ``manager_type`` is the
    KV-cache manager it drives (a subclass may bring another block pool).
    """

    manager_type: type = KVCacheManager

    def __init__(self, settings: APCSettings, record_events: bool = False) -> None:
        if settings.num_gpu_blocks is None:
            raise ConfigError("the stepwise APC model needs a pool size (num_gpu_blocks)")
        self.settings = settings
        self.page_size = settings.block_size
        self.profile = settings.profile
        self.manager = self.manager_type(settings.num_gpu_blocks, settings.block_size, profile=self.profile,
                                         record_events=record_events, hash_algo=settings.hash_algo,
                                         lora_paths=settings.lora_paths)
        self.pool = self.manager.pool
        self.peak_in_use_blocks = 0   # most blocks one served request held (serve)
        self.queries = 0   # vLLM prefix_cache_queries (tokens), as the metric counts them
        self.hits = 0      # vLLM prefix_cache_hits (tokens)
        self._seqs: dict[str, Sequence] = {}
        self.tier = None if settings.offload is None else _tier(settings)

    @classmethod
    def for_workload(cls, settings: APCSettings, work) -> "APCReference":
        """The model for replaying ``work``; an unlimited pool holds every block it takes."""
        if settings.num_gpu_blocks is None:
            settings = replace(settings, num_gpu_blocks=rules.unlimited_num_blocks(
                work.prompt_lengths, np.maximum(work.output_lengths, 1), settings.block_size))
        return cls(settings)

    @classmethod
    def for_validation(cls, settings: APCSettings, trace) -> tuple["APCReference", int]:
        """The model gpu-validate drives, and the pool pages it needs (``kvsim.gpu.cache_models``).

        Block ids leave vLLM's free queue lowest first (it starts as 1..N-1 and freed blocks
        go behind or in front of the untouched ones), so a slice never touches an id above
        the blocks it takes in all: the pool can stop there even when the capacity is larger.
        """
        slice_blocks = rules.unlimited_num_blocks(trace.prompt_lengths, np.maximum(trace.output_lengths, 1),
                                                  settings.block_size)
        num_blocks = slice_blocks if settings.num_gpu_blocks is None else settings.num_gpu_blocks
        return cls(replace(settings, num_gpu_blocks=num_blocks)), min(num_blocks, slice_blocks)

    token_slots = False     # admission tables hold block ids

    def decodes_after_admission(self, req: Request) -> int:
        return len(req.output) - 1

    def blocks_needed(self, req: Request) -> int:
        """Blocks a request holds at its peak (rules.peak_blocks)."""
        return int(rules.peak_blocks(len(req.prompt), max(len(req.output), 1), self.page_size))

    def fits_ever(self, req: Request) -> bool:
        """False for a request that can never be scheduled, even in an empty cache (§1 note)."""
        return bool(rules.fits_ever(len(req.prompt), max(len(req.output), 1), self.page_size,
                                    self.pool.num_blocks))

    def admit(self, req: Request) -> Admission | None:
        manager = self.manager
        seq = Sequence(req.request_id, list(req.prompt), len(req.prompt), manager.hasher, req.lora,
                       req.cache_salt, skip_reading_prefix_cache=req.prompt_logprobs)
        evicted = self.pool.num_evicted
        hits, num_hits = manager.lookup(seq)
        new = manager.allocate_slots(seq, seq.num_tokens - num_hits, num_hits, hits, full_sequence_must_fit=True)
        if new is None:
            return None
        if self.profile.stats_at_admission:
            manager.record_prefix_cache_stats(seq, num_hits)
        self._take_stats()
        seq.num_computed_tokens = seq.num_tokens
        self._seqs[req.request_id] = seq
        self._sample(req, seq)
        evicted = self.pool.num_evicted - evicted
        table = np.array(manager.block_ids(seq), np.int64)
        return Admission(num_hits, table, evicted * self.page_size, evicted)

    def can_decode(self, req: Request) -> bool:
        """Whether the next decode step finds a free block when it needs one."""
        seq = self._seqs[req.request_id]
        return self.manager.num_blocks_to_allocate(seq, seq.num_computed_tokens + 1, []) <= \
            self.pool.num_free_blocks

    def decode(self, req: Request) -> int:
        seq = self._seqs[req.request_id]
        evicted = self.pool.num_evicted
        if self.manager.allocate_slots(seq, 1) is None:
            raise RuntimeError(f"no free block for request {req.request_id}; check can_decode first")
        seq.num_computed_tokens += 1
        self._sample(req, seq)
        return (self.pool.num_evicted - evicted) * self.page_size

    def decode_rest(self, req: Request) -> None:
        """Every remaining decode step of a lone running request in one manager call (the
        module docstring says why that leaves the step-by-step state)."""
        seq = self._seqs[req.request_id]
        steps = len(req.output) - req.num_generated
        if steps <= 0:
            return
        seq.append([int(t) for t in req.output[req.num_generated:]])   # samples the rest
        if self.manager.allocate_slots(seq, steps) is None:              # computes all but the last
            raise RuntimeError(f"no free block for request {req.request_id}")
        seq.num_computed_tokens += steps
        req.num_generated = len(req.output)

    def finish(self, req: Request) -> int:
        seq = self._seqs.pop(req.request_id)
        self.manager.free(seq)
        return 0  # freeing never evicts: cached blocks stay until reused (§3.3)

    def used_tokens(self) -> int:
        return self.pool.used_blocks * self.page_size

    def block_table(self, req: Request) -> np.ndarray | None:
        """A running request's block ids, in token order."""
        seq = self._seqs.get(req.request_id)
        return None if seq is None else np.array(self.manager.block_ids(seq), np.int64)

    # -- SequentialCache ---------------------------------------------------------------
    def serve(self, req: Request, step_by_step: bool = True) -> Served:
        """Admit, decode to the output length, free. A request that can never fit is
        rejected and leaves the cache untouched (§1 note). ``step_by_step=False`` makes the
        decode steps one manager call (:meth:`decode_rest`: the same final pool)."""
        L, M = len(req.prompt), max(len(req.output), 1)
        if not self.fits_ever(req):
            if self.tier is not None:
                self.tier.rejected()
            return Served(0, True, 0, 0, M, 0)
        before = self.pool.num_evicted
        admission = self.admit(req)
        assert admission is not None, "a request that fits an idle cache was refused"
        if step_by_step:
            for _ in range(len(req.output) - 1):
                self.decode(req)
        else:
            self.decode_rest(req)
        self.peak_in_use_blocks = max(self.peak_in_use_blocks, self.blocks_needed(req))
        cached = admission.cached_tokens
        if self.tier is not None:   # the connector's calls for this request (offload.md §4)
            seq = self._seqs[req.request_id]
            cached += self.tier.serve(req.request_id, seq.block_hashes, L, M, cached, req.prompt_logprobs,
                                      seq.tokens)
        self.finish(req)
        evicted = self.pool.num_evicted - before
        return Served(cached, False, evicted * self.page_size, evicted, M, L - cached)

    @property
    def peak_used_tokens(self) -> int:
        return self.pool.peak_used_blocks * self.page_size

    def final_state(self) -> PoolState:
        return self.pool.state()

    def _sample(self, req: Request, seq: Sequence) -> None:
        """The engine appends the next output token (logged or synthesized)."""
        seq.append([int(req.output[req.num_generated])])
        req.num_generated += 1

    def _take_stats(self) -> None:
        stats = self.manager.make_prefix_cache_stats()
        if stats is not None:
            self.queries += stats.queries
            self.hits += stats.hits


# -- the compiled life -------------------------------------------------------------------------

@dataclass
class KeyedWorkload:
    """A workload with every request's block keys: per request L, M, read flag, and the keys
    of blocks ``0 .. floor((L+M-1)/B)-1`` (prompt and outputs), for the compiled replay."""

    prompt_len: np.ndarray     # int64 (n,)
    output_len: np.ndarray     # int64 (n,), >= 1
    read: np.ndarray           # bool (n,): may read the cache (no prompt logprobs)
    keys: np.ndarray           # uint64
    key_off: np.ndarray        # int64 (n+1,)
    block_size: int

    @property
    def blocks_needed(self) -> np.ndarray:
        """Peak blocks of each request (rules.peak_blocks)."""
        return rules.peak_blocks(self.prompt_len, self.output_len, self.block_size)


def keyed_from_log(L: np.ndarray, M: np.ndarray, read: np.ndarray, every: np.ndarray, first: np.ndarray,
                   block_size: int, log) -> KeyedWorkload | None:
    """The :class:`KeyedWorkload` of requests (``L``, ``M``, ``read``) whose keys a fleet's
    ``log`` (``manager_jit.LogKeys``: prompt then outputs, the fast hash) already holds: each
    request's kept blocks are the first of its log keys. None unless the log was hashed with
    this block size and these namespace keys (then the caller hashes)."""
    n = len(L)
    if log.block_size != block_size or len(log.off) != n or not (
            np.array_equal(log.every, every) and np.array_equal(log.first, first)):
        return None
    nblocks = np.where(L > 0, rules.kept_blocks(L, M, block_size), 0).astype(np.int64)
    if (nblocks > log.count).any():
        return None
    key_off = np.zeros(n + 1, np.int64)
    key_off[1:] = np.cumsum(nblocks)
    gather = np.repeat(log.off - key_off[:-1], nblocks) + np.arange(int(key_off[-1]), dtype=np.int64)
    return KeyedWorkload(L, M, np.asarray(read, bool), log.keys[gather], key_off, block_size)


def build_workload(prompt_tok: np.ndarray, prompt_off: np.ndarray, out_tok: np.ndarray,
                   out_off: np.ndarray, read: np.ndarray, lora: list[tuple[str, str] | None],
                   salt: list[str | None], block_size: int, algo: str = "fast",
                   digest_ids: dict[bytes, int] | None = None) -> KeyedWorkload:
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
        every, first = hashing.fast_namespace_arrays(lora, salt)
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
    return KeyedWorkload(L, M, np.asarray(read, bool), keys, key_off, block_size)


def _jit():
    """The compiled manager (imports numba: only when the compiled engine runs)."""
    from kvsim.engines.vllm import manager_jit

    return manager_jit


class APCFast(SequentialCache):
    """vLLM APC's compiled sequential engine, on one pool that lives across calls.

    :meth:`replay` hashes a whole workload at once and runs the compiled loop over it in
    chunks; :meth:`serve` runs one request through the same loop. The pool is created on
    first use: ``num_gpu_blocks`` from the settings, or (unlimited) enough for the first
    workload replayed.
    """

    def __init__(self, settings: APCSettings) -> None:
        self.settings = settings
        self.pool = None                  # manager_jit.PoolArrays, made on first use
        self.num_blocks: int | None = settings.num_gpu_blocks
        self._digest_ids: dict[bytes, int] = {}   # exact hashes -> keys, across calls
        self._tbl = np.zeros(1, np.int32)
        self._hits = np.zeros(1, np.int32)
        self._peak_in_use = np.zeros(1, np.int64)
        self.tier = None if settings.offload is None else _tier(settings)

    def _lora_salt(self, lora: list, salt: list) -> tuple[list, list]:
        paths = self.settings.lora_paths
        return [None if n is None else (n, paths.get(n, n)) for n in lora], list(salt)

    def workload(self, work: Workload) -> KeyedWorkload:
        """Every request's block keys (prompt + outputs), hashed in one pass."""
        lora, salt = self._lora_salt(work.lora, work.cache_salt)
        return build_workload(work.prompt_tokens, work.prompt_offsets, work.output_tokens, work.output_offsets,
                              rules.reads_cache(work.prompt_logprobs), lora, salt, self.settings.block_size,
                              self.settings.hash_algo, self._digest_ids)

    def _pool(self, kw: KeyedWorkload):
        """The pool, created (or its key table grown) for ``kw``, and buffers for its largest request."""
        jit = _jit()
        if self.num_blocks is None:  # unlimited: nothing is ever evicted
            self.num_blocks = rules.unlimited_num_blocks(kw.prompt_len, kw.output_len, kw.block_size)
        if self.pool is None:
            self.pool = jit.PoolArrays(self.num_blocks, len(kw.keys) + 1)
        else:
            self.pool.reserve(int(self.pool.st[jit.ST_KEYS]) + len(kw.keys) + 1)
        fits = rules.fits_ever(kw.prompt_len, kw.output_len, kw.block_size, self.num_blocks)
        largest = int(kw.blocks_needed[fits].max()) if fits.any() else 1
        if len(self._tbl) < largest:
            self._tbl = np.zeros(largest, np.int32)
            self._hits = np.zeros(largest, np.int32)
        return self.pool

    def replay(self, work: Workload, progress: Progress | None = None, chunk: int | None = None) -> ServedColumns:
        """Serve every request of ``work`` in order; the compiled loop runs ``chunk``
        requests per call (default: about 1/64 of the trace), reporting
        ``progress(done, total)`` in between."""
        kw = self.workload(work)
        cols = self.run(kw, progress, chunk)
        if self.tier is not None:
            self._serve_tier(work, kw, cols)
        return cols

    def _serve_tier(self, work: Workload, kw: KeyedWorkload, cols: ServedColumns) -> None:
        """The offload tier, request by request, after the GPU loop (the module docstring says why)."""
        for i in range(len(kw.prompt_len)):
            if cols.rejected[i]:
                self.tier.rejected()
                continue
            a, b = int(work.prompt_offsets[i]), int(work.prompt_offsets[i + 1])
            c, d = int(work.output_offsets[i]), int(work.output_offsets[i + 1])
            tokens = np.concatenate([work.prompt_tokens[a:b], work.output_tokens[c:d]]).astype(np.int64)
            L, local = int(kw.prompt_len[i]), int(cols.cached_tokens[i])
            external = self.tier.serve(str(i), kw.keys[kw.key_off[i]:kw.key_off[i + 1]].tolist(), L,
                                       int(kw.output_len[i]), local, not bool(kw.read[i]), tokens)
            cols.cached_tokens[i] += external
            cols.extend_tokens[i] -= external

    def unlimited_replayer(self, work: Workload, log=None) -> Callable[[np.ndarray], np.ndarray] | None:
        """For an unlimited pool without a tier (a fleet's bounds): ``work`` keyed once (taken
        from ``log``, the fleet's ``manager_jit.LogKeys``, where it holds the same keys), and a
        function giving, for an order of its requests, each one's cached tokens when they are
        replayed one at a time in that order from an empty cache (0 for the others): what
        :meth:`replay` of that share would give, without re-keying it (``run_unlimited``).
        None for a finite pool or a tier."""
        if self.settings.num_gpu_blocks is not None or self.tier is not None:
            return None
        kw = None
        if log is not None and self.settings.hash_algo == "fast":
            L = np.diff(work.prompt_offsets).astype(np.int64)
            M = np.maximum(np.diff(work.output_offsets).astype(np.int64), 1)
            every, first = hashing.fast_namespace_arrays(*self._lora_salt(work.lora, work.cache_salt))
            kw = keyed_from_log(L, M, rules.reads_cache(work.prompt_logprobs), every, first, self.settings.block_size,
                                log)
        if kw is None:
            kw = self.workload(work)
        jit = _jit()

        def cached(order: np.ndarray) -> np.ndarray:
            from kvsim.kernels.table import new_table, table_size

            order = np.asarray(order, np.int64)
            out = np.zeros(len(kw.prompt_len), np.int64)
            tkeys, _ = new_table(table_size(int((kw.key_off[order + 1] - kw.key_off[order]).sum())), np.int8)
            jit.run_unlimited(order, kw.prompt_len, kw.read, kw.keys, kw.key_off, kw.block_size, tkeys, out)
            return out
        return cached

    def run(self, kw: KeyedWorkload, progress: Progress | None = None, chunk: int | None = None) -> ServedColumns:
        """:meth:`replay` on an already keyed workload."""
        n = len(kw.prompt_len)
        chunk = chunk or max(1024, n // 64)
        pool = self._pool(kw)
        run_sequential = _jit().run_sequential
        B = kw.block_size
        cached = np.zeros(n, np.int64)
        rejected = np.zeros(n, np.bool_)
        evicted = np.zeros(n, np.int64)
        for i0 in range(0, n, chunk):
            i1 = min(n, i0 + chunk)
            run_sequential(i0, i1, kw.prompt_len, kw.output_len, kw.read, kw.keys, kw.key_off, B,
                           self.settings.profile.free_unhashed_to_head, *pool.arrays, self._tbl, self._hits,
                           cached, rejected, evicted, self._peak_in_use)
            if progress is not None:
                progress(i1, n)
        return ServedColumns(cached, rejected, evicted * B, evicted, kw.output_len.copy(),
                             np.where(rejected, 0, kw.prompt_len - cached))

    def serve(self, req: Request) -> Served:
        if self.num_blocks is None:
            raise ConfigError("serving requests one by one needs a pool size (num_gpu_blocks)")
        one = Workload(np.asarray(req.prompt, np.int64), np.array([0, len(req.prompt)]),
                       np.asarray(req.output, np.int64), np.array([0, len(req.output)]), [req.lora],
                       [req.cache_salt], np.array([req.prompt_logprobs]), np.array([req.logprob_start_len]),
                       [req.request_id])
        cols = self.replay(one)
        return Served(*(col[0].item() for col in cols.__dict__.values()))

    # -- the pool ------------------------------------------------------------------------
    @property
    def peak_used_tokens(self) -> int:
        return 0 if self.pool is None else self.pool.peak_used_blocks * self.settings.block_size

    @property
    def peak_in_use_blocks(self) -> int:
        return int(self._peak_in_use[0])

    def final_state(self) -> PoolState:
        chains = self.pool.cached_blocks()
        return PoolState(self.pool.free_block_ids(), len(chains), sum(map(len, chains.values())))
