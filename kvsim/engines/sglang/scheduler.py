"""SGLang 0.5.23's scheduler event loop on the step clock (readable model).

Re-states ``sglang/srt/managers/scheduler.py`` (``event_loop_normal`` /
``event_loop_overlap``, ``get_next_batch_to_run``, ``_get_new_batch_prefill_raw``,
``update_running_batch``), ``ScheduleBatch`` (``prepare_for_extend``,
``prepare_for_decode``, ``check_decode_mem``, ``retract_decode``, ``filter_batch``) and
the batch-result processor, for a generation model without speculative decoding,
LoRA, hierarchical cache, mixed chunks or priorities. Section numbers (§) refer to
``docs/engines/sglang-scheduler.md``; ``radix.md §`` to the cache rules in ``docs/engines/radix.md``.

One loop iteration: the previous prefill batch joins the running batch; a new prefill
batch is built if any request is waiting and the running batch is not full (prefill
first, §2.2); otherwise the running batch decodes one token, retracting requests when
the pool runs out (§5). With the overlap scheduler (the default) a batch's result is
processed after the next batch has been built (§2.3).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from kvsim.engines.sglang.rules import CLIP_MAX_NEW_TOKENS, decode_starts_page, logprob_aborts, max_prefix_len
from kvsim.engines.sglang.settings import FINISHES, sglang_chunked_prefill_size
from kvsim.models import radix_max_total_tokens
from kvsim.errors import ConfigError
from kvsim.engines.base import StepResult
from kvsim.engines.sglang.adder import CONTINUE, NO_TOKEN, OTHER, PrefillAdder
from kvsim.engines.sglang.request import make_cache
from kvsim.engines.sglang.rules import namespace
from kvsim.engines.sglang.settings import RadixSettings
from kvsim.engines.sglang.policy import CACHE_AWARE, POLICIES, SchedulePolicy

RETRACT_DECODE_STEPS = 20          # SGLANG_RETRACT_DECODE_STEPS
INIT_NEW_TOKEN_RATIO = 0.7         # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
EXTEND, DECODE = "extend", "decode"


@dataclass(frozen=True)
class SglangSchedSettings:
    """The server options the scheduler reads (SGLang's names; defaults §7)."""

    capacity: int                          # max_total_num_tokens
    page_size: int = 1
    schedule_policy: str = "fcfs"
    chunked_prefill_size: int = 8192       # <= 0 disables chunking
    max_prefill_tokens: int = 16384
    max_running_requests: int | None = None   # None: derived from the pool as SGLang does
    schedule_conservativeness: float = 1.0
    overlap: bool = True                   # --disable-overlap-schedule turns it off
    finish: str = "length"                 # length: ignore_eos, max_new = logged output; stop: EOS
    max_new_tokens: int | None = None      # the client's cap with finish "stop"
    context_len: int = 1 << 15             # max_req_len: generation is clipped to it
    random_seed: int = 0
    eviction_policy: str = "lru"
    enable_prefix_caching: bool = True     # False: kvsim's no-cache counterfactual (§7)

    def __post_init__(self) -> None:
        if self.schedule_policy not in POLICIES:
            raise ConfigError(f"unknown --schedule-policy {self.schedule_policy!r}; "
                              f"choose from {', '.join(POLICIES)}")
        if self.finish not in FINISHES:
            raise ConfigError(f"unknown finish {self.finish!r}; choose length or stop")
        if self.capacity < 1 or self.page_size < 1 or self.capacity % self.page_size:
            raise ConfigError("the radix capacity must be a positive multiple of the page size")
        if self.max_running_requests is None:
            object.__setattr__(self, "max_running_requests",
                               default_max_running_requests(self.capacity, self.context_len))
        if self.max_running_requests < 1 or self.max_prefill_tokens < 1:
            raise ConfigError("--max-running-requests and --max-prefill-tokens must be positive")

    def engine(self, prompts, outputs, loras=None, salts=None, logprob_starts=None, **_other) -> "SglangEngine":
        """The scheduler process over these requests (``loras`` / ``salts``: namespaces;
        ``logprob_starts``: each request's ``logprob_start_len``, -1 none)."""
        return SglangEngine(self, prompts, outputs, loras, salts, logprob_starts)

    def describe(self) -> str:
        """The settings in one line, for the terminal."""
        return (f"max_total_tokens {self.capacity:,}, page {self.page_size}, {self.schedule_policy}, "
                f"chunked_prefill_size {self.chunked_prefill_size}, max_prefill_tokens {self.max_prefill_tokens}, "
                f"max_running_requests {self.max_running_requests}, overlap {'on' if self.overlap else 'off'}")


UNLIMITED_TOKENS = 1 << 26     # an "unlimited" pool for the step replay


def default_max_running_requests(capacity: int, context_len: int) -> int:
    """SGLang's request-slot count when unset (``_resolve_max_running_requests_per_worker``)."""
    estimated = max(min(int(capacity / context_len * 512), 4096), 2048)
    return max(min(estimated, capacity // 2), 1)


def sglang_settings(options, unlimited_tokens: int | None = None,
                    **overrides) -> tuple[SglangSchedSettings, str]:
    """SGLang scheduler settings for ``options``; explicit overrides win over the defaults.

    Without a capacity the pool is "unlimited": ``unlimited_tokens`` (enough for every request
    of the workload at once) or at most ``UNLIMITED_TOKENS`` tokens; the request slots are
    then those of the largest pool, so the pool's size changes nothing.
    """
    capacity = radix_max_total_tokens(options)
    if capacity is None:
        capacity = min(unlimited_tokens or UNLIMITED_TOKENS, UNLIMITED_TOKENS)
        if overrides.get("max_running_requests") is None:
            context = overrides.get("context_len") or SglangSchedSettings.context_len
            overrides["max_running_requests"] = default_max_running_requests(UNLIMITED_TOKENS, context)
    p = int(options.page_size)
    capacity -= capacity % p
    knobs = {"chunked_prefill_size": sglang_chunked_prefill_size(options.gpu),
             **{k: v for k, v in overrides.items() if v is not None}}
    note = (f"SGLang's defaults for {options.gpu}" if options.gpu else "SGLang's defaults (no --gpu)")
    return SglangSchedSettings(capacity=capacity, page_size=p, eviction_policy=options.eviction_policy,
                               **knobs), note


def scheduler_settings(options, overrides: dict, trace=None) -> tuple[SglangSchedSettings, str]:
    """The scheduler settings a replay of ``trace`` uses: the radix settings the sequential replay
    reads (finish, overlap, chunked prefill), an unlimited pool holding every request at once."""
    extra = options.extra
    knobs = {"finish": extra.get("finish", "length"), "overlap": extra.get("overlap", True)}
    if "chunked_prefill_size" in extra:
        knobs["chunked_prefill_size"] = int(extra["chunked_prefill_size"])
    knobs.update(overrides)
    p = int(options.page_size)
    tokens = None
    if trace is not None and len(trace):
        need = trace.prompt_lengths + np.maximum(trace.output_lengths, 1)
        tokens = int(-(-int((need + 2 * p + 2).sum()) // p) * p)
    settings, note = sglang_settings(options, unlimited_tokens=tokens, **knobs)
    if "max_running_requests" not in overrides:
        note += f"; max_running_requests {settings.max_running_requests} from the pool size"
    from kvsim.engines.offload import hicache_tier

    hicache = hicache_tier(options, radix_max_total_tokens(options), p)
    if hicache is not None:    # --offload hicache (kvsim.engines.sglang.hicache)
        from dataclasses import asdict

        from kvsim.engines.sglang.hicache import HiCacheSchedSettings

        settings = HiCacheSchedSettings(**asdict(settings), hicache=hicache)
    return settings, note


class SglangRequest:
    """A request as the scheduler tracks it (SGLang's ``Req``)."""

    __slots__ = ("index", "kv", "prompt_len", "num_outputs", "max_new", "ignore_eos", "out_count",
                 "finished", "cached_tokens", "already_computed", "retracted_stain", "is_retracted",
                 "retraction_count", "inflight_middle_chunks", "num_matched_prefix_tokens", "holds_row",
                 "logprob_start_len")

    def __init__(self, index: int, kv, max_new: int, ignore_eos: bool) -> None:
        self.index = index
        self.kv = kv                                # the cache adapter's RequestState
        self.prompt_len = len(kv.prompt)
        self.num_outputs = kv.k                      # the reply it would write, stop token last
        self.max_new = max_new                      # sampling_params.max_new_tokens after clipping
        self.ignore_eos = ignore_eos
        self.out_count = 0                          # len(output_ids)
        self.finished = False
        self.cached_tokens = 0
        self.already_computed = 0
        self.retracted_stain = False                # retracted once: no more cached_tokens
        self.is_retracted = False
        self.retraction_count = 0
        self.inflight_middle_chunks = 0
        self.num_matched_prefix_tokens = 0
        self.holds_row = False                      # owns a req_to_token row
        self.logprob_start_len = -1                 # a logprob request's start caps its match

    @property
    def seq_len(self) -> int:
        """``len(origin_input_ids + output_ids)``: what a (re-)prefill computes."""
        return self.prompt_len + self.out_count

    def max_prefix_len(self) -> int:
        """``_compute_max_prefix_len``: ``seq_len - 1``, a logprob request at most its start."""
        return max_prefix_len(self.seq_len, self.logprob_start_len)


class Batch:
    """The parts of a ``ScheduleBatch`` the scheduler reads."""

    __slots__ = ("reqs", "mode", "batch_is_full", "chunked_req")

    def __init__(self, reqs: list, mode: str | None = None, chunked_req=None) -> None:
        self.reqs = reqs
        self.mode = mode
        self.batch_is_full = False
        self.chunked_req = chunked_req

    def filter(self, exclude=()) -> None:
        """``filter_batch``: drop finished and excluded requests, keeping order."""
        keep = [r for r in self.reqs if not r.finished and r not in exclude]
        if len(keep) != len(self.reqs):
            self.reqs = keep


class SglangEngine:
    """The scheduler process: queues, batches, the tree cache and the fake model."""

    def __init__(self, settings: SglangSchedSettings, prompts, outputs, loras=None, salts=None,
                 logprob_starts=None) -> None:
        s = self.settings = settings
        self.loras, self.salts = loras, salts       # namespaces: LoRA adapter name, cache_salt
        self.logprob_starts = logprob_starts        # logprob_start_len per request (-1: none)
        self.prompts, self.outputs = prompts, outputs
        self.cache = make_cache(RadixSettings(page_size=s.page_size, capacity=s.capacity,
                                              eviction_policy=s.eviction_policy,
                                              chunked_prefill_size=s.chunked_prefill_size if s.chunked_prefill_size > 0 else -1,
                                              hicache=getattr(s, "hicache", None)))   # kvsim.engines.sglang.hicache
        # without prefix caching SGLang turns lpm and dfs-weight into fcfs
        policy = s.schedule_policy if s.enable_prefix_caching or s.schedule_policy not in CACHE_AWARE else "fcfs"
        self.policy = SchedulePolicy(policy, self.cache, s.random_seed)
        self.max_match = None if s.enable_prefix_caching else 0
        self.chunk = s.chunked_prefill_size if s.chunked_prefill_size > 0 else None
        self.waiting: list[SglangRequest] = []
        self.running = Batch([])
        self.last_batch: Batch | None = None
        self.chunked_req: SglangRequest | None = None
        self.result_queue: deque = deque()
        self.rows_free = s.max_running_requests     # ReqToTokenPool(size=max_running_requests)
        # NewTokenRatioTracker (§4.1)
        self.ratio_init = min(INIT_NEW_TOKEN_RATIO * s.schedule_conservativeness, 1.0)
        self.ratio_min = min(self.ratio_init * MIN_NEW_TOKEN_RATIO_FACTOR, 1.0)
        self.ratio_decay = (self.ratio_init - self.ratio_min) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.ratio_init
        self.result = StepResult.empty("sglang", len(prompts))
        self.on_batch = None        # on_batch(step, requests, new tokens, context, decode?): timed replay
        self.on_decode_run = None   # on_decode_run(steps, requests, context) -> steps kept: timed fast_forward

    # -- requests ----------------------------------------------------------------------
    def add(self, index: int) -> None:
        """Receive a request: clip its generation to the pool, reject it if it can never run."""
        s, p = self.settings, self.settings.page_size
        prompt = np.asarray(self.prompts[index], np.int64)
        outputs = np.asarray(self.outputs[index], np.int64)
        if len(outputs) == 0:
            outputs = np.zeros(1, np.int64)
        L = len(prompt)
        start = -1 if self.logprob_starts is None else int(self.logprob_starts[index])
        if logprob_aborts(L, start):
            # SGLang refuses the request (HTTP 400): kvsim reports it as rejected, as the
            # sequential model does, and does not run its one-token placeholder (radix.md §2.1)
            self.result.rejected[index] = True
            return
        if s.finish == "length":
            wanted = len(outputs)
        else:
            wanted = (1 << 30) if s.max_new_tokens is None else int(s.max_new_tokens)
        wanted = max(0, min(wanted, s.context_len - L - 1))      # init_req_max_new_tokens
        max_new = self.cache.max_new_tokens_for_memory(L, wanted)
        # the prompt never fits the empty pool's admission check: SGLang would keep it
        # waiting forever; kvsim rejects it (§1)
        if L == 0 or L + min(max_new, CLIP_MAX_NEW_TOKENS) + p >= s.capacity:
            self.result.rejected[index] = True
            return
        ns = namespace(None if self.loras is None else self.loras[index],
                       None if self.salts is None else self.salts[index])
        kv = self.cache.new_state(prompt, outputs, max_new, ns)
        req = SglangRequest(index, kv, max_new, s.finish == "length")
        req.logprob_start_len = start
        self.waiting.append(req)

    def allocatable(self, running_bs: int, held_rows: int = 0) -> int:
        """``get_num_allocatable_reqs``: request slots left for new prefills."""
        return min(self.settings.max_running_requests - running_bs, max(self.rows_free + held_rows, 0))

    def load(self) -> tuple[int, int, float]:
        """What a router polls: waiting requests, running ones (those holding a request slot)
        and ``token_usage`` (tokens neither free nor evictable, over the pool)."""
        s = self.settings
        free = self.cache.available_size + self.cache.evictable_size
        return len(self.waiting), s.max_running_requests - self.rows_free, max(0.0, 1.0 - free / s.capacity)

    # -- the loop ----------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.waiting) or bool(self.running.reqs) or self.chunked_req is not None \
            or self.last_batch is not None or bool(self.result_queue)

    def is_fully_idle(self) -> bool:
        return not self.running.reqs and self.chunked_req is None and \
            (self.last_batch is None or not self.last_batch.reqs) and not self.result_queue and not self.waiting

    def idle(self) -> None:
        """``on_idle`` while fully idle: the new-token ratio goes back to its start (§4.1)."""
        if self.is_fully_idle():
            self.new_token_ratio = self.ratio_init

    def step(self, step: int) -> bool:
        batch = self.get_next_batch_to_run()
        if batch is not None and self.on_batch is not None:
            if batch.mode == EXTEND:
                new = [r.kv.extend_end - r.kv.prefix_len for r in batch.reqs]
                ctx = [r.kv.prefix_len for r in batch.reqs]
            else:
                new = [1] * len(batch.reqs)
                ctx = [r.kv.committed - 1 for r in batch.reqs]
            self.on_batch(step, [r.index for r in batch.reqs], new, ctx, [batch.mode == DECODE] * len(new))
        if not self.settings.overlap:                       # event_loop_normal
            if batch is not None:
                self.process(batch.mode, batch.reqs, step)
            elif self.is_fully_idle():
                self.new_token_ratio = self.ratio_init
            self.last_batch = batch
            return True
        # event_loop_overlap: this batch's result waits until the next batch is built (§2.3)
        if batch is not None:
            self.result_queue.append((batch.mode, list(batch.reqs), step))
        if self.last_batch is not None:
            self.process(*self.result_queue.popleft())
        elif batch is None and self.is_fully_idle():
            self.new_token_ratio = self.ratio_init
        self.last_batch = batch
        return True

    def fast_forward(self, step: int, horizon: int) -> int:
        """Run up to ``horizon`` steps that only decode at once; returns how many (0: none).

        Steps in which no prefill can start (nobody waits, or the running batch is full),
        nothing is chunked and nobody finishes only allocate
        decode slots, evicting the tree's least recently used leaves when the free slots run
        short. Nothing else touches the tree meanwhile, so they are applied together: the
        same leaves evicted, the same slots in the same order, the same token counts and
        ``new_token_ratio`` decays as step by step (§5.4). With pages larger than one token
        only stretches that need no eviction are taken. On the timed clock (``on_decode_run``
        set) the clock says how many of them start before the next release.
        """
        running = self.running
        reqs = running.reqs
        if (self.waiting and not running.batch_is_full) or self.chunked_req is not None \
                or self.last_batch is not running or running.mode != DECODE or not reqs or horizon < 2 \
                or (self.on_batch is not None and self.on_decode_run is None):
            return 0
        if self.settings.overlap and (len(self.result_queue) != 1 or self.result_queue[0][0] != DECODE):
            return 0
        bs, p = len(reqs), self.settings.page_size
        room = min((r.max_new if r.ignore_eos else min(r.max_new, r.num_outputs)) - r.out_count for r in reqs)
        cache = self.cache
        # slots that can be had: free ones, and with one-token pages the evictable tree (whole
        # leaves, least recently used first: one eviction of the total frees the same leaves
        # as one per step)
        usable = cache.available_size + (cache.evictable_size if p == 1 else 0)
        k = min(horizon, room - 3, usable // (bs * p) - 1)
        if k < 2 or any(r.finished or r.is_retracted for r in reqs):
            return 0
        if self.on_decode_run is not None:
            # timed: in step j each request computes one token after committed + j (step()'s ctx)
            k = self.on_decode_run(k, [r.index for r in reqs], [r.kv.committed for r in reqs])
            if k < 2:
                return 0
        if p == 1:
            cache.evict_to_free(k * bs)
        cache.alloc_decode([r.kv for r in reqs], k)
        for r in reqs:
            r.out_count += k
        for _ in range(k):
            self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.ratio_min)
        if self.settings.overlap:
            self.result_queue[0] = (DECODE, list(reqs), step + k - 1)
        return k

    def get_next_batch_to_run(self) -> Batch | None:
        exclude = set()
        chunked = self.chunked_req
        if chunked is not None:
            exclude.add(chunked)
            if chunked.kv.extend_end > chunked.kv.prefix_len:
                self.cache.checkpoint(chunked.kv, chunked.kv.extend_end)   # stash the chunk (§4.5)
        running, last = self.running, self.last_batch
        if last is not None and last.mode == EXTEND:
            if last.chunked_req is not None:
                exclude.add(last.chunked_req)
            before = len(last.reqs)
            last.filter(exclude)
            if len(last.reqs) < before:
                running.batch_is_full = False
            if last.reqs and last is not running:
                if not running.reqs:
                    running = last
                else:
                    running.reqs = running.reqs + last.reqs
        before = len(running.reqs)
        running.filter()
        if len(running.reqs) < before:
            running.batch_is_full = False
        self.running = running
        new_batch = self.get_new_batch_prefill(running)
        if new_batch is not None:
            return new_batch                                # prefill has priority (§2.2)
        if running.reqs:
            decode = self.update_running_batch(running)
            if decode is not None and decode.reqs:
                return decode
        return None

    # -- prefill -------------------------------------------------------------------------
    def get_new_batch_prefill(self, running: Batch) -> Batch | None:
        if not running.reqs:
            running.batch_is_full = False
        if (running.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None
        if self.allocatable(len(running.reqs)) <= 0 and self.chunked_req is None:
            running.batch_is_full = True
            return None
        self.policy.calc_priority(self.waiting)
        adder = PrefillAdder(self.cache, running.reqs, self.new_token_ratio, self.settings.max_prefill_tokens,
                             self.chunk)
        if self.chunked_req is not None:
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        for req in self.waiting:
            if adder.budget_state() == OTHER:
                break
            held = sum(r.holds_row for r in adder.can_run)
            if len(adder.can_run) >= self.allocatable(len(running.reqs), held):
                running.batch_is_full = True
            if running.batch_is_full:
                break
            # init_next_round_input: match at most len - 1 tokens, a logprob request at
            # most its logprob_start_len (radix.md §2.1)
            limit = req.max_prefix_len() if self.max_match is None else self.max_match
            self.cache.match(req.kv, req.seq_len, limit=limit)
            req.kv.protected = req.kv.prefix_len
            res = adder.add_one_req(req)
            if res != CONTINUE:
                if res == NO_TOKEN:
                    # full until a running request leaves (§4.4)
                    running.batch_is_full = bool(adder.can_run) or bool(running.reqs)
                break
        if not adder.can_run:
            return None
        admitted = set(adder.can_run)
        self.waiting = [r for r in self.waiting if r not in admitted]
        if adder.new_chunked_req is not None:
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.inflight_middle_chunks += 1
        batch = Batch(adder.can_run, EXTEND, self.chunked_req)
        self.prepare_for_extend(batch)
        return batch

    def prepare_for_extend(self, batch: Batch) -> None:
        """Rows, one eviction for the whole batch, slots; ``cached_tokens`` is counted here (§6.1)."""
        cache, p = self.cache, self.settings.page_size
        extend_num_tokens = sum(r.kv.extend_end - r.kv.prefix_len for r in batch.reqs)
        for r in batch.reqs:
            if not r.holds_row:
                r.holds_row = True
                self.rows_free -= 1
        # paged allocation over-estimates one new page per request
        cache.evict_to_free(extend_num_tokens + (len(batch.reqs) * p if p > 1 else 0))
        for r in batch.reqs:
            cache.alloc_extend(r.kv)
            if not r.retracted_stain:
                r.cached_tokens += r.kv.prefix_len - r.already_computed
                r.already_computed = r.kv.extend_end
            r.is_retracted = False

    # -- decode --------------------------------------------------------------------------
    def update_running_batch(self, batch: Batch) -> Batch | None:
        initial_bs = len(batch.reqs)
        finishing = []
        if self.settings.overlap and self.result_queue:
            # skip-finishing-decode: a request whose queued result ends it by length (§2.3)
            queued = set(self.result_queue[0][1])
            # next_output_finishes_by_length
            finishing = [r for r in batch.reqs if r.out_count + 1 >= r.max_new and r in queued]
        batch.filter(finishing)
        if not batch.reqs:
            batch.batch_is_full = False
            return batch
        ok = self.check_decode_mem(batch.reqs)
        if not ok and finishing:
            batch.batch_is_full = False    # the finishing requests free memory at this step's end
            return None
        if not ok:
            retracted = self.retract_decode(batch)
            self.waiting.extend(retracted)
        else:
            self.new_token_ratio = max(self.new_token_ratio - self.ratio_decay, self.ratio_min)
        if len(batch.reqs) < initial_bs:
            batch.batch_is_full = False
        if not batch.reqs:
            return batch
        # prepare_for_decode: one eviction for the batch, then a slot per request
        p = self.settings.page_size
        self.cache.evict_to_free(len(batch.reqs) * p)
        self.cache.alloc_decode([r.kv for r in batch.reqs])
        batch.mode = DECODE
        return batch

    def check_decode_mem(self, reqs) -> bool:
        """Evict for the requests starting a new page; enough free slots now? (§5.1)"""
        p = self.settings.page_size
        need = len(reqs) if p == 1 else sum(1 for r in reqs if decode_starts_page(r.kv.committed, p)) * p
        self.cache.evict_to_free(need)
        return self.cache.available_size >= need

    def retract_decode(self, batch: Batch) -> list[SglangRequest]:
        """Retract the fewest-generated, longest-prompt requests until the decode fits (§5.2)."""
        reqs = batch.reqs
        order = sorted(range(len(reqs)), key=lambda i: (reqs[i].out_count, -reqs[i].prompt_len), reverse=True)
        retracted = []
        first = True
        while first or not self.check_decode_mem([reqs[i] for i in order]):
            if len(order) == 1:
                break
            first = False
            req = reqs[order.pop()]
            self._release_row(req, checkpoint=False)
            self.cache.evict_to_free(len(order) * RETRACT_DECODE_STEPS)
            self._reset_for_retract(req)
            retracted.append(req)
        if len(order) <= 1 and not self.check_decode_mem([reqs[i] for i in order]):
            raise RuntimeError("SGLang would abort the last running request: out of memory even alone")
        if len(order) != len(reqs):
            batch.reqs = [reqs[i] for i in order]
        kept = batch.reqs
        self.new_token_ratio = min(1.0, (sum(r.out_count for r in kept) + RETRACT_DECODE_STEPS * len(kept))
                                   / (sum(r.max_new for r in kept) + 1))
        return retracted

    def _reset_for_retract(self, req: SglangRequest) -> None:
        """The request starts over; generated tokens are kept and recomputed (radix.md §3.4)."""
        req.retraction_count += 1
        req.num_matched_prefix_tokens = 0
        req.is_retracted = True
        req.retracted_stain = True
        req.inflight_middle_chunks = 0
        req.already_computed = 0
        self.cache.reset_row(req.kv)

    def _release_row(self, req: SglangRequest, checkpoint: bool) -> None:
        if checkpoint:
            self.cache.release(req.kv)
        else:
            self.cache.release_uncached(req.kv)
        req.holds_row = False
        self.rows_free += 1

    # -- results ---------------------------------------------------------------------------
    def process(self, mode: str, reqs: list, step: int) -> None:
        """The fake model sampled each request's next logged token; apply it."""
        overlap = self.settings.overlap
        for r in reqs:
            if mode == EXTEND:
                if (r.finished and r.inflight_middle_chunks <= 0) or r.is_retracted:
                    continue
                if r.inflight_middle_chunks > 0:
                    r.inflight_middle_chunks -= 1   # a middle chunk samples nothing
                    continue
            elif overlap and (r.finished or r.is_retracted):
                continue
            r.out_count += 1
            if r.out_count == 1:
                self.result.first_token_step[r.index] = step
            if r.out_count >= r.max_new or (not r.ignore_eos and r.out_count == r.num_outputs):
                r.finished = True                     # update_finish_state: length or stop token
            if r.finished:
                self._release_row(r, checkpoint=True)
                i = r.index
                self.result.finish_step[i] = step
                self.result.output_tokens[i] = r.out_count
                self.result.finished.append(i)
                self.result.cached_tokens[i] = r.cached_tokens
                self.result.preemptions[i] = r.retraction_count
            elif mode == EXTEND:
                self.cache.checkpoint(r.kv, r.kv.extend_end)   # the prompt enters the tree (§6.2)
