"""The vLLM scheduler model's only door into the APC cache model (``kvsim.cache.apc``).

vLLM's scheduler calls its ``KVCacheManager`` through a handful of operations; this
module exposes exactly those, on kvsim's reference ``APCManager`` (here) or on the
compiled block pool (``vllm_cache_fast.py``, the default; :func:`make_kv_cache` picks). A request's KV bookkeeping lives in an
``apc.Sequence`` held by the adapter; the scheduler passes its own request object,
whose ``num_computed_tokens`` is copied in before each allocation.
"""
from __future__ import annotations

from collections.abc import Sequence as Seq

import numpy as np

from kvsim.engines.vllm import rules
from kvsim.engines.vllm.reference import APCManager, BlockHasher, Sequence

IMPLEMENTATIONS = ("fast", "reference")


class TokenBuffer:
    """A request's tokens in a growing numpy buffer: slices are views, so hashing the
    blocks a new token fills does not copy the whole sequence again."""

    __slots__ = ("buf", "n")

    def __init__(self, tokens: Seq[int], capacity: int) -> None:
        self.buf = np.empty(max(capacity, len(tokens), 1), np.int64)
        self.n = len(tokens)
        self.buf[:self.n] = tokens

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, key):
        if isinstance(key, slice):
            return self.buf[:self.n][key]
        return int(self.buf[:self.n][key])

    def extend(self, tokens) -> None:
        for t in tokens:
            self.append(t)

    def append(self, token: int) -> None:
        if self.n == len(self.buf):
            self.buf = np.concatenate([self.buf, np.empty(len(self.buf), np.int64)])
        self.buf[self.n] = token
        self.n += 1


class VllmKVCache:
    """vLLM 0.33's ``KVCacheManager`` operations, as its scheduler uses them."""

    def __init__(self, num_gpu_blocks: int, block_size: int, watermark: float = 0.0,
                 hash_algo: str = "fast", max_model_len: int = 1 << 62, enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.manager = APCManager(num_gpu_blocks, block_size, enable_caching=enable_caching, log_stats=False,
                                  max_model_len=max_model_len)
        self.hasher = BlockHasher(block_size, hash_algo)
        # KVCacheManager.watermark_blocks: a share of all blocks, the null block included
        self.watermark_blocks = int(watermark * num_gpu_blocks)

    def new_sequence(self, request_id: str, prompt: Seq[int], lora: str | None = None,
                     cache_salt: str | None = None, outputs: Seq[int] | None = None,
                     skip_reading_prefix_cache: bool = False) -> Sequence:
        """A request; ``outputs``, the tokens it will sample if known, size its buffer;
        ``skip_reading_prefix_cache`` for a prompt-logprob request (``SamplingParams``: its
        lookups always miss, docs/engines/apc.md §2.1)."""
        seq = Sequence(request_id, [], len(prompt), None, lora, cache_salt,
                       skip_reading_prefix_cache=skip_reading_prefix_cache)
        seq.tokens = TokenBuffer(prompt, len(prompt) + (0 if outputs is None else len(outputs)))
        seq.hasher = self.hasher
        self.hasher.extend(seq)
        return seq

    @staticmethod
    def append(seq: Sequence, token: int) -> None:
        """A sampled token joins the sequence; blocks it fills are hashed at once."""
        seq.append((token,))

    @staticmethod
    def append_many(seq: Sequence, tokens: np.ndarray) -> None:
        """Several sampled tokens at once (the same hashes as one by one)."""
        seq.append(tokens)

    def lookup(self, seq: Sequence) -> tuple[list, int]:
        """``get_computed_blocks``: cached full blocks, at most ``num_tokens - 1`` tokens."""
        return self.manager.get_computed_blocks(seq)

    def allocate(self, seq: Sequence, num_computed: int, num_new_tokens: int, num_new_computed: int = 0,
                 hits: list | None = None, full_sequence_must_fit: bool = False,
                 apply_watermark: bool = False) -> bool:
        """``allocate_slots``; False (nothing changed) when the blocks do not fit.

        The watermark is checked here, before the manager's own checks: both of vLLM's
        checks add ``watermark_blocks`` to the blocks needed (docs/engines/vllm-scheduler.md §3.3).
        """
        seq.num_computed_tokens = num_computed
        if self._nothing_to_do(seq, num_computed + num_new_computed + num_new_tokens, hits, full_sequence_must_fit):
            return True
        if apply_watermark and self.watermark_blocks:
            manager, hits_ = self.manager, hits or []
            free = manager.pool.num_free_blocks - self.watermark_blocks
            if full_sequence_must_fit and manager._num_blocks_to_allocate(
                    seq, min(seq.num_tokens, manager.max_model_len), hits_) > free:
                return False
            need = min(num_computed + num_new_computed + num_new_tokens, manager.max_model_len)
            if manager._num_blocks_to_allocate(seq, need, hits_) > free:
                return False
        return self.manager.allocate_slots(seq, num_new_tokens, num_new_computed, hits,
                                           full_sequence_must_fit=full_sequence_must_fit) is not None

    def fits(self, seq: Sequence, num_new_tokens: int, num_hits: int, hits: list, full_sequence_must_fit: bool,
             apply_watermark: bool) -> bool:
        """Whether ``allocate`` would admit this waiting request now (a dry run: nothing changes)."""
        manager = self.manager
        seq.num_computed_tokens = 0
        free = manager.pool.num_free_blocks - (self.watermark_blocks if apply_watermark else 0)
        if full_sequence_must_fit and manager._num_blocks_to_allocate(
                seq, min(seq.num_tokens, manager.max_model_len), hits) > free:
            return False
        need = min(num_hits + num_new_tokens, manager.max_model_len)
        return manager._num_blocks_to_allocate(seq, need, hits) <= free

    def num_cached_blocks(self, seq: Sequence) -> int:
        return self.manager.num_cached_block.get(seq.request_id, 0)

    def _nothing_to_do(self, seq: Sequence, num_slots: int, hits, full_sequence_must_fit: bool) -> bool:
        """A running request whose blocks already hold the new tokens and fill no new block:
        ``allocate_slots`` would succeed without changing anything (most decode steps)."""
        manager = self.manager
        blocks = manager.req_to_blocks.get(seq.request_id)
        if blocks is None or hits or full_sequence_must_fit:
            return False
        num_slots = min(num_slots, manager.max_model_len)
        if len(blocks) * self.block_size < num_slots:
            return False
        if not manager.enable_caching:
            return True
        full = min(num_slots, len(seq.tokens), len(seq.block_hashes) * self.block_size) // self.block_size
        return full <= manager.num_cached_block.get(seq.request_id, 0)

    def cache_blocks(self, seq: Sequence, num_tokens: int) -> None:
        self.manager.cache_blocks(seq, num_tokens)

    block_openings = staticmethod(rules.block_openings)

    def decode_steps(self, seqs: list[Sequence], computed: list[int], k: int, lag: int) -> None:
        """``k`` decode steps of running requests at once, in vLLM's order of pool operations.

        In step j, in running order, a request computing position ``c + j`` takes a new block
        when ``c + j`` starts one, and caches the block that the tokens known by then fill
        (``c + j + 1`` of them, synchronous; ``c + j``, async scheduling: ``lag`` = 1). The
        tokens are appended already (hashes exist); the blocks must fit (the caller checks).
        """
        manager, pool, B = self.manager, self.manager.pool, self.block_size
        events = []
        for r, c in enumerate(computed):
            for j in range((-c) % B, k, B):               # block openings
                events.append((j, r))
            for j in range((-(c + 1 - lag)) % B, k, B):   # blocks becoming full and known
                events.append((j, r))
        for j, r in sorted(set(events)):
            seq, c = seqs[r], computed[r] + j
            blocks = manager.req_to_blocks[seq.request_id]
            if len(blocks) * B < c + 1:
                blocks.extend(pool.get_new_blocks(1))
            if manager.enable_caching:
                manager.cache_blocks(seq, c + 1 - lag)

    def free(self, seq: Sequence) -> None:
        """Release every block of a finished or preempted request, last block first."""
        self.manager.free(seq)

    def release(self, seq: Sequence) -> None:
        """A finished request is gone (nothing to do here)."""

    def free_block_ids(self) -> list[int]:
        return self.manager.pool.free_block_ids()

    @property
    def num_free_blocks(self) -> int:
        return self.manager.pool.num_free_blocks


def make_kv_cache(implementation: str, num_gpu_blocks: int, block_size: int, watermark: float = 0.0,
                  hash_algo: str = "fast", max_model_len: int = 1 << 62, enable_caching: bool = True):
    """The scheduler's cache: ``fast`` (compiled pool, the default) or ``reference`` (readable
    objects); the two give the same results (``tests/test_sched_vllm_fast.py``)."""
    if implementation == "fast":
        from kvsim.engines.vllm.door_jit import FastVllmKVCache   # loads numba: only when used

        return FastVllmKVCache(num_gpu_blocks, block_size, watermark, hash_algo, max_model_len, enable_caching)
    return VllmKVCache(num_gpu_blocks, block_size, watermark, hash_algo, max_model_len, enable_caching)
