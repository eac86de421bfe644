"""vLLM 0.33's KV-cache manager, readable: the block pool and ``KVCacheManager`` (``docs/engines/apc.md §2–§4``).

The pool (vLLM ``v1/core/block_pool.py``) has three pieces: blocks with reference counts;
the free queue, a doubly linked list of every block with ``ref_cnt == 0`` in eviction order
(head = next victim), which keeps cached blocks until they are handed out again; and the map
from block hash to the blocks registered under it (several blocks may share a hash: vLLM
never de-duplicates).

:class:`KVCacheManager` is vLLM's ``KVCacheManager`` for one full-attention group, with the
operations its scheduler calls: ``lookup`` (``get_computed_blocks``), ``allocate``
(``allocate_slots``: touch hits, pop new blocks, cache full ones, behind the full-sequence
gate and the watermark), ``cache_blocks``, ``decode_steps``, ``free``. The compiled
manager (:mod:`kvsim.engines.vllm.manager_jit`) offers the same operations on arrays; tests
hold the two equal, and the real vLLM code is the oracle for both.
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from kvsim.engines.vllm import hashing, rules
from kvsim.engines.vllm.hashing import BlockHasher
from kvsim.engines.vllm.metrics import PrefixCacheStats
from kvsim.engines.vllm.settings import PROFILES, EngineProfile

_HEAD, _TAIL = -1, -2  # sentinels of the free queue


@dataclass(eq=False)
class Block:
    """One physical KV block."""

    block_id: int
    ref_cnt: int = 0
    block_hash: Hashable | None = None  # set while the block is registered in the cache map
    is_null: bool = False


class FreeQueue:
    """Free block ids in eviction order, with O(1) pop-left, removal anywhere, append, prepend."""

    def __init__(self, ids: Iterable[int]) -> None:
        self._next: dict[int, int] = {}
        self._prev: dict[int, int] = {}
        self._next[_HEAD], self._prev[_TAIL] = _TAIL, _HEAD
        self._len = 0
        self.append_n(ids)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[int]:
        b = self._next[_HEAD]
        while b != _TAIL:
            yield b
            b = self._next[b]

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._next and block_id != _HEAD

    def popleft(self) -> int:
        b = self._next[_HEAD]
        if b == _TAIL:
            raise ValueError("no free blocks")
        self.remove(b)
        return b

    def remove(self, b: int) -> None:
        p, n = self._prev.pop(b), self._next.pop(b)
        self._next[p], self._prev[n] = n, p
        self._len -= 1

    def _insert_after(self, p: int, b: int) -> None:
        n = self._next[p]
        self._next[p], self._prev[b], self._next[b], self._prev[n] = b, p, n, b
        self._len += 1

    def append_n(self, ids: Iterable[int]) -> None:
        for b in ids:
            self._insert_after(self._prev[_TAIL], b)

    def prepend_n(self, ids: Iterable[int]) -> None:
        """Put ``ids`` at the head, keeping their order (the first one becomes the head)."""
        p = _HEAD
        for b in ids:
            self._insert_after(p, b)
            p = b


class PoolState(NamedTuple):
    """The pool after a replay, for comparisons with vLLM's own."""

    free_queue: list[int]        # free block ids, head (next victim) first
    map_keys: int                # distinct block hashes in the cache map
    cached_blocks: int           # blocks registered in the map


class BlockHashMap:
    """Block hash -> blocks registered under it, earliest first (vLLM ``BlockHashToBlockMap``)."""

    def __init__(self) -> None:
        self._cache: dict[Hashable, dict[int, Block]] = {}

    def __len__(self) -> int:
        return len(self._cache)

    def get_one(self, key: Hashable) -> Block | None:
        """The earliest-inserted block still registered under ``key`` (docs/engines/apc.md §2.2)."""
        blocks = self._cache.get(key)
        return next(iter(blocks.values())) if blocks else None

    def contains(self, key: Hashable, block_id: int) -> bool:
        return block_id in self._cache.get(key, ())

    def insert(self, key: Hashable, block: Block) -> None:
        self._cache.setdefault(key, {})[block.block_id] = block

    def pop(self, key: Hashable, block_id: int) -> Block | None:
        """Unregister one block; the key survives while other blocks hold it (S13)."""
        blocks = self._cache.get(key)
        if not blocks or block_id not in blocks:
            return None
        block = blocks.pop(block_id)
        if not blocks:
            del self._cache[key]
        return block

    def num_blocks(self) -> int:
        return sum(len(v) for v in self._cache.values())


class BlockPool:
    """``num_blocks`` blocks, block 0 reserved as the null block (usable: ``num_blocks - 1``).

    ``free_unhashed_to_head`` selects vLLM's free order (docs/engines/apc.md §3.5, §7): True (0.24+, the
    0.33 default) puts freed blocks without a hash at the head and hashed ones at the tail;
    False (<= 0.23) appends all of them to the tail.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True,
                 free_unhashed_to_head: bool = True, record_events: bool = False) -> None:
        if num_blocks < 1:
            raise ValueError("a block pool needs at least the null block")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.free_unhashed_to_head = free_unhashed_to_head
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue = FreeQueue(range(num_blocks))
        self.cached = BlockHashMap()
        self.null_block = self.blocks[self.free_queue.popleft()]
        self.null_block.is_null = True
        self.events: list[tuple] | None = [] if record_events else None
        self.num_evicted = 0          # blocks whose hash was dropped on reuse, all time
        self._num_empty = num_blocks - 1  # free blocks holding no cached KV
        self.peak_used_blocks = 0     # most blocks in use or cached at once

    # -- queries ----------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def used_blocks(self) -> int:
        """Blocks holding KV: in use by a request, or free but still cached."""
        return self.num_blocks - 1 - self._num_empty

    def usage(self) -> float:
        """vLLM's ``kv_cache_usage_perc``: 1 - free / usable (§5.2)."""
        usable = self.num_blocks - 1
        return 1.0 - self.num_free_blocks / usable if usable else 0.0

    def free_block_ids(self) -> list[int]:
        """The free queue, head (next victim) first."""
        return list(self.free_queue)

    def get_cached_block(self, key: Hashable) -> Block | None:
        return self.cached.get_one(key)

    # -- allocation -------------------------------------------------------------------
    def get_new_blocks(self, n: int) -> list[Block]:
        """Pop ``n`` blocks from the head; a cached one loses its hash now (lazy eviction, §3.3)."""
        if n > self.num_free_blocks:
            raise ValueError(f"cannot get {n} free blocks from the pool")
        out = []
        for _ in range(n):
            block = self.blocks[self.free_queue.popleft()]
            if block.block_hash is not None:
                self.evict(block)
            self._num_empty -= 1
            block.ref_cnt = 1
            out.append(block)
        self.peak_used_blocks = max(self.peak_used_blocks, self.used_blocks)
        return out

    def touch(self, blocks: Iterable[Block]) -> None:
        """Take a reference on hit blocks; a free one leaves the queue (§3.4)."""
        for block in blocks:
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                self.free_queue.remove(block.block_id)
                if block.block_hash is None:
                    self._num_empty -= 1
            block.ref_cnt += 1

    def free_blocks(self, ordered: Iterable[Block]) -> None:
        """Drop one reference from each block, first = evicted first (§3.5)."""
        to_head, to_tail = [], []
        for block in ordered:
            if block.is_null:
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    self._num_empty += 1
                unhashed = block.block_hash is None or not self.enable_caching
                (to_head if unhashed and self.free_unhashed_to_head else to_tail).append(block.block_id)
        self.free_queue.prepend_n(to_head)
        self.free_queue.append_n(to_tail)

    # -- the cache map ----------------------------------------------------------------
    def cache_full_blocks(self, blocks: list[Block], hashes: Seq[Hashable],
                          num_cached: int, num_full: int) -> None:
        """Register ``blocks[num_cached:num_full]`` under ``hashes[num_cached:num_full]`` (§4.1)."""
        if num_cached >= num_full:
            return
        stored = []
        for block, key in zip(blocks[num_cached:num_full], hashes[num_cached:num_full]):
            if block.is_null or block.block_hash == key or self.cached.contains(key, block.block_id):
                continue
            self.cache_block(block, key)
            stored.append(key)
        if self.events is not None:
            self.events.append(("stored", stored))

    def cache_block(self, block: Block, key: Hashable) -> None:
        """Register one block under ``key``; duplicates of a key are allowed (§3.3)."""
        assert block.block_hash is None, "block already has a hash"
        if block.ref_cnt == 0 and not block.is_null:
            self._num_empty -= 1
        block.block_hash = key
        self.cached.insert(key, block)

    def evict(self, block: Block) -> bool:
        """Drop a block's hash from the map (vLLM ``_maybe_evict_cached_block``)."""
        key = block.block_hash
        if key is None:
            return False
        self.cached.pop(key, block.block_id)
        block.block_hash = None
        self.num_evicted += 1
        if block.ref_cnt == 0 and not block.is_null:
            self._num_empty += 1
        if self.events is not None:
            self.events.append(("removed", key))
        return True

    def add_free_blocks(self, n: int) -> None:
        """Grow the pool by ``n`` fresh blocks at the head of the free queue (an unlimited
        pool that cannot be sized up front: the next requests take these first)."""
        start = self.num_blocks
        self.blocks.extend(Block(i) for i in range(start, start + n))
        self.free_queue.prepend_n(range(start, start + n))
        self.num_blocks += n
        self._num_empty += n  # fresh blocks hold no cached KV

    def grow_before_evicting(self, need: int) -> None:
        """Unlimited capacity when a pool cannot be sized up front (a server, an event-fed fleet
        replay): grow by fresh blocks at the queue head whenever one of the ``need`` blocks a
        request may pop would hold a cached hash. Which block ids are used differs from a pool
        sized for the whole log; which prefixes are cached, and so every hit, does not."""
        head = []
        for block_id in self.free_queue:
            if len(head) == need:
                break
            head.append(block_id)
        if len(head) < need or any(self.blocks[b].block_hash is not None for b in head):
            self.add_free_blocks(max(need, self.num_blocks))

    def reset_prefix_cache(self) -> bool:
        """Forget every hash, only when no block is in use; queue order is kept (§3.6)."""
        if self.num_free_blocks != self.num_blocks - 1:
            return False
        self.cached = BlockHashMap()
        for block in self.blocks:
            block.block_hash = None
        self._num_empty = self.num_free_blocks
        if self.events is not None:
            self.events.append(("cleared",))
        return True

    def state(self) -> PoolState:
        return PoolState(self.free_block_ids(), len(self.cached), self.cached.num_blocks())


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


@dataclass(eq=False)
class Sequence:
    """A request as vLLM's KV-cache manager sees it (vLLM ``v1/request.py``)."""

    request_id: str
    tokens: list[int] | TokenBuffer         # prompt + outputs appended so far
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
        if not isinstance(self.tokens, TokenBuffer):
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


class KVCacheManager:
    """vLLM 0.33 ``KVCacheManager`` with one full-attention group (§2–§4), as its scheduler calls it.

    ``watermark`` is the scheduler's share of all blocks (the null block included) that an
    allocation must leave free when asked to (``apply_watermark``; docs/engines/vllm-scheduler.md §3.3).
    ``pool_type`` is the block pool it allocates from (a subclass may evict differently).
    """

    pool_type: type = BlockPool

    def __init__(self, num_gpu_blocks: int, block_size: int, enable_caching: bool = True,
                 profile: EngineProfile | None = None, use_eagle: bool = False,
                 log_stats: bool = True, record_events: bool = False,
                 max_model_len: int = 1 << 62, watermark: float = 0.0, hash_algo: str = "fast",
                 lora_paths: dict[str, str] | None = None) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.profile = profile or PROFILES["0.33"]
        self.use_eagle = use_eagle
        self.max_model_len = max_model_len
        self.pool = self.pool_type(num_gpu_blocks, enable_caching, self.profile.free_unhashed_to_head,
                                   record_events)
        self.hasher = BlockHasher(block_size, hash_algo, lora_paths)
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.req_to_blocks: dict[str, list[Block]] = {}
        self.num_cached_block: dict[str, int] = {}
        self.prefix_cache_stats: PrefixCacheStats | None = PrefixCacheStats() if log_stats else None

    # -- requests ----------------------------------------------------------------------
    def new_sequence(self, request_id: str, prompt: Seq[int], lora: str | None = None,
                     cache_salt: str | None = None, outputs: Seq[int] | None = None,
                     skip_reading_prefix_cache: bool = False) -> Sequence:
        """A request; ``outputs``, the tokens it will sample if known, size its buffer;
        ``skip_reading_prefix_cache`` for a prompt-logprob request (its lookups always miss, §2.1)."""
        tokens = TokenBuffer(prompt, len(prompt) + (0 if outputs is None else len(outputs)))
        return Sequence(request_id, tokens, len(prompt), self.hasher, lora, cache_salt,
                        skip_reading_prefix_cache=skip_reading_prefix_cache)

    @staticmethod
    def append(seq: Sequence, token: int) -> None:
        """A sampled token joins the sequence; blocks it fills are hashed at once."""
        seq.append((token,))

    @staticmethod
    def append_many(seq: Sequence, tokens: np.ndarray) -> None:
        """Several sampled tokens at once (the same hashes as one by one)."""
        seq.append(tokens)

    def release(self, seq: Sequence) -> None:
        """A finished request is gone (nothing to do here; the compiled manager frees its arena)."""

    # -- lookup (§2) ---------------------------------------------------------------------
    def lookup(self, seq: Sequence) -> tuple[list[Block], int]:
        """``get_computed_blocks``: the longest run of cached full blocks from the start, and its
        length in tokens, at most ``num_tokens - 1`` (§2.2)."""
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

    # -- allocation (§3, §4) ---------------------------------------------------------------
    def num_blocks_to_allocate(self, seq: Sequence, num_tokens: int, hits: Seq[Block]) -> int:
        """``_num_blocks_to_allocate``: new blocks, plus hits sitting in the free queue, which
        leave it when touched and so cost a free slot (§3.2)."""
        held = self.req_to_blocks.get(seq.request_id, [])
        needed = max(math.ceil(num_tokens / self.block_size) - len(hits) - len(held), 0)
        return needed + sum(1 for b in hits if b.ref_cnt == 0 and not b.is_null)

    def _fits(self, seq: Sequence, num_slots: int, hits: Seq[Block], full_sequence_must_fit: bool,
              apply_watermark: bool, reserved_blocks: int = 0) -> bool:
        """Both of vLLM's checks against the free blocks, each less the watermark when asked:
        the 0.33 gate (the whole current sequence must fit, §4.4), then the slots asked for
        (less ``reserved_blocks``: what in-flight prefills still need, for an async KV load)."""
        free = self.pool.num_free_blocks - (self.watermark_blocks if apply_watermark else 0)
        if full_sequence_must_fit and \
                self.num_blocks_to_allocate(seq, min(seq.num_tokens, self.max_model_len), hits) > free:
            return False
        return self.num_blocks_to_allocate(seq, min(num_slots, self.max_model_len), hits) <= free - reserved_blocks

    def allocate_slots(self, seq: Sequence, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: list[Block] | None = None, num_lookahead_tokens: int = 0,
                       full_sequence_must_fit: bool = False, apply_watermark: bool = False,
                       num_external_computed_tokens: int = 0, delay_cache_blocks: bool = False,
                       reserved_blocks: int = 0) -> list[Block] | None:
        """Reserve slots for ``num_new_tokens`` more tokens; None (and no change) if they don't fit.

        A KV connector's ``num_external_computed_tokens`` take new blocks too; with
        ``delay_cache_blocks`` (an async load) nothing is cached until the load is done
        (docs/engines/offload.md §1.6)."""
        hits = list(new_computed_blocks or [])
        computed = seq.num_computed_tokens + num_new_computed_tokens + num_external_computed_tokens
        num_slots = min(computed + num_new_tokens + num_lookahead_tokens, self.max_model_len)
        if not self._fits(seq, num_slots, hits, full_sequence_must_fit, apply_watermark, reserved_blocks):
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
        if self.enable_caching and not delay_cache_blocks:
            # only tokens that are final get cached: never a lookahead slot (§4.1)
            self.cache_blocks(seq, min(computed + num_new_tokens, seq.num_tokens))
        return new

    def allocate(self, seq: Sequence, num_computed: int, num_new_tokens: int, num_new_computed: int = 0,
                 hits: list | None = None, full_sequence_must_fit: bool = False,
                 apply_watermark: bool = False, num_external: int = 0, delay_cache: bool = False,
                 reserved_blocks: int = 0) -> bool:
        """The scheduler's ``allocate_slots`` call for a request with ``num_computed`` tokens
        computed (and, with a KV connector, ``num_external`` tokens to load); False (nothing
        changed) when the blocks do not fit."""
        seq.num_computed_tokens = num_computed
        if not num_external and \
                self._nothing_to_do(seq, num_computed + num_new_computed + num_new_tokens, hits, full_sequence_must_fit):
            return True
        return self.allocate_slots(seq, num_new_tokens, num_new_computed, hits,
                                   full_sequence_must_fit=full_sequence_must_fit, apply_watermark=apply_watermark,
                                   num_external_computed_tokens=num_external, delay_cache_blocks=delay_cache,
                                   reserved_blocks=reserved_blocks) is not None

    def fits(self, seq: Sequence, num_new_tokens: int, num_hits: int, hits: list, full_sequence_must_fit: bool,
             apply_watermark: bool) -> bool:
        """Whether ``allocate`` would admit this waiting request now (a dry run: nothing changes)."""
        seq.num_computed_tokens = 0
        return self._fits(seq, num_hits + num_new_tokens, hits, full_sequence_must_fit, apply_watermark)

    def _nothing_to_do(self, seq: Sequence, num_slots: int, hits, full_sequence_must_fit: bool) -> bool:
        """A running request whose blocks already hold the new tokens and fill no new block:
        ``allocate_slots`` would succeed without changing anything (most decode steps)."""
        blocks = self.req_to_blocks.get(seq.request_id)
        if blocks is None or hits or full_sequence_must_fit:
            return False
        num_slots = min(num_slots, self.max_model_len)
        if len(blocks) * self.block_size < num_slots:
            return False
        if not self.enable_caching:
            return True
        full = min(num_slots, len(seq.tokens), len(seq.block_hashes) * self.block_size) // self.block_size
        return full <= self.num_cached_block.get(seq.request_id, 0)

    def cache_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Register the request's blocks that are full up to ``num_tokens`` (§4.1)."""
        num_cached = self.num_cached_block.get(seq.request_id, 0)
        num_full = min(num_tokens, len(seq.block_hashes) * self.block_size) // self.block_size
        if num_cached >= num_full:
            return
        self.pool.cache_full_blocks(self.req_to_blocks[seq.request_id], seq.block_hashes,
                                    num_cached, num_full)
        self.num_cached_block[seq.request_id] = num_full

    def num_cached_blocks(self, seq: Sequence) -> int:
        return self.num_cached_block.get(seq.request_id, 0)

    block_openings = staticmethod(rules.block_openings)

    def decode_steps(self, seqs: list[Sequence], computed: list[int], k: int, lag: int) -> None:
        """``k`` decode steps of running requests at once, in vLLM's order of pool operations.

        In step j, in running order, a request computing position ``c + j`` takes a new block
        when ``c + j`` starts one, and caches the block that the tokens known by then fill
        (``c + j + 1`` of them, synchronous; ``c + j``, async scheduling: ``lag`` = 1). The
        tokens are appended already (hashes exist); the blocks must fit (the caller checks).
        """
        pool, B = self.pool, self.block_size
        events = []
        for r, c in enumerate(computed):
            for j in range((-c) % B, k, B):               # block openings
                events.append((j, r))
            for j in range((-(c + 1 - lag)) % B, k, B):   # blocks becoming full and known
                events.append((j, r))
        for j, r in sorted(set(events)):
            seq, c = seqs[r], computed[r] + j
            blocks = self.req_to_blocks[seq.request_id]
            if len(blocks) * B < c + 1:
                blocks.extend(pool.get_new_blocks(1))
            if self.enable_caching:
                self.cache_blocks(seq, c + 1 - lag)

    def free(self, seq: Sequence) -> None:
        """Release a finished or preempted request, last block first (§3.5)."""
        blocks = self.req_to_blocks.pop(seq.request_id, [])
        self.num_cached_block.pop(seq.request_id, None)
        self.pool.free_blocks(reversed(blocks))

    # -- the pool ------------------------------------------------------------------------
    @property
    def usage(self) -> float:
        """KVCacheManager.usage: the share of usable blocks not free (the null block excluded)."""
        return self.pool.usage()

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def free_block_ids(self) -> list[int]:
        return self.pool.free_block_ids()

    def reset_prefix_cache(self) -> bool:
        """Drop every cached hash (vLLM refuses while a block is in use); True if done."""
        if not self.pool.reset_prefix_cache():
            return False
        if self.prefix_cache_stats is not None:
            self.prefix_cache_stats.reset = True
        return True

    def block_ids(self, seq: Sequence) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(seq.request_id, [])]
