"""Drive the REAL vLLM 0.33.0 v1 ``Scheduler`` on a step clock, with a fake model runner.

Runs under the oracle interpreter, never imports kvsim. Usage:
``vllm_sched_driver.py JOBS.json``; each job names a workload ``.npz`` (written by
``sched_client.write_workload``), the engine settings and an output ``.npz``.

The engine is the real thing: ``VllmConfig`` (a tiny local Llama config, CPU device),
``SchedulerConfig`` with the job's budgets and policy, the real ``Scheduler`` (or
``AsyncScheduler`` when async scheduling is on) with its real ``KVCacheManager``,
``Request`` objects with the real block hasher. Only the model runner is fake: for every
request scheduled to finish its known tokens it "samples" the next logged output token.

The loop is the engine core's (``vllm/v1/engine/core.py``): ``step`` (schedule, execute,
``update_from_output``) when async scheduling is off, ``step_with_batch_queue`` with a
queue of ``max_concurrent_batches`` (2) when it is on, so the output of step N is
processed after step N+1 is scheduled.

Step clock (kvsim's ``--replay steps``): steps are numbered by ``schedule()`` calls; a
request whose ``arrival_step`` is t is added before step t is scheduled; when the engine
has no work (``has_requests()`` false and no batch in flight) the clock jumps to the next
arrival. Per request: ``num_cached_tokens`` (the first prefill's stats), the step whose
output holds its first token and the one that finishes it, and ``num_preemptions``.
A request that can never fit (``ceil((L + M - 1) / B) > num_gpu_blocks - 1``, kvsim's
sequential rejection rule) is rejected at arrival and never added.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import warnings
from collections import deque

warnings.filterwarnings("ignore")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ["HF_HUB_OFFLINE"] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

MAX_MODEL_LEN = 1 << 17
BATCH_QUEUE_SIZE = 2   # VllmConfig.max_concurrent_batches with async scheduling, no PP


def _model_dir() -> str:
    """A tiny Llama config on local disk: ModelConfig reads it without any network."""
    d = tempfile.mkdtemp(prefix="kvsim-vllm-model-")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": MAX_MODEL_LEN,
                   "rms_norm_eps": 1e-5, "torch_dtype": "float32"}, f)
    return d


MODEL_DIR = _model_dir()


def make_scheduler(job: dict):
    """The real (Async)Scheduler with the job's settings (prefix caching on unless the job says)."""
    B, N = int(job["block_size"]), int(job["num_gpu_blocks"])
    max_model_len = int(job.get("max_model_len") or MAX_MODEL_LEN)
    model = ModelConfig(model=MODEL_DIR, skip_tokenizer_init=True, max_model_len=max_model_len, dtype="float32")
    sched = SchedulerConfig(
        max_num_batched_tokens=int(job["max_num_batched_tokens"]), max_num_seqs=int(job["max_num_seqs"]),
        max_model_len=max_model_len, is_encoder_decoder=False,
        enable_chunked_prefill=bool(job.get("enable_chunked_prefill", True)),
        long_prefill_token_threshold=int(job.get("long_prefill_token_threshold", 0)),
        policy=job.get("policy", "fcfs"), async_scheduling=bool(job["async_scheduling"]),
        watermark=float(job.get("watermark", 0.0)),
        scheduler_reserve_full_isl=bool(job.get("reserve_full_isl", True)))
    cache = CacheConfig(block_size=B, enable_prefix_caching=bool(job.get("enable_prefix_caching", True)))
    cache.num_gpu_blocks = N
    config = VllmConfig(model_config=model, scheduler_config=sched, cache_config=cache,
                        device_config=DeviceConfig(device="cpu"))
    assert config.scheduler_config.async_scheduling == bool(job["async_scheduling"])
    assert config.max_concurrent_batches == (BATCH_QUEUE_SIZE if job["async_scheduling"] else 1)
    spec = FullAttentionSpec(block_size=B, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=N, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    cls = config.scheduler_config.get_scheduler_cls()
    return cls(config, kv, StructuredOutputManager(config), block_size=B, log_stats=False)


class Workload:
    def __init__(self, path: str) -> None:
        z = np.load(path, allow_pickle=False)
        self.prompt_tok, self.prompt_off = z["prompt_tok"], z["prompt_off"]
        self.out_tok, self.out_off = z["out_tok"], z["out_off"]
        self.arrival, self.priority = z["arrival"], z["priority"]
        self.lora, self.salt = z["lora"], z["salt"]
        self.names = json.loads(str(z["names"]))
        self.prompt_logprobs = z["prompt_logprobs"]
        self.n = len(self.prompt_off) - 1

    def namespace(self, i: int) -> dict:
        """The request's LoRA adapter (name = path, as kvsim hashes it) and cache salt."""
        out = {}
        if self.lora[i] >= 0:
            name = self.names[int(self.lora[i])]
            out["lora_request"] = LoRARequest(lora_name=name, lora_int_id=int(self.lora[i]) + 1, lora_path=name)
        if self.salt[i] >= 0:
            out["cache_salt"] = self.names[int(self.salt[i])]
        return out

    def prompt(self, i: int) -> list[int]:
        return self.prompt_tok[self.prompt_off[i]:self.prompt_off[i + 1]].tolist()

    def output(self, i: int) -> list[int]:
        return self.out_tok[self.out_off[i]:self.out_off[i + 1]].tolist()


class FakeRunner:
    """Samples the logged output tokens: position p of the sequence holds output p - L."""

    def __init__(self, sched, outputs: dict[str, list[int]]) -> None:
        self.sched = sched
        self.outputs = outputs

    def execute(self, out) -> ModelRunnerOutput:
        """Called right after schedule(): a request not in the middle of its prefill samples."""
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = self.sched.requests[rid]
            if req.is_prefill_chunk:
                sampled.append([])   # a partial prefill's sample is discarded by the runner
                continue
            k = req.num_computed_tokens - req.num_prompt_tokens   # index of the token sampled
            seq = self.outputs[rid]
            assert 0 <= k < len(seq), f"request {rid} sampled output {k} of {len(seq)}"
            sampled.append([seq[k]])
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: j for j, r in enumerate(ids)},
                                 sampled_token_ids=sampled)


def run_job(job: dict) -> None:
    work = Workload(job["workload"])
    B, N = int(job["block_size"]), int(job["num_gpu_blocks"])
    init_none_hash(get_hash_fn_by_name("sha256"))
    hasher = get_request_block_hasher(B, get_hash_fn_by_name("sha256"))
    sched = make_scheduler(job)
    n = work.n
    cached = np.full(n, -1, np.int64)
    first = np.full(n, -1, np.int64)
    finish = np.full(n, -1, np.int64)
    preempt = np.zeros(n, np.int64)
    rejected = np.zeros(n, bool)
    outputs: dict[str, list[int]] = {}
    live: dict[str, Request] = {}
    runner = FakeRunner(sched, outputs)
    order = sorted(range(n), key=lambda i: (int(work.arrival[i]), i))
    nxt = 0
    step = 0
    queue: deque = deque()
    use_queue = bool(job["async_scheduling"])
    t0, c0 = time.perf_counter(), time.process_time()

    def record(engine_outputs, s: int) -> None:
        for eco in engine_outputs.values():
            for o in eco.outputs:
                i = int(o.request_id)
                if o.prefill_stats is not None and cached[i] < 0:
                    cached[i] = o.prefill_stats.num_cached_tokens
                if o.new_token_ids and first[i] < 0:
                    first[i] = s
                if o.finish_reason is not None:
                    finish[i] = s
                    preempt[i] = live.pop(o.request_id).num_preemptions

    while True:
        if not (sched.has_requests() or queue):          # engine idle: jump to the next arrival
            if nxt == len(order):
                break
            step = max(step, int(work.arrival[order[nxt]]))
        while nxt < len(order) and int(work.arrival[order[nxt]]) <= step:
            i = order[nxt]
            nxt += 1
            prompt, out = work.prompt(i), work.output(i) or [0]
            if not prompt or -(-(len(prompt) + len(out) - 1) // B) > N - 1:
                rejected[i] = True
                continue
            # a prompt-logprob request: SamplingParams marks it skip_reading_prefix_cache
            logprobs = {"prompt_logprobs": 0} if work.prompt_logprobs[i] else {}
            req = Request(str(i), prompt, SamplingParams(max_tokens=len(out), **logprobs), None,
                          arrival_time=float(i), priority=int(work.priority[i]), block_hasher=hasher,
                          **work.namespace(i))
            outputs[str(i)] = out
            live[str(i)] = req
            sched.add_request(req)
        if not use_queue:                                  # EngineCore.step
            if not sched.has_requests():
                continue
            out = sched.schedule()
            record(sched.update_from_output(out, runner.execute(out)), step)
            step += 1
            continue
        # EngineCore.step_with_batch_queue
        if sched.has_requests():
            out = sched.schedule()
            queue.appendleft((runner.execute(out), out, step))
            step += 1
            executed = out.total_num_scheduled_tokens > 0
            if len(queue) < BATCH_QUEUE_SIZE and (executed or sched.has_requests()):
                continue
        elif not queue:
            continue
        result, out, s = queue.pop()
        record(sched.update_from_output(out, result), s)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert not live, f"requests never finished: {sorted(live)[:5]}"
    np.savez(job["out"], cached=cached, first_token_step=first, finish_step=finish, preemptions=preempt,
             rejected=rejected, steps=step, elapsed=elapsed, cpu=cpu)


def main() -> None:
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    for job in jobs:
        run_job(job)


if __name__ == "__main__":
    main()
