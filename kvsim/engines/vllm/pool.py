"""vLLM's KV block pool, readable (``docs/engines/apc.md §3``; vLLM ``v1/core/block_pool.py``).

Three pieces: blocks with reference counts; the free queue, a doubly linked list of every
block with ``ref_cnt == 0`` in eviction order (head = next victim), which keeps cached blocks
until they are handed out again; and the map from block hash to the blocks registered under
it (several blocks may share a hash: vLLM never de-duplicates).
"""
from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

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
    def cache_full_blocks(self, blocks: list[Block], hashes: list[Hashable],
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
