"""vLLM Automatic Prefix Caching, readable: the reference model (``docs/engines/apc.md §1–§5``).

``APCManager`` is vLLM 0.33's ``KVCacheManager`` for one full-attention group:
``get_computed_blocks`` (lookup), ``allocate_slots`` (touch hits, pop new blocks, cache
full ones) and ``free``. ``APCReference`` drives it the way vLLM's scheduler does, one request
at a time (:class:`kvsim.engines.base.PrefixCache`). Tests use this model as the oracle for
the compiled engine (``apc/fast.py``); the real vLLM code is the oracle for both.
"""
from __future__ import annotations

import math
from collections.abc import Hashable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field, replace

import numpy as np

from kvsim.engines.vllm import hashing

from kvsim.engines.vllm import rules
from kvsim.engines.vllm.metrics import PrefixCacheStats
from kvsim.engines.vllm.pool import Block, BlockPool, PoolState
from kvsim.engines.base import Admission, PrefixCache, Request, Served
from kvsim.engines.vllm.settings import PROFILES, APCSettings, EngineProfile
from kvsim.errors import ConfigError


class BlockHasher:
    """Hashes a sequence's full blocks as vLLM's request block hasher does (§1.2)."""

    def __init__(self, block_size: int, algo: str = "fast", lora_paths: dict[str, str] | None = None):
        self.block_size = block_size
        self.algo = hashing.check_algo(algo)
        self.lora_paths = lora_paths or {}
        self._root = hashing.FAST_ROOT if algo == "fast" else hashing.none_hash(algo)

    def lora_key(self, lora: str | None) -> tuple[str, str] | None:
        """vLLM 0.33 hashes the adapter's name and path; a log has only the name (§1.3)."""
        return None if lora is None else (lora, self.lora_paths.get(lora, lora))

    def fast_namespace_keys(self, lora: str | None, cache_salt: str | None) -> tuple[int, int]:
        """The fast hash's namespace keys: (LoRA, on every block; salt, on block 0) (§1.3)."""
        lora_key = self.lora_key(lora)
        every = 0 if lora_key is None else hashing.namespace_key("lora", *lora_key)
        return every, hashing.namespace_key("cache_salt", cache_salt) if cache_salt else 0

    def extend(self, seq: Sequence) -> None:
        """Append the hashes of blocks that became full since the last call."""
        b, start = self.block_size, len(seq.block_hashes)
        n = len(seq.tokens) // b - start
        if n <= 0:
            return
        if self.algo == "fast":
            every, first = self.fast_namespace_keys(seq.lora, seq.cache_salt)
            parent = seq.block_hashes[-1] if start else self._root
            out = np.zeros(n, np.uint64)
            tokens = np.asarray(seq.tokens[: (start + n) * b], dtype=np.int64)
            hashing.fast_hash_sequence(tokens, start, n, b, np.uint64(parent), np.uint64(every),
                                       np.uint64(first), out)
            seq.block_hashes.extend(int(h) for h in out)
        else:
            seq.block_hashes.extend(hashing.exact_block_hashes(
                seq.tokens[: (start + n) * b], b, self.algo, self.lora_key(seq.lora), seq.cache_salt,
                seq.mm_items, start_block=start, parent=seq.block_hashes[-1] if start else None))


@dataclass(eq=False)
class Sequence:
    """A request as vLLM's KV-cache manager sees it (vLLM ``v1/request.py``)."""

    request_id: str
    tokens: list[int]                       # prompt + outputs appended so far
    num_prompt_tokens: int
    hasher: BlockHasher | None = None
    lora: str | None = None
    cache_salt: str | None = None
    mm_items: Seq[hashing.MMItem] = ()
    skip_reading_prefix_cache: bool = False  # prompt logprobs (§2.1)
    num_computed_tokens: int = 0
    num_preemptions: int = 0
    block_hashes: list[Hashable] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tokens = [int(t) for t in self.tokens]
        if self.hasher is not None:
            self.hasher.extend(self)

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def append(self, token_ids: Seq[int]) -> None:
        """Append sampled tokens; newly full blocks are hashed at once (§1.2)."""
        self.tokens.extend(int(t) for t in token_ids)
        if self.hasher is not None:
            self.hasher.extend(self)


class APCManager:
    """vLLM 0.33 ``KVCacheManager`` with one full-attention group (§2–§4)."""

    def __init__(self, num_gpu_blocks: int, block_size: int, enable_caching: bool = True,
                 profile: EngineProfile | None = None, use_eagle: bool = False,
                 log_stats: bool = True, record_events: bool = False,
                 max_model_len: int = 1 << 62) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.profile = profile or PROFILES["0.33"]
        self.use_eagle = use_eagle
        self.max_model_len = max_model_len
        self.pool = BlockPool(num_gpu_blocks, enable_caching, self.profile.free_unhashed_to_head,
                              record_events)
        self.req_to_blocks: dict[str, list[Block]] = {}
        self.num_cached_block: dict[str, int] = {}
        self.prefix_cache_stats: PrefixCacheStats | None = PrefixCacheStats() if log_stats else None

    def get_computed_blocks(self, seq: Sequence) -> tuple[list[Block], int]:
        """The longest run of cached full blocks from the start, and its length in tokens (§2.2)."""
        if not self.enable_caching or seq.skip_reading_prefix_cache:
            return [], 0
        max_blocks = rules.lookup_cap_blocks(seq.num_tokens, self.block_size)
        hits: list[Block] = []
        for key in seq.block_hashes[:max_blocks]:
            block = self.pool.get_cached_block(key)
            if block is None:
                break  # chained hashes: every later block misses too
            hits.append(block)
        if self.use_eagle and hits:
            hits.pop()  # EAGLE recomputes the last matched block (§2.2)
        if not self.profile.stats_at_admission:
            self.record_prefix_cache_stats(seq, len(hits) * self.block_size)
        return hits, len(hits) * self.block_size

    def record_prefix_cache_stats(self, seq: Sequence, num_hits: int) -> None:
        """Count one lookup in the step's stats; skipped reads are not counted (§5.1)."""
        if self.prefix_cache_stats is None or not self.enable_caching or seq.skip_reading_prefix_cache:
            return
        preempted = seq.num_preemptions > 0 and self.profile.stats_at_admission
        self.prefix_cache_stats.record(seq.num_tokens, num_hits, preempted)

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Take this step's stats and start new ones (the scheduler does this every step)."""
        if self.prefix_cache_stats is None:
            return None
        stats, self.prefix_cache_stats = self.prefix_cache_stats, PrefixCacheStats()
        return stats

    def _num_blocks_to_allocate(self, seq: Sequence, num_tokens: int, hits: list[Block]) -> int:
        held = self.req_to_blocks.get(seq.request_id, [])
        needed = max(math.ceil(num_tokens / self.block_size) - len(hits) - len(held), 0)
        # a hit sitting in the free queue leaves it when touched, so it costs a free slot (§3.2)
        return needed + sum(1 for b in hits if b.ref_cnt == 0 and not b.is_null)

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: list[Block] | None = None, num_lookahead_tokens: int = 0,
                       full_sequence_must_fit: bool = False) -> list[Block] | None:
        """Reserve slots for ``num_new_tokens`` more tokens; None (and no change) if they don't fit."""
        hits = list(new_computed_blocks or [])
        computed = seq.num_computed_tokens + num_new_computed_tokens
        free = self.pool.num_free_blocks
        # 0.33 admission gate: the whole current sequence must fit (§4.4)
        if full_sequence_must_fit and \
                self._num_blocks_to_allocate(seq, min(seq.num_tokens, self.max_model_len), hits) > free:
            return None
        num_slots = min(computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        if self._num_blocks_to_allocate(seq, num_slots, hits) > free:
            return None
        if seq.request_id not in self.req_to_blocks:
            # hits are touched before new blocks are popped, so a request never evicts its
            # own hits (§3.2, S6)
            if self.enable_caching:
                self.pool.touch(hits)
            self.req_to_blocks[seq.request_id] = hits
            self.num_cached_block[seq.request_id] = len(hits)
        blocks = self.req_to_blocks[seq.request_id]
        new = self.pool.get_new_blocks(max(math.ceil(num_slots / self.block_size) - len(blocks), 0))
        blocks.extend(new)
        if self.enable_caching:
            # only tokens that are final get cached: never a lookahead slot (§4.1)
            self.cache_blocks(seq, min(computed + num_new_tokens, seq.num_tokens))
        return new

    def cache_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Register the request's blocks that are full up to ``num_tokens`` (§4.1)."""
        num_cached = self.num_cached_block.get(seq.request_id, 0)
        num_full = min(num_tokens, len(seq.block_hashes) * self.block_size) // self.block_size
        if num_cached >= num_full:
            return
        self.pool.cache_full_blocks(self.req_to_blocks[seq.request_id], seq.block_hashes,
                                    num_cached, num_full)
        self.num_cached_block[seq.request_id] = num_full

    def free(self, seq: Sequence) -> None:
        """Release a finished or preempted request, last block first (§3.5)."""
        blocks = self.req_to_blocks.pop(seq.request_id, [])
        self.num_cached_block.pop(seq.request_id, None)
        self.pool.free_blocks(reversed(blocks))

    @property
    def usage(self) -> float:
        """KVCacheManager.usage: the share of usable blocks not free (the null block excluded)."""
        return self.pool.usage

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash (vLLM refuses while a block is in use); True if done."""
        if not self.pool.reset_prefix_cache():
            return False
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def block_ids(self, seq: Sequence) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(seq.request_id, [])]


class APCReference(PrefixCache):
    """vLLM APC driven as the scheduler drives it: admit, one decode per token, free (§4).

    ``admit`` looks up and allocates the whole prompt, then samples the first output token;
    each ``decode`` computes the last sampled token (allocating one slot and caching blocks
    it completes) and samples the next; ``finish`` frees. The last sampled token is never
    computed, so the block it would complete is never cached (§4.1).
    """

    def __init__(self, settings: APCSettings, record_events: bool = False) -> None:
        if settings.num_gpu_blocks is None:
            raise ConfigError("the stepwise APC model needs a pool size (num_gpu_blocks)")
        self.settings = settings
        self.page_size = block_size = settings.block_size
        self.profile = settings.profile
        self.hasher = BlockHasher(block_size, settings.hash_algo, settings.lora_paths)
        self.manager = APCManager(settings.num_gpu_blocks, block_size, profile=self.profile,
                                  record_events=record_events)
        self.pool = self.manager.pool
        self.peak_in_use_blocks = 0   # most blocks one served request held (serve)
        self.queries = 0   # vLLM prefix_cache_queries (tokens), as the metric counts them
        self.hits = 0      # vLLM prefix_cache_hits (tokens)
        self._seqs: dict[str, Sequence] = {}

    @classmethod
    def for_workload(cls, settings: APCSettings, work) -> "APCReference":
        """The model for replaying ``work``; an unlimited pool holds every block it takes."""
        if settings.num_gpu_blocks is None:
            settings = replace(settings, num_gpu_blocks=rules.unlimited_num_blocks(
                work.prompt_lengths, np.maximum(work.output_lengths, 1), settings.block_size))
        return cls(settings)

    def blocks_needed(self, req: Request) -> int:
        """Blocks a request holds at its peak (rules.peak_blocks)."""
        return int(rules.peak_blocks(len(req.prompt), max(len(req.output), 1), self.page_size))

    def fits_ever(self, req: Request) -> bool:
        """False for a request that can never be scheduled, even in an empty cache (§1 note)."""
        return bool(rules.fits_ever(len(req.prompt), max(len(req.output), 1), self.page_size,
                                    self.pool.num_blocks))

    def admit(self, req: Request) -> Admission | None:
        seq = Sequence(req.request_id, list(req.prompt), len(req.prompt), self.hasher, req.lora,
                       req.cache_salt, skip_reading_prefix_cache=req.prompt_logprobs)
        evicted = self.pool.num_evicted
        hits, num_hits = self.manager.get_computed_blocks(seq)
        new = self.manager.allocate_slots(seq, seq.num_tokens - num_hits, num_hits, hits,
                                          full_sequence_must_fit=True)
        if new is None:
            return None
        if self.profile.stats_at_admission:
            self.manager.record_prefix_cache_stats(seq, num_hits)
        self._take_stats()
        seq.num_computed_tokens = seq.num_tokens
        self._seqs[req.request_id] = seq
        self._sample(req, seq)
        evicted = self.pool.num_evicted - evicted
        table = np.array(self.manager.block_ids(seq), np.int64)
        return Admission(num_hits, table, evicted * self.page_size, evicted)

    def can_decode(self, req: Request) -> bool:
        """Whether the next decode step finds a free block when it needs one."""
        seq = self._seqs[req.request_id]
        return self.manager._num_blocks_to_allocate(seq, seq.num_computed_tokens + 1, []) <= \
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
        """Every remaining decode step of a lone running request in one manager call.

        Step by step, each decode computes the last sampled token (one slot, a new block
        from the queue head at a block boundary, full blocks cached) and samples the next.
        With no other request running nothing else touches the pool between steps, so
        allocating the slots at once pops the same blocks in the same order, evicts the same
        hashes and caches the same full blocks: the final state is the step-by-step one.
        """
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
    def serve(self, req: Request) -> Served:
        """Admit, decode to the output length, free. A request that can never fit is
        rejected and leaves the cache untouched (§1 note)."""
        L, M = len(req.prompt), max(len(req.output), 1)
        if not self.fits_ever(req):
            return Served(0, True, 0, 0, M, 0)
        before = self.pool.num_evicted
        admission = self.admit(req)
        assert admission is not None, "a request that fits an idle cache was refused"
        for _ in range(len(req.output) - 1):
            self.decode(req)
        self.peak_in_use_blocks = max(self.peak_in_use_blocks, self.blocks_needed(req))
        self.finish(req)
        evicted = self.pool.num_evicted - before
        return Served(admission.cached_tokens, False, evicted * self.page_size, evicted, M,
                      L - admission.cached_tokens)

    @property
    def peak_used_tokens(self) -> int:
        return self.pool.peak_used_blocks * self.page_size

    def final_state(self) -> PoolState:
        pool = self.pool
        return PoolState(pool.free_block_ids(), len(pool.cached), pool.cached.num_blocks())

    def _sample(self, req: Request, seq: Sequence) -> None:
        """The engine appends the next output token (logged or synthesized)."""
        seq.append([int(req.output[req.num_generated])])
        req.num_generated += 1

    def _take_stats(self) -> None:
        stats = self.manager.make_prefix_cache_stats()
        if stats is not None:
            self.queries += stats.queries
            self.hits += stats.hits
