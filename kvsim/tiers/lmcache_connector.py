"""LMCache 0.5.6 as vLLM's KV connector (``LMCacheConnectorV1``), with transfers that take no time.

The same six calls as vLLM's native connector (:mod:`kvsim.tiers.vllm_connector`), made by
kvsim's vLLM request life where vLLM's scheduler makes them (``docs/engines/offload.md §2``):

1. ``on_new_request(req)``;
2. ``get_num_new_matched_tokens(req, local)``: LMCache's lookup of the prompt's chunk keys,
   pinning the hit (offload.md §2.4); vLLM is told ``need`` (§2.6) and loads it
   synchronously, before the forward of the step that schedules the request (§2.5);
3. ``update_state_after_alloc`` (nothing to do: the load is synchronous);
4. ``build_connector_meta(scheduled, finished)`` at the end of every ``schedule()``: the
   worker's ``wait_for_save`` of that step, per scheduled request: unpin its lookup, then
   store the chunks its save rule gives (§2.7);
5. ``update_connector_output`` and 6. ``request_finished``: nothing is pending.

A request reads ``request_id``, ``num_prompt_tokens``, ``num_computed_tokens``,
``skip_reading_prefix_cache``, ``num_tokens`` and ``token_ids`` (prompt and outputs so far).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvsim.tiers.lmcache import LMCacheSettings, LMCacheStorage, LRUTier, SaveTracker, chunk_keys, need_tokens
from kvsim.tiers.vllm_connector import ConnectorMeta


@dataclass
class LMCacheCounters:
    """Per-run counts of the storage (chunks) and of what vLLM loaded (tokens)."""

    stored_chunks: int = 0        # chunks newly put
    store_failures: int = 0       # stores cut short: no slot for a chunk (offload.md §2.3)
    dropped_chunks: int = 0       # chunks those stores could not place
    loaded_tokens: int = 0        # vLLM's external tokens, summed
    loaded_by_tier: dict[str, int] = field(default_factory=dict)


@dataclass(eq=False)
class _Request:
    req: Any
    tracker: SaveTracker | None = None
    first: bool = True


class LMCacheConnector:
    """``LMCacheConnectorV1``'s scheduler and worker sides over :class:`LMCacheStorage`."""

    def __init__(self, settings: LMCacheSettings, cpu_chunks: int, disk_chunks: int = 0) -> None:
        self.settings = settings
        more = [LRUTier("LocalDiskBackend", disk_chunks)] if disk_chunks else []
        self.storage = LMCacheStorage(cpu_chunks, more)
        self.counters = LMCacheCounters()
        self.last_split: dict[str, int] = {}      # tier name -> tokens of the last request's load
        self._reqs: dict[str, _Request] = {}

    def on_new_request(self, req: Any) -> None:
        self._reqs[req.request_id] = _Request(req)

    def get_num_new_matched_tokens(self, req: Any, local: int) -> tuple[int | None, bool]:
        """``need`` tokens beyond the GPU hit ``local``; loaded synchronously (offload.md §2.6)."""
        s, c = self.settings, self.settings.chunk_size
        st = self._reqs[req.request_id]
        L = req.num_prompt_tokens
        keys = chunk_keys(req.token_ids[:L], c, s.save_unfull_chunk)
        parts = self.storage.batched_contains(keys)
        hit = min(self.storage.lookup(keys, req.request_id, pin=True) * c, L)
        need, held = need_tokens(hit, local, req.num_tokens, s)
        if req.skip_reading_prefix_cache:
            need = 0
        st.tracker, st.first = SaveTracker(L, held, s), True
        self.last_split = self._split(parts, local, need)
        self.counters.loaded_tokens += need
        for name, n in self.last_split.items():
            self.counters.loaded_by_tier[name] = self.counters.loaded_by_tier.get(name, 0) + n
        return need, False

    def _split(self, parts: list[tuple[LRUTier, int]], local: int, need: int) -> dict[str, int]:
        """Tokens of the load ``[local, local + need)`` from each tier of the hit."""
        out, start, c = {}, 0, self.settings.chunk_size
        for tier, n in parts:
            end = start + n * c
            got = max(0, min(end, local + need) - max(start, local))
            if got:
                out[tier.name] = out.get(tier.name, 0) + got
            start = end
        return out

    def update_state_after_alloc(self, req: Any, external: int) -> None:
        """The load is synchronous: nothing to plan."""

    def build_connector_meta(self, scheduled: Mapping[str, int], finished: Iterable[str] = (),
                             preempted: Iterable[str] = ()) -> ConnectorMeta:
        """This step's ``wait_for_save``: per scheduled request, unpin then store (offload.md §2.7)."""
        c = self.settings.chunk_size
        for rid, n in scheduled.items():
            st = self._reqs.get(rid)
            if st is None or st.tracker is None:
                continue
            self.storage.lookup_unpin(rid)
            req = st.req
            span = st.tracker.step(req.num_computed_tokens + n, n, first=st.first)
            st.first = False
            if span is None:
                continue
            skip, end = span
            keys = chunk_keys(req.token_ids[:end], c, save_unfull_chunk=True)
            done = self.storage.store(keys[skip // c:])
            self.counters.stored_chunks += len(done.stored)
            if done.dropped:
                self.counters.store_failures += 1
                self.counters.dropped_chunks += len(done.dropped)
        for rid in finished:
            self.storage.lookup_unpin(rid)
            self._reqs.pop(rid, None)
        return ConnectorMeta({}, {}, set())

    def update_connector_output(self, completed_jobs: Iterable[int]) -> None:
        """No transfer outlives its step."""

    def request_finished(self, req: Any) -> None:
        """Freed at once; its state goes with the next step's finished list."""

    def has_pending_work(self) -> bool:
        return False

    def evictions(self) -> dict[str, int]:
        """Chunks each tier evicted."""
        return {tier.name: tier.evictions for tier in self.storage.tiers}
