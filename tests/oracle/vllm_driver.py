"""Drive the REAL vLLM 0.33.0 ``KVCacheManager`` one request at a time, as its scheduler does.

Runs under the oracle interpreter (``.oracle-venv/bin/python``), never imports kvsim.
Usage: ``vllm_driver.py JOBS.json``. Each job names a workload ``.npz`` (written by
``vllm_client.write_workload``), a config and an output ``.npz``.

Per request (``vllm/v1/core/sched/scheduler.py``: the waiting loop of ``schedule``,
``_update_after_schedule``, ``update_from_output``, ``_free_request``):

1. ``Request(...)`` with the real block hasher (``get_request_block_hasher``), a
   ``LoRARequest``, ``cache_salt`` and ``SamplingParams(prompt_logprobs=...)``;
2. ``get_computed_blocks`` → ``allocate_slots(num_tokens - hits, hits, blocks,
   full_sequence_must_fit=True)`` → ``record_prefix_cache_stats`` → status RUNNING,
   ``num_computed_tokens = hits``, then ``+= scheduled`` after the step;
3. the sampled token is appended; every further step schedules 1 token:
   ``allocate_slots(request, 1)``, ``num_computed_tokens += 1``, append the next token;
   after the last sampled token (never computed) the request finishes;
4. ``free(request)``.

A request whose peak footprint ``ceil((L + M - 1) / B)`` exceeds the usable blocks can
never be served: the real scheduler would keep it waiting (or preempt it at every decode)
forever. The driver reports it as rejected without touching the cache, as kvsim does;
with ``probe_rejections`` it also drives each such request through a fresh, empty manager
to record the step at which the real ``allocate_slots`` refuses it.
"""
from __future__ import annotations

import json
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import numpy as np
import torch
from vllm.lora.request import LoRARequest
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request, RequestStatus

MAX_MODEL_LEN = 1 << 30


def make_manager(num_blocks: int, block_size: int, count: list[int] | None) -> KVCacheManager:
    """vLLM 0.33's KVCacheManager for one full-attention group, prefix caching on."""
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
    manager = KVCacheManager(config, max_model_len=MAX_MODEL_LEN, scheduler_block_size=block_size,
                             hash_block_size=block_size, enable_caching=True, log_stats=True)
    if count is not None:
        pool = manager.block_pool
        evict = pool._maybe_evict_cached_block

        def counting(block):  # count blocks whose hash is dropped, then do the real thing
            evicted = evict(block)
            count[0] += evicted
            return evicted

        pool._maybe_evict_cached_block = counting
    return manager


class Workload:
    def __init__(self, path: str) -> None:
        z = np.load(path, allow_pickle=False)
        self.prompt_tok, self.prompt_off = z["prompt_tok"], z["prompt_off"]
        self.out_tok, self.out_off = z["out_tok"], z["out_off"]
        self.plp, self.lora, self.salt = z["plp"], z["lora"], z["salt"]
        names = json.loads(str(z["names"]))
        self.lora_names = [tuple(x) for x in names["lora"]]
        self.salt_names = names["salt"]
        self.n = len(self.prompt_off) - 1

    def prompt(self, i: int) -> list[int]:
        return self.prompt_tok[self.prompt_off[i]:self.prompt_off[i + 1]].tolist()

    def output(self, i: int) -> list[int]:
        return self.out_tok[self.out_off[i]:self.out_off[i + 1]].tolist()

    def make_request(self, i: int, hasher) -> Request:
        code = int(self.lora[i])
        lora = None
        if code >= 0:
            name, path = self.lora_names[code]
            lora = LoRARequest(lora_name=name, lora_int_id=code + 1, lora_path=path)
        salt = self.salt_names[int(self.salt[i])] if self.salt[i] >= 0 else None
        params = SamplingParams(max_tokens=max(1, len(self.output(i))),
                                prompt_logprobs=5 if self.plp[i] else None)
        return Request(str(i), self.prompt(i), params, None, lora_request=lora, cache_salt=salt,
                       block_hasher=hasher)


def serve(manager: KVCacheManager, request: Request, outputs: list[int]) -> int:
    """One request from admission to free; returns -1, or the step whose allocation failed."""
    manager.new_step_starts()
    blocks, num_hits, _ = manager.get_computed_blocks(request)
    # the scheduler's record of the first prefill: RequestOutput.num_cached_tokens
    request.prefill_stats.set(num_prompt_tokens=request.num_prompt_tokens,
                              num_local_cached_tokens=num_hits, num_external_cached_tokens=0)
    num_new = request.num_tokens - num_hits
    if manager.allocate_slots(request, num_new, num_new_computed_tokens=num_hits,
                              new_computed_blocks=blocks, full_sequence_must_fit=True,
                              has_scheduled_reqs=False) is None:
        return 0
    manager.record_prefix_cache_stats(request, num_hits)
    request.status = RequestStatus.RUNNING
    request.num_computed_tokens = num_hits
    request.num_computed_tokens += num_new          # _update_after_schedule
    request.append_output_token_ids(outputs[0])     # update_from_output
    for step, token in enumerate(outputs[1:], start=1):
        manager.new_step_starts()
        # running request: num_tokens_with_spec - num_computed_tokens = 1
        if manager.allocate_slots(request, 1) is None:
            return step
        request.num_computed_tokens += 1
        request.append_output_token_ids(token)
    return -1


def used_blocks(manager: KVCacheManager) -> int:
    """Blocks in use or cached: usable blocks minus free blocks that hold no hash."""
    pool = manager.block_pool
    empty = sum(1 for b in pool.free_block_queue.get_all_free_blocks() if b.block_hash is None)
    return pool.num_gpu_blocks - 1 - empty


def run_job(job: dict) -> None:
    work = Workload(job["workload"])
    B, N = int(job["block_size"]), int(job["num_gpu_blocks"])
    hash_fn = get_hash_fn_by_name(job.get("hash_algo", "sha256"))
    seed = job.get("pythonhashseed")
    saved = os.environ.pop("PYTHONHASHSEED", None)
    if seed is not None:
        os.environ["PYTHONHASHSEED"] = str(seed)  # init_none_hash reads it (0.33)
    elif saved is not None:
        os.environ["PYTHONHASHSEED"] = saved
    init_none_hash(hash_fn)
    os.environ.pop("PYTHONHASHSEED", None)
    if saved is not None:
        os.environ["PYTHONHASHSEED"] = saved
    hasher = get_request_block_hasher(B, hash_fn)
    count = [0] if job.get("count_evictions", True) else None
    manager = make_manager(N, B, count)
    n = work.n
    cached = np.zeros(n, np.int64)
    rejected = np.zeros(n, bool)
    evicted = np.zeros(n, np.int64)
    probe = np.full(n, -1, np.int64)
    used_after = np.full(n, -1, np.int64)
    queries = hits = 0
    hash_limit = int(job.get("return_hashes", 0))
    hashes: list[bytes] = []
    hash_off = [0]
    t0 = time.perf_counter()
    for i in range(n):
        outputs = work.output(i) or [0]
        L = int(work.prompt_off[i + 1] - work.prompt_off[i])
        if L == 0 or -(-(L + len(outputs) - 1) // B) > N - 1:
            rejected[i] = True
            if job.get("probe_rejections") and L > 0:
                probe[i] = serve(make_manager(N, B, None), work.make_request(i, hasher), outputs)
            if i < hash_limit:
                hash_off.append(len(hashes))
            continue
        before = count[0] if count else 0
        request = work.make_request(i, hasher)
        failed = serve(manager, request, outputs)
        assert failed == -1, f"request {i} was refused at step {failed} although it fits"
        if i < hash_limit:
            hashes.extend(request.block_hashes)
            hash_off.append(len(hashes))
        if job.get("track_used"):
            used_after[i] = used_blocks(manager)
        manager.free(request)
        stats = manager.make_prefix_cache_stats()
        queries += stats.queries
        hits += stats.hits
        cached[i] = request.prefill_stats.num_cached_tokens
        evicted[i] = (count[0] - before) if count else 0
    elapsed = time.perf_counter() - t0
    pool = manager.block_pool
    queue = np.array([b.block_id for b in pool.free_block_queue.get_all_free_blocks()], np.int64)
    np.savez(job["out"], cached=cached, rejected=rejected, evicted=evicted, probe=probe,
             used_after=used_after, queue=queue, elapsed=elapsed, queries=queries, hits=hits,
             map_keys=len(pool.cached_block_hash_to_block),
             cached_blocks=sum(1 for b in pool.blocks if b.block_hash is not None),
             hashes=np.frombuffer(b"".join(hashes), np.uint8), hash_off=np.array(hash_off, np.int64),
             none_hash=np.frombuffer(kv_cache_utils.NONE_HASH, np.uint8))


def main() -> None:
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    for job in jobs:
        run_job(job)


if __name__ == "__main__":
    main()
