"""vLLM 0.33.0's v1 scheduler and engine-core loop, on the step clock (readable model).

Re-states ``vllm/v1/core/sched/scheduler.py`` (``schedule``, ``_preempt_request``,
``_update_after_schedule``, ``update_from_output``), ``async_scheduler.py`` and the
engine core's ``step`` / ``step_with_batch_queue`` (``vllm/v1/engine/core.py``) for a
text-only model without speculative decoding, KV connectors or LoRA limits. Section
numbers (§) refer to ``docs/engines/vllm-scheduler.md``.

One step: running requests first, in order, each asking for the tokens it still lacks
(capped by the long-prefill threshold and the token budget); a request whose blocks do
not fit preempts the lowest-priority running request (§3.2). Then, only if nobody was
preempted, waiting requests in queue order: prefix lookup, admission against the
full-sequence gate and the watermark, chunked to the remaining budget (§3.3). Blocks are
cached as they are allocated, so a request admitted later in the same step hits them
(§3.5). The fake model samples the request's logged output tokens.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass

import numpy as np

from kvsim.engines.vllm import rules
from kvsim.engines.vllm.manager import KVCacheManager
from kvsim.models import GiB, apc_num_gpu_blocks, gpu_memory_bytes
from kvsim.errors import ConfigError
from kvsim.engines.base import StepResult

WAITING, RUNNING, PREEMPTED, FINISHED = range(4)
IMPLEMENTATIONS = ("fast", "reference")
UNLIMITED_BLOCKS = 1 << 22      # an "unlimited" cache for the step replay: 64M tokens at B = 16
BATCH_QUEUE_SIZE = 2          # VllmConfig.max_concurrent_batches with async scheduling (§4.2)
POLICIES = ("fcfs", "priority")


def waiting_chunk(n: int, threshold: int, budget: int, chunked: bool) -> int:
    """A waiting request's tokens this step (§3.3): ``n`` capped at the long-prefill threshold,
    then at the token budget; -1 (stop admitting) when it does not fit and chunking is off."""
    if 0 < threshold < n:
        n = threshold
    if not chunked and n > budget:
        return -1
    return min(n, budget)


@dataclass(frozen=True)
class VllmSchedSettings:
    """The engine options the scheduler reads (vLLM's names; defaults §5)."""

    num_gpu_blocks: int
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"
    async_scheduling: bool = True
    watermark: float = 0.0
    reserve_full_isl: bool = True          # scheduler_reserve_full_isl
    enable_chunked_prefill: bool = True
    max_model_len: int | None = None       # None: no cap below the requests' own lengths
    hash_algo: str = "fast"
    enable_prefix_caching: bool = True     # --no-enable-prefix-caching: every lookup misses
    implementation: str = "fast"           # the cache model: "fast" (compiled) or "reference"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown --scheduling-policy {self.policy!r}; choose fcfs or priority")
        for name in ("num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer")
        if self.implementation not in IMPLEMENTATIONS:
            raise ConfigError(f"unknown implementation {self.implementation!r}; choose fast or reference")
        if self.long_prefill_token_threshold < 0:
            raise ConfigError("--long-prefill-token-threshold must be 0 (off) or positive")
        if not 0.0 <= self.watermark < 1.0:
            raise ConfigError("watermark must be in [0, 1)")
        # vLLM's own SchedulerConfig checks
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError(f"--max-num-batched-tokens ({self.max_num_batched_tokens}) must be at least "
                              f"--max-num-seqs ({self.max_num_seqs})")
        if not self.enable_chunked_prefill and self.max_model_len is None:
            raise ConfigError("without chunked prefill vLLM needs --max-model-len <= --max-num-batched-tokens")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ConfigError(f"without chunked prefill --max-num-batched-tokens ({self.max_num_batched_tokens}) "
                              f"must be at least the max model length ({self.max_model_len})")

    def manager(self, max_model_len: int):
        """The KV-cache manager the scheduler drives (a subclass of these settings may bring its own)."""
        return kv_cache_manager(self.implementation, self.num_gpu_blocks, self.block_size, self.watermark,
                                self.hash_algo, max_model_len, self.enable_prefix_caching)

    def scheduler(self) -> "VllmScheduler":
        """The scheduler over these settings (a subclass may bring its own: a KV connector's)."""
        return VllmScheduler(self)

    def engine(self, prompts, outputs, priorities=None, loras=None, salts=None, prompt_logprobs=None,
               **_other) -> "VllmEngine":
        """The engine core over these requests (``loras`` / ``salts``: namespaces; a
        ``prompt_logprobs`` request skips reading the cache)."""
        return VllmEngine(self, prompts, outputs, priorities, loras, salts, prompt_logprobs)

    def describe(self) -> str:
        """The settings in one line, for the terminal."""
        return (f"num_gpu_blocks {self.num_gpu_blocks:,}, block {self.block_size}, max_num_seqs {self.max_num_seqs}, "
                f"max_num_batched_tokens {self.max_num_batched_tokens}, long_prefill_token_threshold "
                f"{self.long_prefill_token_threshold}, {self.policy}, "
                f"{'async' if self.async_scheduling else 'sync'} scheduling")


def kv_cache_manager(implementation: str, num_gpu_blocks: int, block_size: int, watermark: float = 0.0,
                     hash_algo: str = "fast", max_model_len: int = 1 << 62, enable_caching: bool = True):
    """The scheduler's KV-cache manager: ``fast`` (compiled, the default) or ``reference``
    (readable objects); the two give the same results (``tests/test_sched_vllm_fast.py``)."""
    if implementation == "fast":
        from kvsim.engines.vllm.manager_jit import JitKVCacheManager   # loads numba: only when used

        return JitKVCacheManager(num_gpu_blocks, block_size, enable_caching, max_model_len, watermark, hash_algo)
    return KVCacheManager(num_gpu_blocks, block_size, enable_caching, log_stats=False, max_model_len=max_model_len,
                          watermark=watermark, hash_algo=hash_algo)


def vllm_budget_defaults(gpu: str | None) -> tuple[int, int, str]:
    """(max_num_batched_tokens, max_num_seqs, where they come from) for ``--gpu``: vLLM 0.33.0's
    OpenAI-server defaults (``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args``)."""
    if gpu:
        memory = gpu_memory_bytes(gpu)
        if memory >= 160 * GiB:
            return 16384, 1024, f"vLLM's defaults for {gpu} (>= 160 GiB)"
        if memory >= 70 * GiB and "a100" not in gpu.lower():
            return 8192, 1024, f"vLLM's defaults for {gpu} (>= 70 GiB)"
        return 2048, 256, f"vLLM's defaults for {gpu}"
    return 2048, 256, "vLLM's generic defaults (no --gpu)"


def vllm_settings(options, unlimited_blocks: int | None = None, **overrides) -> tuple[VllmSchedSettings, str]:
    """vLLM scheduler settings for ``options`` (a SimOptions); explicit overrides win over the
    defaults. Without a capacity the pool is "unlimited": ``unlimited_blocks`` (enough for every
    request of the workload at once, so nothing is ever evicted) or at most ``UNLIMITED_BLOCKS``."""
    tokens, seqs, note = vllm_budget_defaults(options.gpu)
    blocks = apc_num_gpu_blocks(options) or min(unlimited_blocks or UNLIMITED_BLOCKS, UNLIMITED_BLOCKS)
    knobs = {"max_num_batched_tokens": tokens, "max_num_seqs": seqs,
             **{k: v for k, v in overrides.items() if v is not None}}
    if "max_num_batched_tokens" in overrides or "max_num_seqs" in overrides:
        note = "as given"
    return VllmSchedSettings(num_gpu_blocks=blocks, block_size=int(options.block_size),
                             hash_algo=options.hash_algo, **knobs), note


def scheduler_settings(options, overrides: dict, trace=None) -> tuple[VllmSchedSettings, str]:
    """The scheduler settings a replay of ``trace`` uses: an unlimited pool holds every request at once.
    With an offload tier (``--offload``), the connector's settings (kvsim.engines.vllm.connector)."""
    blocks = None
    if trace is not None and len(trace):
        need = trace.prompt_lengths + np.maximum(trace.output_lengths, 1)
        blocks = int((-(-need // int(options.block_size))).sum()) + 2
    settings, note = vllm_settings(options, unlimited_blocks=blocks, **overrides)
    from kvsim.engines.offload import vllm_tier

    tier = vllm_tier(options, settings.block_size, apc_num_gpu_blocks(options))
    if tier is not None:
        from dataclasses import asdict, replace

        from kvsim.engines.vllm.connector import OffloadSchedSettings

        fields = {k: v for k, v in asdict(settings).items()}
        settings = OffloadSchedSettings(**fields, offload=replace(tier, token_budget=settings.max_num_batched_tokens))
    return settings, note


class VllmRequest:
    """A request as the scheduler tracks it (``vllm/v1/request.py``)."""

    __slots__ = ("index", "seq", "outputs", "output_ids", "num_prompt_tokens", "max_tokens", "priority", "status",
                 "num_computed_tokens", "num_output_tokens", "num_tokens", "num_output_placeholders",
                 "num_in_flight_tokens", "num_stale_output_tokens", "num_preemptions",
                 "is_prefill_chunk", "stats_open", "prefill_cached")

    def __init__(self, index: int, seq, outputs: np.ndarray, priority: int) -> None:
        self.index = index
        self.seq = seq                                  # the cache adapter's handle
        self.outputs = outputs                          # the tokens the model will sample
        self.output_ids = outputs.tolist()              # the same, as Python ints
        self.num_prompt_tokens = seq.num_prompt_tokens
        self.max_tokens = len(outputs)                  # SamplingParams.max_tokens = logged length
        self.priority = priority
        self.status = WAITING
        self.num_computed_tokens = 0
        self.num_output_tokens = 0
        self.num_tokens = self.num_prompt_tokens        # prompt + outputs so far
        self.num_output_placeholders = 0                # async: sampled, not yet returned
        self.num_in_flight_tokens = 0                   # scheduled, output not yet processed
        self.num_stale_output_tokens = 0                # in flight when preempted (§3.4)
        self.num_preemptions = 0
        self.is_prefill_chunk = False
        self.stats_open = True                          # prefill stats not yet reported
        self.prefill_cached = 0                         # PrefillStats: hit of the first admission

    def sort_key(self) -> tuple[int, int]:
        """Priority order: lower priority value first, then earlier arrival (§3.1)."""
        return (self.priority, self.index)


class WaitingQueue:
    """``FCFSRequestQueue`` (a deque) or ``PriorityRequestQueue`` (a heap)."""

    def __init__(self, priority: bool) -> None:
        self.priority = priority
        self.items: deque[VllmRequest] | list = [] if priority else deque()

    def __len__(self) -> int:
        return len(self.items)

    def add(self, req: VllmRequest) -> None:
        if self.priority:
            heapq.heappush(self.items, (req.sort_key(), req))
        else:
            self.items.append(req)

    def prepend(self, req: VllmRequest) -> None:
        """Back to the front (FCFS); a heap just re-inserts by key."""
        if self.priority:
            self.add(req)
        else:
            self.items.appendleft(req)

    def peek(self) -> VllmRequest:
        return self.items[0][1] if self.priority else self.items[0]

    def pop(self) -> VllmRequest:
        return heapq.heappop(self.items)[1] if self.priority else self.items.popleft()

    def remove_all(self, reqs: set[VllmRequest]) -> None:
        if self.priority:
            self.items = [x for x in self.items if x[1] not in reqs]
            heapq.heapify(self.items)
        else:
            self.items = deque(r for r in self.items if r not in reqs)


@dataclass
class StepPlan:
    """One ``SchedulerOutput``: tokens per scheduled request (in scheduling order) and samples."""

    step: int
    scheduled: dict
    sampled: dict
    decoding: set            # running requests past their prefill: one token each


class VllmScheduler:
    """``Scheduler`` / ``AsyncScheduler`` over kvsim's APC model."""

    def __init__(self, settings: VllmSchedSettings) -> None:
        s = self.settings = settings
        self.max_model_len = s.max_model_len or (1 << 62)
        self.cache = s.manager(self.max_model_len)
        self.waiting = WaitingQueue(s.policy == "priority")
        self.running: list[VllmRequest] = []
        self.finished_since_schedule = False      # finished_req_ids not yet sent to the workers

    def has_requests(self) -> bool:
        """Unfinished requests, or finished ones whose ids the next step still reports (§4.1)."""
        return bool(self.running) or bool(self.waiting) or self.finished_since_schedule

    def add_request(self, req: VllmRequest) -> None:
        self.waiting.add(req)

    # -- schedule() --------------------------------------------------------------------
    def schedule(self, step: int) -> StepPlan:
        s, cache = self.settings, self.cache
        priority = s.policy == "priority"
        budget = s.max_num_batched_tokens
        scheduled: dict[VllmRequest, int] = {}
        decoding: set[VllmRequest] = set()
        preempted = False
        # the long-prefill cap applies only when another request could use the budget (§3.2)
        threshold = s.long_prefill_token_threshold if len(self.running) + len(self.waiting) > 1 else 0

        # (a) running requests, in order (§3.2)
        running, i = self.running, 0
        allocate, max_model_len = cache.allocate, self.max_model_len
        while i < len(running) and budget > 0:
            req = running[i]
            computed, placeholders = req.num_computed_tokens, req.num_output_placeholders
            # async: the in-flight step already reaches max_tokens, no extra step (§4.2)
            if placeholders > 0 and computed + 2 - placeholders >= req.num_prompt_tokens + req.max_tokens:
                i += 1
                continue
            n = req.num_tokens + placeholders - computed
            if 0 < threshold < n:
                n = threshold
            if n > budget:
                n = budget
            if n > max_model_len - computed - 1:
                n = max_model_len - computed - 1
            if n <= 0:
                i += 1
                continue
            ok = True
            while not allocate(req.seq, computed, n):
                # preempt the lowest-priority running request: the last one (FCFS) or
                # the largest (priority, arrival) (§3.4)
                victim = max(running, key=VllmRequest.sort_key) if priority else running[-1]
                if not self._can_free(victim):
                    ok = None       # a deferred free would not help now (a KV connector's, kvsim.engines.vllm.connector)
                    break
                if priority:
                    at = running.index(victim)
                    del running[at]
                    if at < i:
                        i -= 1
                    if victim in scheduled:
                        budget += scheduled.pop(victim)
                else:
                    victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is req:
                    ok = False
                    break
            if not ok:
                if priority and ok is not None:
                    continue        # it preempted itself; later (higher-priority) requests may fit
                break
            scheduled[req] = n
            if not req.is_prefill_chunk:
                decoding.add(req)
            budget -= n
            i += 1

        # (b) waiting requests, only in a step that preempted nobody (§3.3)
        if not preempted:
            budget = self._schedule_waiting(scheduled, budget, threshold)
        return self._update_after_schedule(step, scheduled, decoding)

    def _schedule_waiting(self, scheduled: dict, budget: int, threshold: int) -> int:
        """Admit waiting requests in queue order into ``scheduled``; returns the budget left (§3.3)."""
        s, cache, running = self.settings, self.cache, self.running
        skipped: list[VllmRequest] = []
        waiting = self.waiting
        while budget > 0 and waiting and len(running) < s.max_num_seqs:
            req = waiting.peek()
            if req.num_stale_output_tokens:
                # async: its pre-preemption output is still in flight; it keeps its
                # place but lets the requests behind it go first (§4.3)
                skipped.append(waiting.pop())
                continue
            hits, num_hits = cache.lookup(req.seq)
            if req.num_preemptions <= 0:
                req.prefill_cached = num_hits   # the first prefill's stats (§3.6)
            n = waiting_chunk(req.num_tokens - num_hits, threshold, budget, s.enable_chunked_prefill)
            if n < 0:
                break
            if not cache.allocate(req.seq, 0, n, num_hits, hits, full_sequence_must_fit=s.reserve_full_isl,
                                  apply_watermark=bool(running)):
                break           # head-of-line blocking: nobody behind it is tried (§3.3)
            waiting.pop()
            self._start(req, n, num_hits, scheduled)
            budget -= n
        for req in reversed(skipped):
            waiting.prepend(req)
        return budget


    def _start(self, req: VllmRequest, n: int, computed: int, scheduled: dict) -> None:
        """A waiting request runs this step: ``n`` new tokens after ``computed`` (§3.3)."""
        self.running.append(req)
        scheduled[req] = n
        req.status = RUNNING
        req.num_computed_tokens = computed
    def _update_after_schedule(self, step: int, scheduled: dict, decoding: set) -> StepPlan:
        """``_update_after_schedule`` (+ AsyncScheduler's placeholders): the step's plan."""
        s = self.settings
        sampled: dict[VllmRequest, int] = {}
        placeholder = int(s.async_scheduling)
        for req, n in scheduled.items():
            req.num_computed_tokens = computed = req.num_computed_tokens + n
            req.num_in_flight_tokens += n
            req.is_prefill_chunk = chunk = computed < req.num_tokens + req.num_output_placeholders
            if not chunk:
                # the model samples the token at position num_computed_tokens
                sampled[req] = req.output_ids[computed - req.num_prompt_tokens]
                req.num_output_placeholders += placeholder
        self.finished_since_schedule = False
        return StepPlan(step, scheduled, sampled, decoding)

    def _can_free(self, req: VllmRequest) -> bool:
        """Whether preempting ``req`` frees its blocks now (always, without a KV connector)."""
        return True

    def _preempt(self, req: VllmRequest) -> None:
        """``_preempt_request``: free its blocks, recompute from scratch later (§3.4)."""
        self.cache.free(req.seq)
        req.status = PREEMPTED
        req.num_computed_tokens = 0
        req.num_stale_output_tokens = req.num_in_flight_tokens
        req.num_output_placeholders = 0
        req.num_preemptions += 1
        self.waiting.prepend(req)

    # -- update_from_output() -------------------------------------------------------
    def update_from_output(self, plan: StepPlan, result: StepResult) -> None:
        cache = self.cache
        append, cache_blocks, max_model_len, sampled = cache.append, cache.cache_blocks, self.max_model_len, plan.sampled
        stopped_running: set[VllmRequest] = set()
        stopped_waiting: set[VllmRequest] = set()
        for req, n in plan.scheduled.items():
            req.num_in_flight_tokens -= n
            stale = req.num_stale_output_tokens > 0
            if stale:
                req.num_stale_output_tokens -= n
            status_before = req.status
            if status_before == FINISHED:
                continue
            token = sampled.get(req)
            if token is None:
                continue                        # mid-prefill: no output, no event
            had_placeholders = req.num_output_placeholders > 0
            append(req.seq, token)
            req.num_output_tokens = outputs = req.num_output_tokens + 1
            req.num_tokens += 1
            stopped = outputs >= req.max_tokens or req.num_tokens >= max_model_len
            if had_placeholders and not stale:
                req.num_output_placeholders -= 1
                if status_before == RUNNING:
                    # async: blocks whose tokens are now all known get cached (§4.2)
                    cache_blocks(req.seq, req.num_computed_tokens - req.num_in_flight_tokens)
            i = req.index
            if req.stats_open:          # the request's first output
                req.stats_open = False
                result.cached_tokens[i] = req.prefill_cached
                result.first_token_step[i] = plan.step
            if stopped:
                req.status = FINISHED
                self.finished_since_schedule = True
                cache.free(req.seq)
                cache.release(req.seq)
                result.finish_step[i] = plan.step
                result.output_tokens[i] = req.num_output_tokens
                result.finished.append(i)
                result.preemptions[i] = req.num_preemptions
                (stopped_running if status_before == RUNNING else stopped_waiting).add(req)
        if stopped_running:
            self.running = [r for r in self.running if r not in stopped_running]
        if stopped_waiting:
            self.waiting.remove_all(stopped_waiting)


class VllmEngine:
    """The engine core around the scheduler: ``step`` (sync) or ``step_with_batch_queue`` (async).

    With async scheduling the output of step N is processed after step N+1 is scheduled:
    the batch queue holds two steps (§4.2).
    """

    def __init__(self, settings: VllmSchedSettings, prompts, outputs, priorities=None, loras=None,
                 salts=None, prompt_logprobs=None) -> None:
        self.settings = settings
        self.loras, self.salts = loras, salts       # namespaces: LoRA adapter name, cache_salt
        self.prompt_logprobs = prompt_logprobs      # bool per request: skips reading the cache
        self.scheduler = settings.scheduler()
        self.prompts, self.outputs = prompts, outputs
        self.priorities = priorities
        self.result = StepResult.empty("vllm", len(prompts))
        self.queue: deque[StepPlan] = deque()
        self.on_batch = None        # on_batch(step, requests, new tokens, context, decode?): timed replay
        self.on_decode_run = None   # on_decode_run(steps, requests, context) -> steps kept: timed fast_forward

    def fits_ever(self, index: int) -> bool:
        """kvsim's rejection rule: the request's peak blocks fit an empty cache (§1)."""
        L, M, B = len(self.prompts[index]), max(len(self.outputs[index]), 1), self.settings.block_size
        return bool(rules.fits_ever(L, M, B, self.settings.num_gpu_blocks))

    def add(self, index: int) -> None:
        if not self.fits_ever(index):
            self.result.rejected[index] = True
            return
        seq = self.scheduler.cache.new_sequence(
            str(index), self.prompts[index], None if self.loras is None else self.loras[index],
            None if self.salts is None else self.salts[index], outputs=self.outputs[index],
            skip_reading_prefix_cache=self.prompt_logprobs is not None and bool(self.prompt_logprobs[index]))
        priority = 0 if self.priorities is None else int(self.priorities[index])
        self.scheduler.add_request(VllmRequest(index, seq, np.asarray(self.outputs[index]), priority))

    def has_work(self) -> bool:
        return self.scheduler.has_requests() or bool(self.queue)

    def replay_compiled(self, at, constants=None, progress=None):
        """The whole replay in one compiled loop (:mod:`kvsim.engines.vllm.scheduler_jit`): releases
        ``at`` in steps, or in seconds with the roofline's ``constants``; None where that loop does
        not model this engine (the clock then runs this one)."""
        if type(self) is not VllmEngine or self.settings.implementation != "fast":
            return None     # (a KV connector's engine, the reference manager: no numba to load)
        from kvsim.engines.vllm import scheduler_jit

        return scheduler_jit.replay(self, at, constants, progress)

    @staticmethod
    def fleet_compiled(engines, at, constants=None):
        """A fleet's replicas on the compiled loop (:class:`kvsim.engines.vllm.scheduler_jit.FleetReplica`),
        releases ``at`` in steps or in seconds with the roofline's ``constants``; None where that
        loop does not model them (the fleet clock then runs these engines)."""
        if any(type(e) is not VllmEngine or e.settings.implementation != "fast" for e in engines):
            return None
        from kvsim.engines.vllm import scheduler_jit

        return scheduler_jit.fleet(engines, at, constants)

    def prepare_fleet(self) -> None:
        """What a fleet of replicas like this one shares, computed now: the log's block keys
        (:func:`~kvsim.engines.vllm.scheduler_jit.fleet_log_keys`; before the replay without
        prefix caching forks, so that it inherits them)."""
        if self.settings.implementation == "fast" and hasattr(self.prompts, "keyed"):
            from kvsim.engines.vllm import scheduler_jit

            scheduler_jit.fleet_log_keys(self)

    @property
    def keyed_log(self):
        """The log's block keys, computed once for a fleet of these replicas
        (``manager_jit.LogKeys``; a fleet's bounds reuse them), or None."""
        return getattr(self.scheduler.cache, "log", None)

    def load(self) -> tuple[int, int, float]:
        """What a router polls: waiting and running requests, and ``kv_cache_usage_perc``
        (1 - free / usable blocks, docs/engines/apc.md §5.2)."""
        sched = self.scheduler
        usable = self.settings.num_gpu_blocks - 1
        usage = 1.0 - sched.cache.num_free_blocks / usable if usable > 0 else 0.0
        return len(sched.waiting), len(sched.running), usage

    def idle(self) -> None:
        """vLLM's busy loop just waits for input."""

    def fast_forward(self, step: int, horizon: int) -> int:
        """Run up to ``horizon`` steps that only decode at once; returns how many (0: none).

        Steps in which every running request decodes one token, nobody can be admitted
        (nobody waits, or the running or token limit is reached), nobody finishes and the
        free blocks cover every new block are applied together, with the same pool
        operations in the same order as step by step (§4.4). On the timed clock
        (``on_decode_run`` set) the clock says how many of them start before the next release.
        """
        s, sched = self.settings, self.scheduler
        running = sched.running
        if horizon < 2 or not running or (self.on_batch is not None and self.on_decode_run is None):
            return 0
        bs = len(running)
        if bs > s.max_num_batched_tokens:
            return 0
        lag = int(s.async_scheduling)
        if lag:
            if len(self.queue) != 1:
                return 0
            plan = self.queue[0]
            if len(plan.scheduled) != bs or any(
                    r not in plan.decoding or r.num_output_placeholders != 1 or r.num_in_flight_tokens != 1
                    or r.num_stale_output_tokens for r in running):
                return 0
        elif self.queue or any(r.is_prefill_chunk or r.num_in_flight_tokens or r.num_stale_output_tokens
                               or r.num_computed_tokens != r.num_tokens - 1 for r in running):
            return 0
        computed = [r.num_computed_tokens for r in running]
        # nobody may finish inside the run: k outputs are processed, the last step's
        # output (async) comes after it; nobody reaches the async "already at max_tokens" skip
        k = min(horizon, min(r.max_tokens - r.num_output_tokens for r in running) - 1,
                sched.max_model_len - max(computed) - 3)
        cache = sched.cache
        if sched.waiting and bs < s.max_num_seqs and bs < s.max_num_batched_tokens:
            k = min(k, self._head_stays_blocked(computed, lag))
        free = cache.num_free_blocks
        while k >= 2 and sum(cache.block_openings(c, k, s.block_size) for c in computed) > free:
            k -= 1
        if k >= 2 and self.on_decode_run is not None:
            # timed: the clock keeps the steps that start before the next release (§4.4)
            k = self.on_decode_run(k, [r.index for r in running], computed)
        if k < 2:
            return 0
        for r, c in zip(running, computed):
            # the tokens appended in these steps: positions c+1..c+k (sync), c..c+k-1 (async)
            first = c + 1 - lag - r.num_prompt_tokens
            cache.append_many(r.seq, r.outputs[first:first + k])
            r.num_output_tokens += k
            r.num_tokens += k
        cache.decode_steps([r.seq for r in running], computed, k, lag)
        for r, c in zip(running, computed):
            r.num_computed_tokens = c + k
        sched.finished_since_schedule = False
        if lag:   # the last step's output is still in flight
            self.queue[0] = StepPlan(step + k - 1, {r: 1 for r in running},
                                     {r: r.output_ids[r.num_computed_tokens - r.num_prompt_tokens] for r in running},
                                     set(running))
        return k

    def _head_stays_blocked(self, computed: list[int], lag: int) -> int:
        """How many steps the waiting head surely keeps failing admission (0: it may not).

        Its failed attempts change nothing. Free blocks only shrink while nobody finishes, and
        its hits only shrink, unless a running request fills the very block its cached chain
        needs next: the run stops before that (§4.4).
        """
        s, sched = self.settings, self.scheduler
        head, cache, B = sched.waiting.peek(), sched.cache, s.block_size
        if head.num_stale_output_tokens:
            return 0
        hits, num_hits = cache.lookup(head.seq)
        budget = s.max_num_batched_tokens - len(sched.running)
        n = head.num_tokens - num_hits
        if 0 < s.long_prefill_token_threshold < n:
            n = s.long_prefill_token_threshold
        if s.enable_chunked_prefill or n <= budget:
            if cache.fits(head.seq, min(n, budget), num_hits, hits, s.reserve_full_isl, True):
                return 0
        h = len(hits)
        if h >= rules.lookup_cap_blocks(head.num_tokens, B):
            return 1 << 62                   # no further block could ever hit
        k = 1 << 62
        parent = head.seq.block_hashes[h - 1] if h else None
        for r, c in zip(sched.running, computed):
            if cache.num_cached_blocks(r.seq) > h:
                continue
            hashes = r.seq.block_hashes
            if h == 0 or (len(hashes) >= h and hashes[h - 1] == parent):
                k = min(k, (h + 1) * B - (c + 1 - lag))   # stop before r caches block h
        return k

    def schedule(self, step: int) -> StepPlan:
        plan = self.scheduler.schedule(step)
        if self.on_batch is not None and plan.scheduled:
            reqs = list(plan.scheduled)
            new = [plan.scheduled[r] for r in reqs]
            self.on_batch(step, [r.index for r in reqs], new,
                          [r.num_computed_tokens - n for r, n in zip(reqs, new)],
                          [r in plan.decoding for r in reqs])
        return plan

    def step(self, step: int) -> bool:
        sched = self.scheduler
        if not self.settings.async_scheduling:
            if not sched.has_requests():
                return False
            sched.update_from_output(self.schedule(step), self.result)
            return True
        took_step = False
        if sched.has_requests():
            plan = self.schedule(step)
            took_step = True
            self.queue.appendleft(plan)
            if len(self.queue) < BATCH_QUEUE_SIZE and (plan.scheduled or sched.has_requests()):
                return True
        elif not self.queue:
            return False
        sched.update_from_output(self.queue.pop(), self.result)
        return took_step
