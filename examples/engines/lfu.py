"""An extra engine as a plugin: vLLM's blocks, evicted least-frequently-used first.

vLLM APC evicts the free block at the head of its LRU free queue (docs/engines/apc.md §3.3).
This engine keeps every other rule of vLLM 0.33 (full blocks only, chained hashes, the last
token recomputed, the scheduler) and changes only which free block is handed out next:

* a free block holding no cached KV, if any (earliest in the queue first);
* else the cached block hit the fewest times since it was cached, ties by queue order (LRU).

Use it as any engine (``--engine-plugin`` goes before the command)::

    kvsim --engine-plugin examples/engines/lfu.py:LFUSpec simulate LOG --policy apc,lfu
    kvsim --engine-plugin examples/engines/lfu.py:LFUSpec sweep LOG --policy lfu --capacity 1e4,1e5
    kvsim --engine-plugin examples/engines/lfu.py:LFUSpec simulate LOG --policy lfu --replay steps

or install a package that names it in its ``kvsim.engines`` entry points. It has one
implementation (the readable one serves as both) and no one-pass curve or optimum, so a
sweep and a report draw its exact replays only. docs/engines/plugins.md walks through it.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvsim.engines.vllm.manager import BlockPool, KVCacheManager
from kvsim.engines.vllm.scheduler import VllmSchedSettings
from kvsim.engines.vllm.sequential import APCReference
from kvsim.engines.vllm.serve import ApcServeEngine
from kvsim.engines.vllm.spec import APCSpec

HERE = __name__


class LFUBlockPool(BlockPool):
    """vLLM's block pool, handing out the least frequently hit free block first."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hits: dict[int, int] = {}          # block id -> hits since it was cached

    def touch(self, blocks) -> None:
        for block in blocks:
            if block.block_hash is not None:
                self.hits[block.block_id] = self.hits.get(block.block_id, 0) + 1
        super().touch(blocks)

    def _victim(self) -> int:
        best, best_key = None, None
        for position, block_id in enumerate(self.free_queue):
            block = self.blocks[block_id]
            if block.block_hash is None:
                return block_id                 # holds nothing: take it first
            key = (self.hits.get(block_id, 0), position)
            if best_key is None or key < best_key:
                best, best_key = block_id, key
        if best is None:
            raise ValueError("no free blocks")
        return best

    def get_new_blocks(self, n: int) -> list:
        if n > self.num_free_blocks:
            raise ValueError(f"cannot get {n} free blocks from the pool")
        out = []
        for _ in range(n):
            block_id = self._victim()
            self.free_queue.remove(block_id)
            block = self.blocks[block_id]
            if block.block_hash is not None:
                self.evict(block)
                self.hits.pop(block_id, None)
            self._num_empty -= 1
            block.ref_cnt = 1
            out.append(block)
        self.peak_used_blocks = max(self.peak_used_blocks, self.used_blocks)
        return out


class LFUManager(KVCacheManager):
    pool_type = LFUBlockPool


class LFUReference(APCReference):
    """The sequential request life of vLLM over the LFU pool."""

    manager_type = LFUManager


class LFUServeEngine(ApcServeEngine):
    sequential = f"{HERE}:LFUReference"


@dataclass(frozen=True)
class LFUSchedSettings(VllmSchedSettings):
    """vLLM's scheduler over the LFU pool (the readable manager)."""

    def manager(self, max_model_len: int):
        return LFUManager(self.num_gpu_blocks, self.block_size, self.enable_prefix_caching, log_stats=False,
                          max_model_len=max_model_len, watermark=self.watermark, hash_algo=self.hash_algo)


class LFUSpec(APCSpec):
    name = "lfu"
    label = "vLLM blocks, LFU eviction"
    short = "LFU"
    release = "vLLM 0.33.0"
    color = "#7c3aed"
    curve = None
    curve_exact = False
    optimal = None
    reference = f"{HERE}:LFUReference"
    fast = f"{HERE}:LFUReference"
    serve = f"{HERE}:LFUServeEngine"

    def scheduler_settings(self, options, overrides, trace=None):
        settings, note = super().scheduler_settings(options, overrides, trace)
        fields = {k: getattr(settings, k) for k in settings.__dataclass_fields__}
        return LFUSchedSettings(**fields), note

    def describe(self, config: dict) -> str:
        return f"vLLM blocks + LFU (block {config.get('block_size', '?')})"
