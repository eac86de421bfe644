"""SGLang 0.5.23's scheduler with HiCache on (``--enable-hierarchical-cache``; ``docs/engines/offload.md §3``).

:class:`HiCacheEngine` is kvsim's scheduler loop (:mod:`kvsim.engines.sglang.scheduler`) over the
tree with host copies (:class:`~kvsim.engines.sglang.hitree.HiRadixTree`), with HiCache's calls
where SGLang's scheduler makes them:

1. ``check_hicache_events`` at the top of ``get_next_batch_to_run``: the transfers in flight
   (backups, load-backs; they take no time) are acknowledged and release their locks;
2. ``PrefillAdder.add_one_req`` loads a waiting request's host hit back before admitting it
   (``init_load_back``, in :mod:`kvsim.engines.sglang.adder`);
3. ``prepare_for_extend`` splits a request's cached tokens into device and host once, at its
   first chunk (``split_cached_prefix_by_tier``, offload.md §3.6).

Every step is taken one at a time. In a timed replay a step that loads lasts
``max(compute, transfer)``: SGLang loads layer by layer while the batch computes
(``layer_first`` loads, ``ready_to_load_host_cache``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsim.engines.sglang.scheduler import SglangEngine, SglangSchedSettings
from kvsim.tiers.hicache import split_cached_prefix


@dataclass(frozen=True)
class HiCacheSchedSettings(SglangSchedSettings):
    """The scheduler's settings with a host cache (:class:`~kvsim.tiers.hicache.HiCacheSettings`)."""

    hicache: Any = None

    def engine(self, prompts, outputs, loras=None, salts=None, logprob_starts=None, **_other) -> "HiCacheEngine":
        return HiCacheEngine(self, prompts, outputs, loras, salts, logprob_starts)

    def without_tier(self) -> SglangSchedSettings:
        """The same scheduler without the host cache (the timed comparison)."""
        return SglangSchedSettings(**{k: getattr(self, k) for k in SglangSchedSettings.__dataclass_fields__})

    def describe(self) -> str:
        return f"{super().describe()}; {self.hicache.describe()}"


class HiCacheEngine(SglangEngine):
    """The scheduler process with HiCache."""

    def __init__(self, settings: HiCacheSchedSettings, *args, **kwargs) -> None:
        super().__init__(settings, *args, **kwargs)
        self.split: dict[int, tuple[int, int]] = {}    # request -> (device, host) cached tokens
        self.result.extra["offload"] = _LiveRun(self)

    def fast_forward(self, step: int, horizon: int) -> int:
        return 0

    @property
    def on_batch(self):
        return self._on_batch

    @on_batch.setter
    def on_batch(self, fn) -> None:
        """The timed clock's callback, told how long this step's load-backs take."""
        if fn is None:
            self._on_batch = None
            return

        def with_loads(step, reqs, new, context, decode):
            tokens, self.cache.pending_load = self.cache.pending_load, 0
            fn(step, reqs, new, context, decode, load_s=self.settings.hicache.load_seconds(tokens), overlap=True)
        self._on_batch = with_loads

    def get_next_batch_to_run(self):
        self.cache.check_hicache_events()
        return super().get_next_batch_to_run()

    def prepare_for_extend(self, batch) -> None:
        super().prepare_for_extend(batch)
        for r in batch.reqs:
            if r.index not in self.split and not r.retracted_stain:
                self.split[r.index] = split_cached_prefix(r.kv.prefix_len, r.kv.cached_host)

    def tier_run(self):
        from kvsim.engines.sglang.hitree import tier_run

        n = len(self.prompts)
        device, host = np.zeros(n, np.int64), np.zeros(n, np.int64)
        for i, (d, h) in self.split.items():
            device[i], host[i] = d, h
        return tier_run(self.cache.tree, device.tolist(), host.tolist())


class _LiveRun:
    """The host tier's :class:`~kvsim.tiers.report.TierRun` as of now."""

    def __init__(self, engine: HiCacheEngine) -> None:
        self._engine = engine

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.snapshot(), name)

    def snapshot(self):
        return self._engine.tier_run()
