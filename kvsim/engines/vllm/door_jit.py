"""The vLLM scheduler's cache operations on the compiled block pool (``kvsim.engines.vllm.manager_jit``).

Same operations, same results as :class:`kvsim.engines.vllm.door.VllmKVCache` (the
reference adapter; ``tests/test_sched_vllm_fast.py`` checks them equal), without a Python
object per block: block tables and block keys live in two arenas, a request holds a
region of each (released when it finishes; the arenas are compacted when full). A
request's prompt, and the outputs it will sample when they are known (a replay's logged
ones), are hashed once at arrival; a key counts once its tokens have been appended, and a
sampled token off the plan is hashed when it fills a block (the fast hash; exact sha256
keys are vLLM's digests numbered in order of first appearance).
"""
from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np

from kvsim.engines.vllm import hashing

from kvsim.engines.vllm import rules

from kvsim.engines.vllm import manager_jit as stepped
from kvsim.engines.vllm.hash_kernels import fast_hash_sequence
from kvsim.engines.vllm.reference import BlockHasher, Sequence
from kvsim.engines.vllm.settings import PROFILES

_NO_HITS = np.zeros(0, np.int32)


class FastSequence:
    """A request as the compiled pool sees it: its arena region and its scalars."""

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


class FastVllmKVCache:
    """vLLM 0.33's ``KVCacheManager`` operations, as its scheduler uses them, compiled."""

    def __init__(self, num_gpu_blocks: int, block_size: int, watermark: float = 0.0,
                 hash_algo: str = "fast", max_model_len: int = 1 << 62, enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.unhashed_to_head = PROFILES["0.33"].free_unhashed_to_head
        self.pool = stepped.StepPool(num_gpu_blocks)
        self.hasher = BlockHasher(block_size, hash_algo)
        self._digest_ids: dict[bytes, int] = {}
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self._hits = np.zeros(16, np.int32)
        # the arenas: request tables and keys, regions handed out in order, compacted when full
        self.tbl = np.zeros(1 << 12, np.int32)
        self.keys = np.zeros(1 << 12, np.uint64)
        self._top = 0
        self._live: dict[int, FastSequence] = {}

    # -- requests ----------------------------------------------------------------------
    def new_sequence(self, request_id: str, prompt: Seq[int], lora: str | None = None,
                     cache_salt: str | None = None, outputs: Seq[int] | None = None,
                     skip_reading_prefix_cache: bool = False) -> FastSequence:
        """A request; ``outputs``, the tokens it will sample if known, are hashed ahead (the
        keys count once those tokens are appended; a different token drops the plan).
        ``skip_reading_prefix_cache``: a prompt-logprob request, whose lookups always miss
        (docs/engines/apc.md §2.1)."""
        B = self.block_size
        prompt = np.asarray(prompt)
        if prompt.dtype.kind not in "iu":
            prompt = prompt.astype(np.int64)
        L = len(prompt)
        max_outputs = 0 if outputs is None else len(outputs)
        seq = FastSequence()
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

    def append(self, seq: FastSequence, token: int) -> None:
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

    def append_many(self, seq: FastSequence, tokens: np.ndarray) -> None:
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

    def _drop_plan(self, seq: FastSequence) -> None:
        """The sampled tokens leave the plan: keys are computed as blocks fill from now on."""
        B, L, n = self.block_size, seq.num_prompt_tokens, seq.n
        known = seq.tail[:L % B] + seq.planned_ids[:n - L]     # tokens from block L // B on
        start = (n // B) * B - (L // B) * B
        seq.tail = known[start:] + [0] * (B - (n - (n // B) * B))
        seq.planned_ids = None

    def _hash_filled(self, seq: FastSequence, tokens: np.ndarray, first_block: int, count: int) -> None:
        """Keys of the ``count`` blocks from ``first_block`` on; ``tokens`` starts at that block."""
        if seq.exact is not None:
            self._exact_keys(seq, first_block)
            return
        self._room(seq, first_block + count + 2)
        o = seq.off + first_block
        parent = self.keys[o - 1] if first_block else np.uint64(hashing.FAST_ROOT)
        fast_hash_sequence(tokens, 0, count, self.block_size, parent, np.uint64(seq.every),
                                   np.uint64(seq.first if first_block == 0 else 0), self.keys[o:o + count])

    def _exact_keys(self, seq: FastSequence, start: int) -> None:
        """vLLM's digests of the newly full blocks, numbered in order of first appearance."""
        self.hasher.extend(seq.exact)
        digests = seq.exact.block_hashes[start:]
        self._room(seq, start + len(digests) + 2)
        ids = self._digest_ids
        self.keys[seq.off + start:seq.off + start + len(digests)] = [ids.setdefault(d, len(ids) + 1)
                                                                     for d in digests]

    # -- arenas --------------------------------------------------------------------------
    def _room(self, seq: FastSequence, blocks: int) -> None:
        if blocks > seq.cap:
            self._place(seq, max(blocks, 2 * seq.cap))

    def _place(self, seq: FastSequence, cap: int) -> None:
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

    def release(self, seq: FastSequence) -> None:
        """A finished request: its regions may be reused."""
        self._live.pop(id(seq), None)

    # -- the manager's operations ------------------------------------------------------
    def lookup(self, seq: FastSequence) -> tuple[np.ndarray, int]:
        """``get_computed_blocks``: cached full blocks, at most ``num_tokens - 1`` tokens."""
        if not self.enable_caching or seq.skip_read:
            return _NO_HITS, 0
        cap = rules.lookup_cap_blocks(seq.n, self.block_size)
        if len(self._hits) < cap:
            self._hits = np.zeros(2 * cap, np.int32)
        p = self.pool
        h = stepped.lookup(self.keys, seq.off, cap, p.tkeys, p.theads, self._hits)
        return self._hits[:h].copy(), h * self.block_size

    def allocate(self, seq: FastSequence, num_computed: int, num_new_tokens: int, num_new_computed: int = 0,
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
        p = self.pool
        reserve = self.watermark_blocks if apply_watermark else 0
        gate = min(seq.n, self.max_model_len) if full_sequence_must_fit else -1
        nb, nc = stepped.allocate(p.qnext, p.qprev, p.key, p.dnext, p.dprev, p.tkeys, p.theads, p.ref, p.st,
                                  self.tbl, self.keys, seq.off, seq.num_blocks, seq.num_cached, seq.allocated,
                                  seq.n // B, num_slots, min(computed + num_new_tokens, seq.n), hits,
                                  gate, reserve, self.enable_caching, B)
        if nb < 0:
            return False
        seq.num_blocks, seq.num_cached, seq.allocated = nb, nc, True
        return True

    def fits(self, seq: FastSequence, num_new_tokens: int, num_hits: int, hits: np.ndarray,
             full_sequence_must_fit: bool, apply_watermark: bool) -> bool:
        """Whether ``allocate`` would admit this waiting request now (a dry run: nothing changes)."""
        p, mml = self.pool, self.max_model_len
        free = p.num_free_blocks - (self.watermark_blocks if apply_watermark else 0)
        held = seq.num_blocks if seq.allocated else 0
        gate = min(seq.n, mml) if full_sequence_must_fit else -1
        return bool(stepped.fits(hits if len(hits) else _NO_HITS, held, min(num_hits + num_new_tokens, mml),
                                 gate, free, p.ref, self.block_size))

    def num_cached_blocks(self, seq: FastSequence) -> int:
        return seq.num_cached if seq.allocated else 0

    def cache_blocks(self, seq: FastSequence, num_tokens: int) -> None:
        B = self.block_size
        if (num_tokens if num_tokens < seq.n else seq.n) // B <= seq.num_cached:
            return
        p = self.pool
        seq.num_cached = stepped.cache_full(p.key, p.dnext, p.dprev, p.tkeys, p.theads, self.tbl, self.keys,
                                            seq.off, seq.num_cached, seq.n // B, num_tokens, B)

    block_openings = staticmethod(rules.block_openings)

    def decode_steps(self, seqs: list[FastSequence], computed: list[int], k: int, lag: int) -> None:
        """``k`` decode steps of running requests at once, in vLLM's order of pool operations
        (tokens appended already; the blocks must fit: the caller checks)."""
        B = self.block_size
        for s, c in zip(seqs, computed):
            self._room(s, (c + k) // B + 2)
        offs = np.array([s.off for s in seqs], np.int64)
        nb = np.array([s.num_blocks for s in seqs], np.int64)
        nc = np.array([s.num_cached for s in seqs], np.int64)
        nk = np.array([s.n // B for s in seqs], np.int64)
        p = self.pool
        stepped.decode_steps(p.qnext, p.qprev, p.key, p.dnext, p.dprev, p.tkeys, p.theads, p.ref, p.st, self.tbl,
                             self.keys, offs, np.asarray(computed, np.int64), nb, nc, nk, k, lag,
                             self.enable_caching, B)
        for s, b, c in zip(seqs, nb.tolist(), nc.tolist()):
            s.num_blocks, s.num_cached = b, c

    def free(self, seq: FastSequence) -> None:
        """Release every block of a finished or preempted request, last block first."""
        if not seq.allocated:
            return
        p = self.pool
        stepped.free(p.qnext, p.qprev, p.key, p.ref, p.st, self.tbl, seq.off, seq.num_blocks, self.enable_caching,
                     self.unhashed_to_head)
        seq.num_blocks = seq.num_cached = 0
        seq.allocated = False

    @property
    def num_free_blocks(self) -> int:
        return int(self.pool.st[stepped.Q_FREE])

    def free_block_ids(self) -> list[int]:
        return self.pool.free_block_ids()
