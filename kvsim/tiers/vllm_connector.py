"""vLLM 0.33's ``OffloadingConnector``, scheduler side (``docs/engines/offload.md §1.5–§1.8``).

kvsim's vLLM request life calls this object where vLLM's ``Scheduler`` calls its connector
(``offloading/scheduler.py``, one full-attention KV group):

1. ``on_new_request(req)`` when the request is added;
2. ``get_num_new_matched_tokens(req, local)`` for a waiting request right after its GPU
   prefix hit (``local`` tokens, block-aligned): ``(external, load_async)``, or
   ``(None, False)`` to keep it waiting this step (a transfer of its own in flight, a hit
   chunk whose store is pending, or being loaded for another request) (offload.md §1.5);
3. ``update_state_after_alloc(req, external)`` once its blocks are allocated: a load job
   over the chunks from the first new GPU block to ``local + external`` (offload.md §1.6);
4. ``build_connector_meta(scheduled, finished, preempted)`` at the end of every
   ``schedule()``: store jobs for the full chunks of the prompt each scheduled request
   will have computed after this step, then ``on_request_finished`` for the requests that
   finished since the last step (offload.md §1.7, §1.8);
5. ``update_connector_output(completed_jobs)`` with the worker's completions (offload.md §1.8);
6. ``request_finished(req)`` when the request finishes (its GPU blocks are freed at once).

An external hit is loaded asynchronously: the request waits (``WAITING_FOR_REMOTE_KVS``)
until the load completes, then its blocks join the GPU prefix cache; a full-prompt hit
recomputes its last token (vLLM's scheduler does that, not the connector). Stores
become visible only when the worker reports them; :class:`InstantWorker` reports as the
fastest real worker would: loads in the step they are issued, stores one step later.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvsim.errors import ConfigError
from kvsim.tiers.vllm_offload import CPUOffloadManager, LookupResult
from kvsim.tiers.vllm_policies import Key, RequestContext


class OffloadRequest(Protocol):
    """What the connector reads of a request (vLLM ``v1/request.py``); kept live by the engine."""

    request_id: str
    block_hashes: Sequence[Key]      # chained keys of the request's full GPU blocks so far
    num_prompt_tokens: int
    num_computed_tokens: int
    skip_reading_prefix_cache: bool

    @property
    def num_tokens(self) -> int: ...

    @property
    def is_finished(self) -> bool: ...


@dataclass(frozen=True)
class OffloadSettings:
    """``kv_connector_extra_config`` of the OffloadingConnector (offload.md §1.1)."""

    num_chunks: int                  # CPU capacity in offload blocks (from bytes: num_cpu_chunks)
    gpu_block_size: int = 16
    block_size: int | None = None    # offload block in tokens; default the GPU block
    eviction_policy: str = "lru"
    store_threshold: int = 0
    offload_prompt_only: bool = True

    def __post_init__(self) -> None:
        b = self.offload_block_size
        if b % self.gpu_block_size:
            raise ConfigError(f"offload block_size={b} must be a multiple of the GPU block size "
                              f"({self.gpu_block_size} tokens)")

    @property
    def offload_block_size(self) -> int:
        return self.block_size or self.gpu_block_size

    @property
    def blocks_per_chunk(self) -> int:
        return self.offload_block_size // self.gpu_block_size


@dataclass
class ConnectorMeta:
    """``OffloadingConnectorMetadata``: this step's jobs, ``job id -> keys``."""

    load_jobs: dict[int, list[Key]]
    store_jobs: dict[int, list[Key]]
    jobs_to_flush: set[int]
    load_requests: dict[int, str] = field(default_factory=dict)   # load job -> request id


@dataclass(eq=False)
class _RequestState:
    """``RequestOffloadState`` for one group."""

    req: OffloadRequest
    ctx: RequestContext
    keys: list[Key] = field(default_factory=list)     # one per full offload block
    next_stored: int = 0                               # next chunk to offer for a store
    local: int = 0                                     # GPU hit tokens at the lookup
    jobs: set[int] = field(default_factory=set)        # in flight: one load, or stores
    finished_signaled: bool = False


@dataclass
class _Job:
    req_id: str
    keys: list[Key]
    is_store: bool


class OffloadConnector:
    """The scheduler-side rules over a :class:`CPUOffloadManager`."""

    def __init__(self, settings: OffloadSettings) -> None:
        self.settings = settings
        self.manager = CPUOffloadManager(settings.num_chunks, settings.eviction_policy,
                                         settings.store_threshold)
        self.chunk_tokens = settings.offload_block_size
        self._status: dict[str, _RequestState] = {}
        self._jobs: dict[int, _Job] = {}
        self._next_job = 0
        self._batch_loads: dict[int, list[Key]] = {}
        self._being_loaded: set[Key] = set()

    # -- keys (offload.md §1.3) ---------------------------------------------------------
    def _update_keys(self, st: _RequestState) -> None:
        """A chunk's key is its last GPU block's chained key; its position, its end token."""
        per = self.settings.blocks_per_chunk
        hashes = st.req.block_hashes
        for idx in range(per * (len(st.keys) + 1) - 1, len(hashes), per):
            st.keys.append(hashes[idx])
            st.ctx.positions[hashes[idx]] = len(st.keys) * self.chunk_tokens

    def _job(self, req_id: str, keys: list[Key], is_store: bool) -> int:
        job = self._next_job
        self._next_job += 1
        self._jobs[job] = _Job(req_id, keys, is_store)
        self._status[req_id].jobs.add(job)
        return job

    # -- 1. requests --------------------------------------------------------------------
    def on_new_request(self, req: OffloadRequest) -> None:
        self._status[req.request_id] = _RequestState(req, RequestContext(req.request_id))

    # -- 2. lookup (offload.md §1.5) ----------------------------------------------------
    def get_num_new_matched_tokens(self, req: OffloadRequest, local: int) -> tuple[int | None, bool]:
        """Tokens loadable beyond the GPU hit ``local``; None: ask again next step."""
        st = self._status[req.request_id]
        st.next_stored = 0                  # a (re)start offers every chunk again
        if st.jobs:
            return None, False
        self._update_keys(st)
        st.local = local
        hit = 0 if req.skip_reading_prefix_cache else self._lookup(st)
        return hit, bool(hit)

    def _lookup(self, st: _RequestState) -> int | None:
        c, local = self.chunk_tokens, st.local
        max_hit = min(st.req.num_tokens, len(st.keys) * c)
        if max_hit - local < c:             # less than one offload block to gain
            return 0
        start = local // c                  # the chunk holding the first token not on GPU
        hits, pending = 0, False
        for key in st.keys[start:-(-max_hit // c)]:
            found = self.manager.lookup(key)
            if found is LookupResult.MISS:
                break
            hits += 1
            pending |= found is LookupResult.HIT_PENDING
        if hits == 0:
            return 0
        if pending:
            return None
        gained = min(max_hit, c * (start + hits)) - local
        if gained < c:                      # ends inside the chunk the GPU hit already reached
            return 0
        end = -(-(local + gained) // c)
        if any(k in self._being_loaded for k in st.keys[start:end]):
            return None                     # another request is loading these chunks
        return gained

    # -- 3. load (offload.md §1.6) ------------------------------------------------------
    def update_state_after_alloc(self, req: OffloadRequest, external: int) -> None:
        if external == 0:
            return
        st = self._status[req.request_id]
        cached = st.local + external
        first_new_block = st.local // self.settings.gpu_block_size
        start = first_new_block // self.settings.blocks_per_chunk
        end = -(-cached // self.chunk_tokens)
        keys = st.keys[start:end]
        st.next_stored = end                # loaded chunks are not offered again
        self.manager.prepare_load(keys, st.ctx)
        assert not st.jobs
        job = self._job(req.request_id, keys, is_store=False)
        self._batch_loads[job] = keys
        self._being_loaded.update(keys)

    # -- 4. stores at the end of a step (offload.md §1.7) --------------------------------
    def _offloadable(self, st: _RequestState, tokens: int) -> int:
        n = min(tokens, st.req.num_tokens)
        return min(n, st.req.num_prompt_tokens) if self.settings.offload_prompt_only else n

    def build_connector_meta(self, scheduled: Mapping[str, int], finished: Iterable[str] = (),
                             preempted: Iterable[str] = ()) -> ConnectorMeta:
        """``scheduled``: request id -> tokens scheduled this step, in schedule order;
        ``finished``: the requests that finished since the last step."""
        finished = list(finished)
        flush: set[int] = set()
        for rid in preempted:
            if (st := self._status.get(rid)) is not None:
                flush |= st.jobs - self._batch_loads.keys()
        for rid in scheduled:
            if (st := self._status.get(rid)) is not None:
                self._update_keys(st)
        stores: dict[int, list[Key]] = {}
        for rid in [*scheduled, *finished]:
            st = self._status.get(rid)
            if st is None:
                continue
            req = st.req
            if rid in scheduled and not req.is_finished:
                after = req.num_computed_tokens + scheduled[rid]
            else:                           # the final sampled token's slot is never stored
                after = max(req.num_prompt_tokens, req.num_tokens - 1)
            full = min(self._offloadable(st, after) // self.chunk_tokens, len(st.keys))
            if full <= st.next_stored:
                continue
            plan = self.manager.prepare_store(st.keys[st.next_stored:full], st.ctx)
            if plan is None:                # no room: offered again next step
                continue
            st.next_stored = full
            if plan.keys_to_store:
                stores[self._job(rid, plan.keys_to_store, is_store=True)] = plan.keys_to_store
        meta = ConnectorMeta(self._batch_loads, stores, flush,
                             {j: self._jobs[j].req_id for j in self._batch_loads})
        for rid in finished:
            if (st := self._status.get(rid)) is None:
                continue
            st.finished_signaled = True
            self.manager.on_request_finished(st.ctx)
            if not st.jobs:
                del self._status[rid]
        self._batch_loads = {}
        return meta

    # -- 5. completions (offload.md §1.8) ------------------------------------------------
    def update_connector_output(self, completed_jobs: Iterable[int]) -> None:
        for job_id in completed_jobs:
            job = self._jobs.pop(job_id)
            st = self._status[job.req_id]
            if job.is_store:
                self.manager.complete_store(job.keys)
            else:
                self.manager.complete_load(job.keys)
                self._being_loaded.difference_update(job.keys)
            st.jobs.remove(job_id)
            if st.finished_signaled and not st.jobs:
                del self._status[job.req_id]

    # -- 6. finish ------------------------------------------------------------------------
    def request_finished(self, req: OffloadRequest) -> None:
        if (st := self._status.get(req.request_id)) is not None:
            self._update_keys(st)

    def has_pending_work(self) -> bool:
        """Jobs in flight keep vLLM's engine stepping (``has_pending_push_work``)."""
        return bool(self._jobs)


class InstantWorker:
    """The offloading worker with transfers that take no time (``offloading/worker.py``).

    Per step: the stores deferred from the previous step and this step's loads are
    submitted and reported done; this step's stores wait for the next step, unless
    flushed (offload.md §1.8).
    """

    def __init__(self) -> None:
        self._deferred: list[int] = []

    def step(self, meta: ConnectorMeta) -> tuple[list[int], set[str]]:
        """(completed job ids, requests whose load finished) at the end of this step."""
        done = list(self._deferred)
        stores = dict(meta.store_jobs)
        done += [j for j in meta.jobs_to_flush if stores.pop(j, None) is not None]
        done += list(meta.load_jobs)
        self._deferred = list(stores)
        return done, set(meta.load_requests.values())
