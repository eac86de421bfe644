"""A vLLM replay's offload tier, resolved once: :class:`VllmTier` (``docs/engines/offload.md §1``, §2).

``kvsim.engines.offload.vllm_tier`` builds it from the options; the vLLM engine asks it for
the connector its request life calls (:meth:`VllmTier.connector`), runs the sequential
connector life per request (:meth:`VllmTier.sequential`) and reports what it did
(:meth:`VllmTier.run`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsim.tiers.lmcache import LMCacheSettings
from kvsim.tiers.lmcache_connector import LMCacheConnector
from kvsim.tiers.report import TierRun
from kvsim.tiers.vllm_connector import OffloadConnector, OffloadSettings
from kvsim.tiers.vllm_sequential import SequentialOffload


@dataclass(frozen=True)
class VllmTier:
    """vLLM's native CPU offloading (``native``) or LMCache (``lmcache``), sized in chunks."""

    backend: str                             # native | lmcache
    native: OffloadSettings | None = None
    lmcache: LMCacheSettings | None = None
    cpu_chunks: int = 0                      # LMCache's CPU tier (native: native.num_chunks)
    disk_chunks: int = 0                     # LMCache's local disk tier (0: none)
    token_budget: int = 8192                 # max_num_batched_tokens of a sequential replay's steps
    bytes_per_token: int = 0                 # KV bytes per token (0: no --model, bytes not reported)
    link_bytes_per_s: float = 32e9           # GPU <-> host (kvsim.costs.links), for timed replays
    disk_bytes_per_s: float = 7e9            # LMCache's local disk

    @property
    def chunk_tokens(self) -> int:
        """Tokens of one stored unit: the offload block (native) or LMCache's chunk."""
        return self.native.offload_block_size if self.native is not None else self.lmcache.chunk_size

    @property
    def capacity_tokens(self) -> dict[str, int]:
        cpu = self.native.num_chunks if self.native is not None else self.cpu_chunks
        out = {"cpu": cpu * self.chunk_tokens}
        if self.disk_chunks:
            out["disk"] = self.disk_chunks * self.chunk_tokens
        return out

    def connector(self) -> OffloadConnector | LMCacheConnector:
        """A fresh connector (scheduler side) for one engine."""
        if self.native is not None:
            return OffloadConnector(self.native)
        return LMCacheConnector(self.lmcache, self.cpu_chunks, self.disk_chunks)

    def sequential(self, gpu_block_size: int) -> SequentialOffload:
        """The connector's calls for requests served one at a time (offload.md §4)."""
        return SequentialOffload(self.connector(), self.token_budget, block_size=gpu_block_size)

    def load_seconds(self, loads: list[dict[str, int]]) -> float:
        """How long the step's loads take: each tier's tokens over its link (one link, loads queue)."""
        per = self.bytes_per_token
        return sum(n * per / (self.disk_bytes_per_s if name == "disk" else self.link_bytes_per_s)
                   for load in loads for name, n in load.items())

    def describe(self) -> str:
        cap = ", ".join(f"{name} {tokens:,} tokens" for name, tokens in self.capacity_tokens.items())
        if self.native is not None:
            s = self.native
            knobs = f"offload block {s.offload_block_size}, {s.eviction_policy}"
            if s.store_threshold >= 2:
                knobs += f", store threshold {s.store_threshold}"
            return f"vLLM native CPU offloading ({cap}; {knobs})"
        s = self.lmcache
        knobs = f"chunk {s.chunk_size}" + (", save_unfull_chunk" if s.save_unfull_chunk else "")
        if s.min_retrieve_tokens:
            knobs += f", min_retrieve_tokens {s.min_retrieve_tokens}"
        return f"LMCache ({cap}; {knobs})"

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.backend, "chunk_tokens": self.chunk_tokens,
                               "capacity_tokens": self.capacity_tokens, "token_budget": self.token_budget,
                               "bytes_per_token": self.bytes_per_token}
        if self.native is not None:
            out.update(eviction_policy=self.native.eviction_policy, store_threshold=self.native.store_threshold)
        else:
            out.update(save_unfull_chunk=self.lmcache.save_unfull_chunk,
                       min_retrieve_tokens=self.lmcache.min_retrieve_tokens)
        return out

    def run(self, connector: OffloadConnector | LMCacheConnector, gpu: np.ndarray,
            by_tier: dict[str, np.ndarray]) -> TierRun:
        """What the tier did in a replay: per request tokens from each tier, per run its counters."""
        c = self.chunk_tokens
        if isinstance(connector, OffloadConnector):
            k = connector.manager.counters
            stored = {"cpu": k.stored_chunks * c}
            loaded = {"cpu": k.loaded_chunks * c}
            evicted = {"cpu": k.evicted_chunks * c}
            failures = {"cpu": k.store_failures}
            skipped = {"cpu": k.skipped_by_threshold * c}
        else:
            k = connector.counters
            names = {"LocalCPUBackend": "cpu", "LocalDiskBackend": "disk"}
            stored = {"cpu": k.stored_chunks * c}
            if self.disk_chunks:
                stored["disk"] = stored["cpu"]       # every tier is written through (offload.md §2.3)
            loaded = {names[t]: n for t, n in k.loaded_by_tier.items()}
            evicted = {names[t]: n * c for t, n in connector.evictions().items()}
            failures = {"cpu": k.store_failures}
            skipped = {}
        links = {"cpu": self.link_bytes_per_s, "disk": self.disk_bytes_per_s}
        return TierRun(self.backend, self.describe(), self.capacity_tokens, {"gpu": gpu, **by_tier}, stored,
                       loaded, evicted, failures, skipped, self.bytes_per_token, links)


class SequentialTier:
    """The tier of a sequential vLLM replay: the connector's calls for each request, and a record
    of where each request's cached tokens came from."""

    def __init__(self, tier: VllmTier, gpu_block_size: int) -> None:
        self.tier = tier
        self.life = tier.sequential(gpu_block_size)
        self.gpu: list[int] = []
        self.by_tier: dict[str, list[int]] = {name: [] for name in tier.capacity_tokens}

    def serve(self, request_id: str, block_hashes, num_prompt_tokens: int, num_output_tokens: int, local: int,
              skip_reading_prefix_cache: bool = False, tokens=()) -> int:
        """The tokens loaded from the tier for a request whose GPU hit is ``local`` (external tokens)."""
        external = self.life.serve(request_id, block_hashes, num_prompt_tokens, num_output_tokens, local,
                                   skip_reading_prefix_cache, tokens).external
        conn = self.life.connector
        split = ({"cpu": external} if isinstance(conn, OffloadConnector)
                 else {{"LocalCPUBackend": "cpu", "LocalDiskBackend": "disk"}[t]: n for t, n in conn.last_split.items()})
        self._record(local, split)
        return external

    def rejected(self) -> None:
        """A request the engine refused: nothing from any tier."""
        self._record(0, {})

    def _record(self, local: int, split: dict[str, int]) -> None:
        self.gpu.append(local)
        for name, col in self.by_tier.items():
            col.append(split.get(name, 0))

    def run(self) -> TierRun:
        return self.tier.run(self.life.connector, np.asarray(self.gpu, np.int64),
                             {name: np.asarray(col, np.int64) for name, col in self.by_tier.items()})
