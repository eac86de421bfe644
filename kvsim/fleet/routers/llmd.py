"""llm-d's scheduler (EPP) with its approximate or precise prefix scorer (``docs/engines/routers.md §4``).

Each pod's score is ``queue * queue_score + kv * (1 - kv_usage) + prefix * prefix_score``
(defaults 2 / 2 / 3), and the max-score picker shuffles then sorts, so ties are random:

- queue score ``(maxQ - q) / (maxQ - minQ)``, 1 for all when every queue is equal; q is
  the replica's reported waiting count (``ReplicaLoad.waiting``);
- prefix score ``matchBlocks / totalBlocks``.

``llmd_approx`` hashes the prompt in blocks of ``blockSizeTokens`` (floored at 64; the last,
partial block hashed too), the chain seeded by the cache namespace; the index maps a hash to
the pods holding it, each pod an LRU of ``lruCapacityPerServer`` hashes, updated at dispatch.
The match walks the request's hashes, stops at the first one nobody holds, and counts per
pod the hashes it holds on the way (not necessarily consecutive: ``docs/engines/routers.md §4.2``).
kvsim's tokens stand for the estimate tokenizer's 4-byte pseudo-tokens.

``llmd_precise`` keeps each pod's blocks from its engine's KV events (GPU and CPU tiers,
keys computed from the events' tokens under their parents) and scores, per pod, the longest
consecutive prefix of the request's full engine blocks, each block weighted by the best tier
it is on (gpu 1.0, cpu 0.8; ``docs/engines/routers.md §4.3``).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from kvsim.fleet.base import ReplicaLoad, RouteRequest, Router
from kvsim.fleet.events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from kvsim.fleet.keys import block_keys, chain_keys, root_key
from kvsim.fleet.options import check

MIN_BLOCK_TOKENS = 64     # approximateprefix: minBlockSizeTokens (llm-d issue #1158)


@dataclass(frozen=True)
class LlmdSettings:
    """llm-d's default scorer weights and producer settings (``docs/engines/routers.md §4``)."""

    queue: float = 2.0
    kv: float = 2.0
    prefix: float = 3.0
    blockSizeTokens: int = 16
    lruCapacityPerServer: int = 31250
    maxPrefixTokensToMatch: int = 131072
    gpu: float = 1.0
    cpu: float = 0.8

    def __post_init__(self) -> None:
        check(min(self.queue, self.kv, self.prefix) >= 0, "scorer weights must be non-negative")
        check(self.blockSizeTokens >= 1, "blockSizeTokens must be at least 1")
        check(self.lruCapacityPerServer >= 1, "lruCapacityPerServer must be at least 1")


class _Llmd(Router):
    Settings = LlmdSettings
    load_aware = True

    def prefix_scores(self, req: RouteRequest, now: float) -> list[float]:
        raise NotImplementedError

    def scores(self, req: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> list[float]:
        """Each pod's weighted score (``docs/engines/routers.md §4.1``)."""
        s = self.settings
        loads = list(loads) or [ReplicaLoad()] * self.num_replicas
        q = [x.waiting for x in loads]
        hi, lo = max(q), min(q)
        queue = [1.0 if hi == lo else (hi - x) / (hi - lo) for x in q]
        prefix = self.prefix_scores(req, now)
        return [s.queue * queue[w] + s.kv * (1.0 - loads[w].kv_usage) + s.prefix * prefix[w]
                for w in range(self.num_replicas)]

    def candidates(self, req: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> frozenset[int]:
        sc = self.scores(req, loads, now)
        best = max(sc)
        return frozenset(w for w, x in enumerate(sc) if x == best)


class LlmdApprox(_Llmd):
    """The approximate producer: per-pod LRU of prompt-block hashes, written at dispatch."""

    name = "llmd_approx"

    def _setup(self) -> None:
        self.block = max(self.settings.blockSizeTokens, MIN_BLOCK_TOKENS)
        self.holders: dict[int, set[int]] = {}
        self.lru: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(self.num_replicas)]

    def hashes(self, req: RouteRequest) -> list[int]:
        """The request's block hashes, the last partial block included, capped at maxPrefixTokensToMatch."""
        toks = req.tokens[:self.settings.maxPrefixTokensToMatch]
        return block_keys(toks, self.block, req.namespace, partial=True)

    def prefix_scores(self, req: RouteRequest, now: float) -> list[float]:
        hs = self.hashes(req)
        counts = [0] * self.num_replicas
        for h in hs:
            pods = self.holders.get(h)
            if not pods:
                break            # stop at the first hash nobody holds
            for p in pods:
                counts[p] += 1
        return [c / len(hs) if hs else 0.0 for c in counts]

    def _dispatched(self, req: RouteRequest, replica: int, now: float) -> None:
        lru = self.lru[replica]
        for h in self.hashes(req):
            lru[h] = None
            lru.move_to_end(h)
            self.holders.setdefault(h, set()).add(replica)
        while len(lru) > self.settings.lruCapacityPerServer:
            old, _ = lru.popitem(last=False)
            pods = self.holders[old]
            pods.discard(replica)
            if not pods:
                del self.holders[old]


class LlmdPrecise(_Llmd):
    """The precise producer: each pod's blocks from its engine's BlockStored / BlockRemoved events."""

    name = "llmd_precise"
    needs_events = True

    def _setup(self) -> None:
        n = self.num_replicas
        self.tiers: list[dict[int, set[str]]] = [{} for _ in range(n)]   # key -> media
        self.engine_keys: list[dict[int, int]] = [{} for _ in range(n)]

    def prefix_scores(self, req: RouteRequest, now: float) -> list[float]:
        keys = block_keys(req.tokens, self.block_size, req.namespace)
        s = self.settings
        out = []
        for w in range(self.num_replicas):
            held, total = self.tiers[w], 0.0
            for k in keys:
                media = held.get(k)
                if not media:
                    break
                total += s.gpu if "GPU" in media else s.cpu
            out.append(total / len(keys) if keys else 0.0)
        return out

    def kv_event(self, replica: int, event: KvEvent, now: float) -> None:
        held, emap = self.tiers[replica], self.engine_keys[replica]
        if isinstance(event, BlockStored):
            if len(event.token_ids) == 0:          # a CPU copy of blocks known by their engine keys
                for h in event.block_hashes:
                    if h in emap:
                        held.setdefault(emap[h], set()).add(event.medium)
                return
            if event.parent_block_hash is None:
                parent = root_key((event.lora_name, event.cache_salt))
            elif event.parent_block_hash in emap:
                parent = emap[event.parent_block_hash]
            else:
                return
            for h, k in zip(event.block_hashes, chain_keys(event.token_ids, event.block_size, parent)):
                emap[h] = k
                held.setdefault(k, set()).add(event.medium)
        elif isinstance(event, BlockRemoved):
            for h in event.block_hashes:
                k = emap.get(h)
                if k is not None and k in held:
                    held[k].discard(event.medium)
                    if not held[k]:
                        del held[k]     # the engine-key map stays: a CPU copy may follow
        elif isinstance(event, AllBlocksCleared):
            held.clear()
            emap.clear()
