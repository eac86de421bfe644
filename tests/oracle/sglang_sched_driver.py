"""Drive the REAL SGLang 0.5.23 scheduler's event loop on a step clock, with a fake model.

Runs under the oracle interpreter, never imports kvsim. Usage:
``sglang_sched_driver.py JOBS.json``; each job names a workload ``.npz`` (written by
``sched_client.write_workload``), the server settings and an output ``.npz``.

The scheduler is SGLang's own ``Scheduler`` class, built without its ``__init__`` (which
starts a model worker, sockets and a GPU pool): the attributes its scheduling methods
read are set here, the semantic ones to the real objects (``ServerArgs`` published for
the scheduler role, the default ``UnifiedRadixCache`` with its Rust core, the real token
allocator and request-to-token pool, ``SchedulePolicy``, ``NewTokenRatioTracker``,
``SchedulerBatchResultProcessor``), the reporting ones (metrics, streaming, load
publishing) to a null object. The loop calls the real methods in
``event_loop_normal`` / ``event_loop_overlap`` order: ``get_next_batch_to_run`` (which
runs ``get_new_batch_prefill`` with ``PrefillAdder``, ``ScheduleBatch.prepare_for_extend``,
``update_running_batch`` with ``check_decode_mem`` / ``retract_decode`` and
``prepare_for_decode``), a fake ``run_batch`` that "samples" the logged output tokens,
and ``process_batch_result_prefill`` / ``_decode`` (overlap: one iteration later).

Step clock (kvsim's ``--replay steps``): steps are numbered by event-loop iterations
while the scheduler has work (waiting, running, a chunked request, or a batch whose
result is not processed); a request whose ``arrival_step`` is t is received at the top
of iteration t; while idle the clock jumps to the next arrival (after the idle pass,
which resets ``new_token_ratio``). Per request: ``cached_tokens``, the step of the batch
whose output holds its first token and of the one that finishes it, and the number of
retractions. A request whose prompt cannot be admitted even into an empty pool
(``L + min(max_new, 4096) + page >= capacity``) is rejected at arrival.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
import warnings
from array import array
from collections import deque
from types import SimpleNamespace

warnings.filterwarnings("ignore")
os.environ.setdefault("SGLANG_DISABLE_REQUEST_LOGGING", "1")

import logging  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402

CLIP_MAX_NEW_TOKENS = 4096
MAX_CONTEXT = 1 << 15
STOP_TOKEN = 1_000_003      # finish "stop": the last output token of every request is this id
SYNTHETIC_BASE = 1 << 40    # above every real token id


def publish(job: dict) -> None:
    """The ServerArgs a user would pass, published for the scheduler role."""
    chunk = int(job.get("chunked_prefill_size", 8192))
    args = ServerArgs(model_path="dummy", device="cpu", page_size=int(job.get("page_size", 1)),
                      radix_eviction_policy="lru", chunked_prefill_size=chunk,
                      schedule_policy=job.get("schedule_policy", "fcfs"),
                      max_prefill_tokens=int(job.get("max_prefill_tokens", 16384)),
                      max_running_requests=int(job["max_running_requests"]),
                      schedule_conservativeness=float(job.get("schedule_conservativeness", 1.0)),
                      disable_overlap_schedule=not job.get("overlap", True),
                      random_seed=int(job.get("random_seed", 0)))
    set_global_server_args_for_scheduler(args)
    from sglang.srt.runtime_context import get_memory
    get_memory()._set("radix_eviction_policy", "lru")


publish({"max_running_requests": 8})

from sglang.srt.managers.schedule_batch import Req, ScheduleBatch  # noqa: E402
from sglang.srt.managers.schedule_policy import SchedulePolicy  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.managers.scheduler_components.batch_result_processor import (  # noqa: E402
    SchedulerBatchResultProcessor,
)
from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker  # noqa: E402
from sglang.srt.managers.utils import GenerationBatchResult  # noqa: E402
from sglang.srt.disaggregation.utils import DisaggregationMode  # noqa: E402
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

logging.disable(logging.WARNING)


class Null:
    """Stands in for reporting components: every attribute and call is a no-op."""

    def __getattr__(self, name):
        return self

    def __call__(self, *a, **kw):
        return self

    def __bool__(self):
        return False

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    __add__ = __radd__ = __mod__ = __sub__ = __mul__ = lambda self, other: self

    def __index__(self):
        return 0


NULL = Null()


def build_cache(job: dict):
    """The default server's tree: UnifiedRadixCache (Rust core), real allocator and row pool."""
    p, capacity = int(job.get("page_size", 1)), int(job["capacity"])
    context = int(job.get("context_len") or MAX_CONTEXT)
    pool = ReqToTokenPool(size=int(job["max_running_requests"]), max_context_len=context + 16, device="cpu",
                          enable_memory_saver=False)
    if p == 1:
        alloc = TokenToKVPoolAllocator(size=capacity, dtype=torch.bfloat16, device="cpu", kvcache=None,
                                       need_sort=False)
    else:
        alloc = PagedTokenToKVPoolAllocator(size=capacity, page_size=p, dtype=torch.bfloat16, device="cpu",
                                            kvcache=None, need_sort=False)
        alloc.use_triton_kernels = False
    params = CacheInitParams(disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc,
                             page_size=p, eviction_policy="lru", tree_components=(ComponentType.FULL,),
                             tree_core_backend="rust")
    return UnifiedRadixCache(params), alloc, pool


def make_scheduler(job: dict) -> Scheduler:
    publish(job)
    from sglang.srt.runtime_context import get_context, get_parallel
    if not get_parallel().pp_max_micro_batch_size:   # as Scheduler.__init__ does
        get_context().override("scheduler.pp_max_micro_batch_size_default",
                               pp_max_micro_batch_size=max(int(job["max_running_requests"]), 1))
    tree, alloc, pool = build_cache(job)
    s = Scheduler.__new__(Scheduler)
    model_config = SimpleNamespace(vocab_size=1 << 20, is_encoder_decoder=False, is_multimodal=False,
                                   num_key_value_heads=1, context_len=MAX_CONTEXT, hf_config=None,
                                   self_opened_think_start_ids=None, think_end_ids=None)
    overlap = bool(job.get("overlap", True))
    s.__dict__.update(
        tree_cache=tree, token_to_kv_pool_allocator=alloc, req_to_token_pool=pool, page_size=alloc.page_size,
        model_config=model_config, device="cpu", enable_overlap=overlap, enable_overlap_mlx=False,
        spec_algorithm=SpeculativeAlgorithm.NONE, is_generation=True,
        disaggregation_mode=DisaggregationMode.NULL, dllm_config=None, enable_hisparse=False,
        enable_hierarchical_cache=False, enable_hicache_storage=False, enable_lmcache=False,
        enable_unified_cache_external_linker=False, enable_lora=False, enable_priority_scheduling=False,
        enable_priority_preemption=False, schedule_low_priority_values_first=False,
        is_hybrid_swa=False, require_mlp_sync=False, is_mixed_chunk=False, enable_unified_memory=False,
        chunked_prefill_size=(int(job["chunked_prefill_size"]) if int(job.get("chunked_prefill_size", 8192)) > 0
                              else None),
        max_prefill_tokens=int(job.get("max_prefill_tokens", 16384)),
        max_running_requests=int(job["max_running_requests"]), max_total_num_tokens=int(job["capacity"]),
        max_req_len=int(job.get("context_len") or MAX_CONTEXT), max_new_tokens_limit=None, kv_shard_widening=1, sliding_window_size=None,
        truncation_align_size=None, priority_scheduling_preemption_threshold=10, max_prefill_bs=0,
        prefill_decode_interval=0, _prefill_decode_interval_remaining=0, prefill_delayer=None,
        min_free_slots_delayer=None, dynamic_chunk_sizer=None, decode_offload_manager=None,
        hisparse_coordinator=None, processed_tokens_counter=0, forward_ct=0,
        chunked_req=None, _pending_chunked_abort_req=None, waiting_queue=[],
        running_batch=ScheduleBatch(reqs=[], batch_is_full=False), last_batch=None, result_queue=deque(),
        enable_skip_finishing_decode=overlap, max_queued_requests=None,
        grammar_manager=SimpleNamespace(has_waiting_grammars=lambda: False, grammar_queue=[]),
        beam_coordinator=SimpleNamespace(pending_member_rows=lambda batch: 0, retire_group=lambda req: None),
        tp_worker=SimpleNamespace(model_runner=SimpleNamespace(attn_backend=object(), prefill_aware_swa=False)),
        dp_attn_adapter=SimpleNamespace(maybe_prepare_mlp_sync_batch=lambda b, need_sync=False: b,
                                        maybe_convert_decode_to_extend=lambda b: b),
        ngram_embedding_manager=SimpleNamespace(prepare_for_forward=lambda b, chunked_req=None: b),
        dllm_manager=SimpleNamespace(any_staging_reqs=lambda: False),
        load_inquirer=NULL, metrics_reporter=NULL, metrics_collector=NULL, output_streamer=NULL,
        scheduler_stage_metrics=None,
    )
    s.policy = SchedulePolicy(job.get("schedule_policy", "fcfs"), tree, False, False, False)
    s.new_token_ratio_tracker = NewTokenRatioTracker.from_config()
    s.batch_result_processor = SchedulerBatchResultProcessor(
        is_generation=True, disaggregation_mode=DisaggregationMode.NULL, enable_overlap=overlap,
        enable_overlap_mlx=False, model_config=model_config, token_to_kv_pool_allocator=alloc, tree_cache=tree,
        hisparse_coordinator=None, req_to_token_pool=pool, decode_offload_manager=None, metrics_collector=NULL,
        metrics_reporter=NULL, draft_worker=None, model_worker=SimpleNamespace(), logprob_result_processor=NULL,
        output_streamer=NULL, beam_coordinator=s.beam_coordinator, abort_request=lambda *a, **k: None)
    return s


class Workload:
    def __init__(self, path: str) -> None:
        z = np.load(path, allow_pickle=False)
        self.prompt_tok, self.prompt_off = z["prompt_tok"], z["prompt_off"]
        self.out_tok, self.out_off = z["out_tok"], z["out_off"]
        self.arrival = z["arrival"]
        self.lora, self.salt = z["lora"], z["salt"]
        self.names = json.loads(str(z["names"]))
        self.logprob_start = z["logprob_start"]
        self.n = len(self.prompt_off) - 1

    def namespace(self, i: int) -> dict:
        """The request's LoRA id and cache salt: both key its tree namespace."""
        return {"lora_id": self.names[int(self.lora[i])] if self.lora[i] >= 0 else None,
                "cache_salt": self.names[int(self.salt[i])] if self.salt[i] >= 0 else None}

    def prompt(self, i: int) -> list[int]:
        return self.prompt_tok[self.prompt_off[i]:self.prompt_off[i + 1]].tolist()

    def output(self, i: int) -> list[int]:
        # kvsim synthesizes unknown replies as distinct negative ids that match nothing;
        # SGLang takes a negative id for a NaN and stops, so shift them out of range
        return [t if t >= 0 else SYNTHETIC_BASE - t for t in
                self.out_tok[self.out_off[i]:self.out_off[i + 1]].tolist()]


class Replay:
    """The event loop on the step clock, recording what each request saw."""

    def __init__(self, job: dict) -> None:
        self.job = job
        self.work = Workload(job["workload"])
        random.seed(int(job.get("random_seed", 0)))     # the server seeds Python's RNG at start
        self.s = make_scheduler(job)
        n = self.work.n
        self.cached = np.full(n, -1, np.int64)
        self.first = np.full(n, -1, np.int64)
        self.finish = np.full(n, -1, np.int64)
        self.retracted = np.zeros(n, np.int64)
        self.rejected = np.zeros(n, bool)
        self.outputs: dict[str, list[int]] = {}
        self.live: dict[str, Req] = {}

    # -- requests ---------------------------------------------------------------------
    def add(self, i: int) -> None:
        s, prompt, out = self.s, self.work.prompt(i), self.work.output(i) or [0]
        if self.job.get("finish", "length") == "stop":
            # ends with a stop token; max_tokens is the client's cap (unset: 2^30, clipped to the pool)
            assert out[-1] == STOP_TOKEN and STOP_TOKEN not in out[:-1]
            cap = self.job.get("max_new_tokens")
            sampling = SamplingParams(temperature=0, max_new_tokens=(1 << 30) if cap is None else int(cap),
                                      stop_token_ids=[STOP_TOKEN])
        else:            # ends by length: ignore_eos, max_tokens = the logged output length
            sampling = SamplingParams(temperature=0, max_new_tokens=len(out), ignore_eos=True)
        sampling.normalize(None)
        req = Req(rid=str(i), origin_input_text="", origin_input_ids=array("q", prompt), sampling_params=sampling,
                  **self.work.namespace(i))
        start = int(self.work.logprob_start[i])
        if start >= 0:      # a logprob request: its start caps the prefix match (_compute_max_prefix_len)
            assert start <= len(prompt)
            req.return_logprob, req.logprob_start_len = True, start
        s.init_req_max_new_tokens(req)
        max_new = req.sampling_params.max_new_tokens
        p = s.page_size
        if not prompt or len(prompt) + min(max_new, CLIP_MAX_NEW_TOKENS) + p >= s.max_total_num_tokens \
                or req.finished():
            self.rejected[i] = True
            return
        self.outputs[req.rid] = out
        self.live[req.rid] = req
        s._add_request_to_queue(req)

    def has_work(self) -> bool:
        s = self.s
        return bool(s.waiting_queue) or not s.running_batch.is_empty() or s.chunked_req is not None \
            or s.last_batch is not None or bool(s.result_queue)

    def idle(self) -> None:
        """on_idle while fully idle: new_token_ratio back to its initial value."""
        if self.s.is_fully_idle():
            self.s.new_token_ratio_tracker.reset()

    # -- the fake model ------------------------------------------------------------------
    def run_batch(self, batch: ScheduleBatch, step: int) -> GenerationBatchResult:
        seq_lens = batch.seq_lens_cpu.tolist()
        ids = []
        for req, seq_len in zip(batch.reqs, seq_lens):
            k = seq_len - len(req.origin_input_ids)        # the output index this forward samples
            out = self.outputs[req.rid]
            ids.append(out[k] if 0 <= k < len(out) else 0)
        batch.kvsim_step = step
        return GenerationBatchResult(next_token_ids=torch.tensor(ids, dtype=torch.int64))

    def process(self, batch: ScheduleBatch, result: GenerationBatchResult) -> None:
        proc = self.s.batch_result_processor
        before = {r.rid: (len(r.output_ids), r.finished()) for r in batch.reqs}
        # the fake model computes no logprobs: their bookkeeping is switched off while the
        # result is processed (scheduling reads return_logprob only for the match cap)
        asked = [(r, r.return_logprob) for r in batch.reqs]
        batch_asked, batch.return_logprob = batch.return_logprob, False
        for r, _ in asked:
            r.return_logprob = False
        try:
            if batch.forward_mode.is_decode():
                proc.process_batch_result_decode(batch, result)
            else:
                proc.process_batch_result_prefill(batch, result)
        finally:
            for r, flag in asked:
                r.return_logprob = flag
            batch.return_logprob = batch_asked
        step = batch.kvsim_step
        for req in batch.reqs:
            n_before, done_before = before[req.rid]
            i = int(req.rid)
            if len(req.output_ids) > n_before and self.first[i] < 0:
                self.first[i] = step
            if req.finished() and not done_before and req.rid in self.live:
                self.finish[i] = step
                self.cached[i] = req.cached_tokens
                self.retracted[i] = req.retraction_count
                del self.live[req.rid]

    # -- one loop iteration --------------------------------------------------------------
    def iteration(self, step: int) -> None:
        s = self.s
        plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
        s.running_batch = plan.running_batch
        batch = plan.batch_to_run
        if not s.enable_overlap:                          # event_loop_normal
            if batch:
                self.process(batch, self.run_batch(batch, step))
            elif s.is_fully_idle():
                s.new_token_ratio_tracker.reset()
            s.last_batch = batch
            return
        disable = s.is_disable_overlap_for_batch(batch, last_batch=s.last_batch)   # event_loop_overlap
        if disable:
            self.process(*s.result_queue.popleft())
        if batch:
            result = self.run_batch(batch, step)
            copy = batch.copy()
            copy.kvsim_step = step
            s.result_queue.append((copy, result))
        if s.last_batch:
            if not disable:
                self.process(*s.result_queue.popleft())
        elif batch is None and s.is_fully_idle():
            s.new_token_ratio_tracker.reset()
        s.last_batch = batch

    def run(self) -> int:
        work = self.work
        order = sorted(range(work.n), key=lambda i: (int(work.arrival[i]), i))
        nxt, step = 0, 0
        while True:
            if not self.has_work():
                self.idle()
                if nxt == len(order):
                    break
                step = max(step, int(work.arrival[order[nxt]]))
            while nxt < len(order) and int(work.arrival[order[nxt]]) <= step:
                self.add(order[nxt])
                nxt += 1
            if not self.has_work():
                continue
            self.iteration(step)
            step += 1
        assert not self.live, f"requests never finished: {sorted(self.live)[:5]}"
        return step


def run_job(job: dict) -> None:
    t0, c0 = time.perf_counter(), time.process_time()
    r = Replay(job)
    steps = r.run()
    np.savez(job["out"], cached=r.cached, first_token_step=r.first, finish_step=r.finish,
             preemptions=r.retracted, rejected=r.rejected, steps=steps, elapsed=time.perf_counter() - t0,
             cpu=time.process_time() - c0)


def main() -> None:
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    for job in jobs:
        run_job(job)


if __name__ == "__main__":
    main()
