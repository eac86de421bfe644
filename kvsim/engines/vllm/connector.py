"""vLLM 0.33.0's scheduler with a KV connector: the offload tier under load (``docs/engines/offload.md §1``, §2).

:class:`ConnectorScheduler` is kvsim's v1 scheduler (:mod:`kvsim.engines.vllm.scheduler`) with the
connector calls of ``vllm/v1/core/sched/scheduler.py`` (vLLM's native ``OffloadingConnector``
or LMCache's, :mod:`kvsim.tiers`), each where vLLM makes it:

1. ``on_new_request`` when a request is added;
2. waiting requests: those holding KV blocks (an async load done, a resumed request) are
   tried first; a request still loading is skipped (``WAITING_FOR_REMOTE_KVS``); a new one
   asks ``get_num_new_matched_tokens`` after its GPU hit (None: skipped this step) and
   allocates its local + external tokens; ``update_state_after_alloc`` after the allocation;
   an async load holds its blocks without computing, admitted only if it leaves the blocks
   in-flight prefills still need (``reserved_blocks``), and its request waits (offload.md §1.6);
3. ``build_connector_meta`` at the end of every ``schedule()``, before the computed counts
   advance; the worker runs the step's jobs (transfers take no time,
   :class:`~kvsim.tiers.vllm_connector.InstantWorker`);
4. in ``update_from_output``: ``request_finished`` for each finished request, then the
   worker's completions (``update_connector_output``); a finished load caches its blocks
   when its request is next looked at (``_update_waiting_for_remote_kv``: a full-prompt
   hit recomputes its last token).

The scheduler drives the readable :class:`~kvsim.engines.vllm.manager.KVCacheManager` (the
compiled one knows no external tokens) and takes every step one at a time.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsim.engines.vllm.manager import KVCacheManager
from kvsim.engines.vllm.scheduler import (FINISHED, PREEMPTED, WAITING, StepPlan, VllmEngine, VllmRequest,
                                          VllmSchedSettings, VllmScheduler, WaitingQueue, waiting_chunk)
from kvsim.tiers.lmcache_connector import LMCacheConnector
from kvsim.tiers.vllm_connector import InstantWorker

WAITING_FOR_REMOTE_KVS = 4


@dataclass(frozen=True)
class OffloadSchedSettings(VllmSchedSettings):
    """The scheduler's settings with an offload tier (:class:`~kvsim.tiers.setup.VllmTier`)."""

    offload: Any = None

    def manager(self, max_model_len: int):
        return DeferringKVCacheManager(self.num_gpu_blocks, self.block_size, True, log_stats=False,
                                       max_model_len=max_model_len, watermark=self.watermark, hash_algo=self.hash_algo)

    def scheduler(self) -> "ConnectorScheduler":
        return ConnectorScheduler(self)

    def without_tier(self) -> VllmSchedSettings:
        """The same scheduler without the tier (the timed comparison)."""
        fields = {k: getattr(self, k) for k in VllmSchedSettings.__dataclass_fields__}
        return VllmSchedSettings(**fields)

    def engine(self, prompts, outputs, priorities=None, loras=None, salts=None, prompt_logprobs=None,
               **_other) -> "ConnectorEngine":
        return ConnectorEngine(self, prompts, outputs, priorities, loras, salts, prompt_logprobs)

    def describe(self) -> str:
        return f"{super().describe()}; {self.offload.describe()}"


class DeferringKVCacheManager(KVCacheManager):
    """The readable manager whose frees a scheduler may hold back (``_free_request_blocks``)."""

    defer = None      # defer(seq, blocks) -> True if the scheduler keeps the blocks for later

    def free(self, seq) -> None:
        if self.defer is not None and self.defer(seq):
            self.num_cached_block.pop(seq.request_id, None)
            return
        super().free(seq)


class _View:
    """A request as the connector reads it (vLLM ``Request``), read live from kvsim's."""

    __slots__ = ("r",)

    def __init__(self, r: VllmRequest) -> None:
        self.r = r

    @property
    def request_id(self) -> str:
        return self.r.seq.request_id

    @property
    def block_hashes(self):
        return self.r.seq.block_hashes

    @property
    def num_prompt_tokens(self) -> int:
        return self.r.num_prompt_tokens

    @property
    def num_computed_tokens(self) -> int:
        return self.r.num_computed_tokens

    @property
    def skip_reading_prefix_cache(self) -> bool:
        return self.r.seq.skip_reading_prefix_cache

    @property
    def num_tokens(self) -> int:
        return self.r.num_tokens

    @property
    def is_finished(self) -> bool:
        return self.r.status == FINISHED

    @property
    def token_ids(self):
        return self.r.seq.tokens[:self.r.num_tokens]


class ConnectorScheduler(VllmScheduler):
    """``Scheduler`` with ``kv_connector`` set."""

    def __init__(self, settings: OffloadSchedSettings) -> None:
        super().__init__(settings)
        self.tier = settings.offload
        self.connector = self.tier.connector()
        self.worker = InstantWorker()
        self.holding = WaitingQueue(settings.policy == "priority")    # kv_holding_waiting
        self.views: dict[VllmRequest, _View] = {}
        self.inflight: set[VllmRequest] = set()       # _inflight_prefills
        self.finished_recving: set[str] = set()
        self.finished_ids: list[str] = []             # finished since the last schedule()
        self.preempted_ids: list[str] = []
        self.external: dict[int, int] = {}            # request index -> external tokens (first prefill)
        self.split: dict[int, dict[str, int]] = {}    # request index -> loaded tokens per tier
        self.loads: list[dict[str, int]] = []         # tokens loaded per tier in the step being built
        # async scheduling with a consumer connector frees a request's blocks only once the
        # steps that may still write them are processed (defer_block_free, scheduler.py:188-196)
        self.defer_block_free = settings.async_scheduling
        self.sched_seq = self.processed_seq = 0
        self.last_sched: dict[str, int] = {}
        self.deferred_frees: deque = deque()
        self.cache.defer = self._defer_free

    def has_requests(self) -> bool:
        return super().has_requests() or bool(self.holding) or self.connector.has_pending_work()

    def idle(self) -> bool:
        """Nothing waits, runs or is in flight (blocks held back included)."""
        return not self.has_requests()

    def add_request(self, req: VllmRequest) -> None:
        view = self.views[req] = _View(req)
        self.connector.on_new_request(view)
        super().add_request(req)

    # -- waiting requests, with the connector (scheduler.py:1049-1610) ---------------------
    def _schedule_waiting(self, scheduled: dict, budget: int, threshold: int) -> int:
        s, cache, running, conn = self.settings, self.cache, self.running, self.connector
        skipped_waiting: list[VllmRequest] = []
        skipped_holding: list[VllmRequest] = []

        def skip(queue: WaitingQueue) -> None:
            r = queue.pop()
            (skipped_holding if r.num_computed_tokens > 0 or r.status == WAITING_FOR_REMOTE_KVS
             else skipped_waiting).append(r)

        while budget > 0:
            queue = self.holding if self.holding else self.waiting   # KV holders are drained first
            if not queue or len(running) >= s.max_num_seqs:
                break
            req = queue.peek()
            if req.status == WAITING_FOR_REMOTE_KVS:
                if req.seq.request_id not in self.finished_recving:
                    skip(queue)                         # its load is still in flight
                    continue
                self._update_waiting_for_remote_kv(req)
            if req.num_stale_output_tokens:
                skip(queue)
                continue
            external, load_async = 0, False
            if req.num_computed_tokens == 0:
                hits, local = cache.lookup(req.seq)
                external, load_async = conn.get_num_new_matched_tokens(self.views[req], local)
                if req.seq.skip_reading_prefix_cache:
                    external, load_async = 0, False
                if external is None:                    # a chunk it needs is being stored or loaded
                    skip(queue)
                    continue
                computed = local + external
                if req.num_preemptions <= 0:            # PrefillStats of the first prefill (offload.md §1.12)
                    req.prefill_cached = computed
                    self.external[req.index] = external
                    self.split[req.index] = self._split(external)
            else:                                       # its KV arrived: resume where the load ended
                hits, local, computed = [], 0, req.num_computed_tokens
            if load_async:
                n = 0                                   # loading: no compute this step
            else:
                n = waiting_chunk(req.num_tokens - computed, threshold, budget, s.enable_chunked_prefill)
                if n < 0:
                    break
            reserved = sum(cache.num_blocks_to_allocate(r.seq, r.num_tokens, []) for r in self.inflight) \
                if load_async else 0
            if not cache.allocate(req.seq, req.num_computed_tokens, n, local, hits,
                                  full_sequence_must_fit=s.reserve_full_isl, apply_watermark=bool(running),
                                  num_external=external, delay_cache=load_async, reserved_blocks=reserved):
                break                                   # head-of-line blocking (§3.3)
            conn.update_state_after_alloc(self.views[req], external)
            if load_async:                              # WAITING_FOR_REMOTE_KVS (offload.md §1.6)
                req.status = WAITING_FOR_REMOTE_KVS
                req.num_computed_tokens = computed
                self.inflight.add(req)
                self.loads.append(self._split(external))
                skip(queue)
                continue
            if external:
                self.loads.append(self._split(external))   # a synchronous load (LMCache, offload.md §2.5)
            queue.pop()
            self._start(req, n, computed, scheduled)
            budget -= n
            if computed + n < req.num_tokens:
                self.inflight.add(req)
        for r in reversed(skipped_holding):
            self.holding.prepend(r)
        for r in reversed(skipped_waiting):
            self.waiting.prepend(r)
        return budget

    def _split(self, external: int) -> dict[str, int]:
        conn = self.connector
        if isinstance(conn, LMCacheConnector):
            names = {"LocalCPUBackend": "cpu", "LocalDiskBackend": "disk"}
            return {names[t]: n for t, n in conn.last_split.items()}
        return {"cpu": external}

    def _update_waiting_for_remote_kv(self, req: VllmRequest) -> None:
        """The load is done: cache its blocks; a full-prompt hit recomputes its last token (offload.md §1.6)."""
        self.cache.cache_blocks(req.seq, req.num_computed_tokens)
        if req.num_computed_tokens == req.num_tokens:
            req.num_computed_tokens = req.num_tokens - 1
        self.finished_recving.discard(req.seq.request_id)
        req.status = PREEMPTED if req.num_preemptions else WAITING

    def _defer_free(self, seq) -> bool:
        """``_free_request_blocks``: hold the blocks while a step that may write them is in flight."""
        if not self.defer_block_free or self.last_sched.get(seq.request_id, 0) <= self.processed_seq:
            return False      # freed at once
        blocks = self.cache.req_to_blocks.pop(seq.request_id, [])
        if blocks:
            self.deferred_frees.append((self.sched_seq, blocks))
        return True

    def _can_free(self, req: VllmRequest) -> bool:
        """``_request_blocks_can_be_freed``: no step in flight may still write its blocks."""
        return not self.defer_block_free or self.last_sched.get(req.seq.request_id, 0) <= self.processed_seq

    def _drain_deferred_frees(self) -> None:
        while self.deferred_frees and self.deferred_frees[0][0] <= self.processed_seq:
            _, blocks = self.deferred_frees.popleft()
            self.cache.pool.free_blocks(reversed(blocks))   # the tail is evicted first

    def _update_after_schedule(self, step: int, scheduled: dict, decoding: set) -> StepPlan:
        """``build_connector_meta`` before the computed counts advance; the worker runs its jobs."""
        meta = self.connector.build_connector_meta({r.seq.request_id: n for r, n in scheduled.items()},
                                                   self.finished_ids, self.preempted_ids)
        self.finished_ids, self.preempted_ids = [], []
        kv_output = self.worker.step(meta)
        if self.defer_block_free and any(scheduled.values()):
            self.sched_seq += 1
            for req in scheduled:
                self.last_sched[req.seq.request_id] = self.sched_seq
        plan = super()._update_after_schedule(step, scheduled, decoding)
        for req in scheduled:
            if not req.is_prefill_chunk:
                self.inflight.discard(req)
        plan.kv_output = kv_output
        plan.loads, self.loads = self.loads, []
        return plan

    def _preempt(self, req: VllmRequest) -> None:
        self.inflight.discard(req)
        self.preempted_ids.append(req.seq.request_id)
        super()._preempt(req)

    # -- update_from_output: finishes, then the worker's completions ------------------------
    def update_from_output(self, plan: StepPlan, result) -> None:
        if self.defer_block_free and any(plan.scheduled.values()):
            self.processed_seq += 1
            self._drain_deferred_frees()
        before = len(result.finished)
        super().update_from_output(plan, result)
        for i in result.finished[before:]:
            req = self._by_index[i]
            self.inflight.discard(req)
            self.connector.request_finished(self.views.pop(req))
            self.finished_ids.append(req.seq.request_id)
        done, recving = plan.kv_output
        self.connector.update_connector_output(done)
        for rid in recving:
            req = self._by_id.get(rid)
            if req is not None and req.status == WAITING_FOR_REMOTE_KVS:
                self.finished_recving.add(rid)

    @property
    def _by_index(self) -> dict[int, VllmRequest]:
        return {r.index: r for r in self.views}

    @property
    def _by_id(self) -> dict[str, VllmRequest]:
        return {r.seq.request_id: r for r in self.views}

    def tier_run(self, n: int, cached: np.ndarray):
        """What the tier did (:class:`~kvsim.tiers.report.TierRun`): per request its tokens from each tier."""
        by_tier = {name: np.zeros(n, np.int64) for name in self.tier.capacity_tokens}
        external = np.zeros(n, np.int64)
        for i, split in self.split.items():
            external[i] = self.external[i]
            for name, tokens in split.items():
                by_tier[name][i] = tokens
        return self.tier.run(self.connector, np.maximum(cached - external, 0), by_tier)


class ConnectorEngine(VllmEngine):
    """The engine core around :class:`ConnectorScheduler`: every step taken one at a time.

    In a timed replay a step that loads lasts ``max(compute, transfer)`` for vLLM's native
    connector (the load is asynchronous: other requests compute meanwhile) and
    ``compute + transfer`` for LMCache (``start_load_kv`` loads before the forward); a
    transfer takes its bytes over the tier's link (:meth:`~kvsim.tiers.setup.VllmTier.load_seconds`)."""

    def fast_forward(self, step: int, horizon: int) -> int:
        return 0

    def schedule(self, step: int) -> StepPlan:
        plan = self.scheduler.schedule(step)
        if self.on_batch is not None and (plan.scheduled or plan.loads):
            reqs = list(plan.scheduled)
            new = [plan.scheduled[r] for r in reqs]
            tier = self.settings.offload
            self.on_batch(step, [r.index for r in reqs], new, [r.num_computed_tokens - n for r, n in zip(reqs, new)],
                          [r in plan.decoding for r in reqs], load_s=tier.load_seconds(plan.loads),
                          overlap=tier.backend == "native")
        return plan

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.result.extra["offload"] = LiveTierRun(
            lambda: self.scheduler.tier_run(len(self.prompts), self.result.cached_tokens),
            lambda: (len(self.result.finished), int(self.result.steps)))


class LiveTierRun:
    """The tier's :class:`~kvsim.tiers.report.TierRun` as of now, built when first read after a change."""

    def __init__(self, build, key) -> None:
        self._build, self._key, self._run, self._at = build, key, None, None

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.snapshot(), name)

    def snapshot(self):
        """The run as of now (rebuilt only when a new request has finished)."""
        if self._run is None or self._key() != self._at:
            self._run, self._at = self._build(), self._key()
        return self._run
