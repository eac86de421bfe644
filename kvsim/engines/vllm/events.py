"""vLLM's KV events, as a replica publishes them to a router (``BlockStored`` / ``BlockRemoved``).

vLLM 0.33 (``v1/core/block_pool.py``) publishes, with ``enable_kv_cache_events``, one
``BlockStored`` per ``cache_full_blocks`` call: the hashes of the blocks it registered,
the hash of the block before them (None from the start of the request), their token ids,
the block size and the LoRA adapter; and one ``BlockRemoved`` per evicted hash, when a
cached block is handed out again (``docs/engines/apc.md §3.3``). kvsim's readable pool
records the hashes (``BlockPool(record_events=True)``); this module adds what a router
needs besides, on the readable manager only (the compiled one records nothing):

- :func:`record` turns recording on for a manager (or the engine holding one) and returns
  ``drain()``, which hands back the events since the last call as plain tuples
  ``("stored", hashes, parent, token_ids, block_size, lora, cache_salt)``,
  ``("removed", hashes)``, ``("cleared",)``;
- :func:`sequential` is a sequential cache that serves one request at a time with events,
  the same life as :class:`~kvsim.engines.vllm.sequential.APCReference` (its decode steps
  in one call, as the serve adapter does), an unlimited pool growing as it must;
- :func:`scheduler_settings` are scheduler settings whose engine drives the readable manager;
- :func:`device_blocks` reads what Dynamo's event-fed index would hold straight from the
  compiled pools, when that is exact (:class:`DeviceBlocks`), so that such a fleet runs on the
  compiled manager without events.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from kvsim.engines.base import EventReplica, Served, Workload
from kvsim.engines.vllm.manager import KVCacheManager

#: blocks an unlimited pool starts with; it grows whenever a request could evict
INITIAL_UNLIMITED_BLOCKS = 1024


class _StoredTokens:
    """A manager mixin: each ``("stored", hashes)`` the pool records gains the parent hash,
    the token ids, the block size and the namespace, as vLLM's ``BlockStored`` carries them."""

    def cache_blocks(self, seq, num_tokens: int) -> None:
        before = self.num_cached_block.get(seq.request_id, 0)
        super().cache_blocks(seq, num_tokens)       # type: ignore[misc]
        after = self.num_cached_block.get(seq.request_id, 0)
        if after <= before:
            return
        events = self.pool.events
        kind, stored = events.pop()                 # the one the pool just recorded
        assert kind == "stored"
        hashes, B = seq.block_hashes, self.block_size
        tokens = np.asarray(seq.tokens[before * B:after * B], np.int64).copy()
        salt = seq.cache_salt or None
        if list(stored) == list(hashes[before:after]):
            events.append(("stored", tuple(stored), hashes[before - 1] if before else None, tokens, B,
                           seq.lora, salt))
            return
        registered = set(stored)   # a block registered already is skipped: one event per new block
        for j in range(before, after):
            if hashes[j] in registered:
                events.append(("stored", (hashes[j],), hashes[j - 1] if j else None,
                               tokens[(j - before) * B:(j - before + 1) * B], B, seq.lora, salt))


_CLASSES: dict[type, type] = {}


def _manager_of(obj: Any) -> KVCacheManager:
    for manager in (obj, getattr(obj, "manager", None), getattr(getattr(obj, "scheduler", None), "cache", None)):
        if isinstance(manager, KVCacheManager):
            return manager
    raise TypeError(f"{type(obj).__name__} drives no readable vLLM KV-cache manager: it records no KV events")


def record(obj: Any) -> Callable[[], list[tuple]]:
    """Record the KV events of ``obj`` (a readable manager, a sequential cache or a stepped
    engine holding one) from now on; returns ``drain()``."""
    manager = _manager_of(obj)
    cls = type(manager)
    if not issubclass(cls, _StoredTokens):
        if cls not in _CLASSES:
            _CLASSES[cls] = type(f"{cls.__name__}WithEvents", (_StoredTokens, cls), {})
        manager.__class__ = _CLASSES[cls]
    pool = manager.pool
    if pool.events is None:
        pool.events = []

    def drain() -> list[tuple]:
        out = [("removed", (e[1],)) if e[0] == "removed" else e for e in pool.events]
        pool.events.clear()
        return out
    return drain


class _EventSequential(EventReplica):
    """One replica of a sequential fleet: the reference model serving one request at a time."""

    implementation = "reference"

    def __init__(self, model_class: type, settings) -> None:
        self.unlimited = settings.num_gpu_blocks is None
        blocks = INITIAL_UNLIMITED_BLOCKS if self.unlimited else settings.num_gpu_blocks
        cache = model_class(dataclasses.replace(settings, num_gpu_blocks=blocks))
        super().__init__(cache, settings, record(cache))

    def serve_at(self, work: Workload, i: int) -> Served:
        """``APCReference.serve`` with the decode steps in one call (the same pool, §4)."""
        cache = self.cache
        req = work.request(i)
        if self.unlimited:
            cache.pool.grow_before_evicting(cache.blocks_needed(req))
        # an offload tier under the pool: its own life, step by step
        return cache.serve(req, step_by_step=getattr(cache, "tier", None) is not None)


def sequential(spec, settings) -> _EventSequential:
    """A sequential cache of ``spec``'s readable model (``settings``: its APC settings) with events."""
    return _EventSequential(spec.implementation("reference"), settings)


def scheduler_settings(settings):
    """Scheduler settings whose engine drives the readable manager (which records events)."""
    return dataclasses.replace(settings, implementation="reference")


class DeviceBlocks:
    """A replica's device blocks as an index fed by its events holds them, read from its compiled pool.

    Dynamo's index applies a replica's ``BlockStored`` / ``BlockRemoved`` after each of the
    replica's turns and keeps a key while some block holds it (copies counted). vLLM's pool
    registers every block of a running request, so a stored chain never continues a parent
    the index lacks, and at every routing decision the index holds exactly the keys cached in
    the pool (``docs/engines/routers.md §3.1``): a request's consecutive prefix blocks there are
    the pool's own lookup, without the last-token cap. Keys are the pool's (the fast hash), one
    per namespace and token prefix, as the router's own keys are.
    """

    def __init__(self, manager) -> None:
        self.manager = manager

    def keys(self, req) -> np.ndarray:
        """The pool's keys of the full blocks of a routed request's prompt (uint64; ``req`` has
        ``index``, ``tokens``, ``lora`` and ``cache_salt``): a view of the fleet's log keys where
        the log was keyed once, else hashed from its tokens (which are read only then)."""
        logged = self.manager.logged_prompt_keys(req.index)
        return logged if logged is not None else self.manager.prompt_keys(req.tokens, req.lora, req.cache_salt)

    def prefix_blocks(self, keys: np.ndarray) -> int:
        """How many leading ``keys`` the pool holds."""
        return self.manager.held_prefix(keys)


def reads_devices(settings) -> bool:
    """Whether engines of these scheduler settings offer :class:`DeviceBlocks`: the compiled
    manager with the fast hash (vLLM's exact digests are numbered per pool) and no offload
    tier (whose CPU copies an index hears of by events)."""
    return settings.implementation == "fast" and settings.hash_algo == "fast" \
        and getattr(settings, "offload", None) is None


def device_blocks(engines) -> list[DeviceBlocks]:
    """Each engine's :class:`DeviceBlocks` (engines whose settings pass :func:`reads_devices`)."""
    return [DeviceBlocks(e.scheduler.cache) for e in engines]
