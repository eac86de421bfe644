"""Workloads for the whole-replay differential tests of kvsim's engines with an offload tier.

``test_offload_vllm_oracle.py`` and ``test_offload_hicache_oracle.py`` replay these through
kvsim's vLLM / SGLang engine with the tier on and compare every request with the real
vLLM 0.33.0 scheduler + OffloadingConnector and the real SGLang 0.5.23 scheduler +
UnifiedRadixCache with HiCache (the jobs run in the one tier oracle process of
``offload_runs.all_systems``). Random mixes of shared system prompts, multi-turn sessions,
repeats and tenants (LoRA / cache-salt namespaces), under GPU pressure, with CPU tiers from
a few chunks to more than the GPU. The vLLM jobs signal the requests that finish in one step in
the order they finished (``finish_order``, ``offload_vllm_driver.make_scheduler``): vLLM's own
order is a ``set``'s, randomized per process.
"""
from __future__ import annotations

from pathlib import Path

import offload_client
from sched_workloads import SchedMix, random_workload

SHAPE = {"block_size": 16, "kv_heads": 2, "head_size": 16}
PAGE = 2 * 16 * 2 * 16 * 4           # one GPU block of SHAPE in fp32: 4 KiB

# vLLM: (mode, seed, GPU blocks, CPU chunks, policy, store threshold, offload block, async, budget, mix)
VLLM = [
    ("sequential", 1, 12, 8, "lru", 0, 16, False, 2048, "long"),
    ("sequential", 2, 16, 30, "arc", 0, 16, False, 2048, "long"),
    ("sequential", 3, 20, 120, "lru", 0, 32, True, 256, "sessions"),
    ("sequential", 4, 14, 20, "arc", 2, 16, False, 64, "sessions"),
    ("sequential", 5, 30, 6, "lru", 3, 64, False, 2048, "tenants"),
    ("sequential", 6, 40, 200, "arc", 0, 48, True, 512, "tenants"),
    ("sequential", 7, 10, 50, "lru", 2, 32, False, 128, "long"),
    ("sequential", 8, 24, 12, "arc", 0, 32, False, 2048, "sessions"),
    ("steps", 11, 40, 40, "lru", 0, 16, False, 256, "sessions"),
    ("steps", 12, 30, 25, "arc", 0, 32, True, 256, "tenants"),
    ("steps", 13, 24, 60, "lru", 2, 16, True, 128, "long"),
    ("steps", 14, 50, 10, "arc", 0, 16, False, 512, "sessions"),
    ("steps", 15, 20, 30, "arc", 0, 32, True, 128, "long"),
    ("steps", 16, 60, 200, "lru", 0, 64, False, 2048, "tenants"),
    ("steps", 17, 16, 8, "lru", 0, 16, True, 64, "sessions"),
    ("steps", 18, 28, 40, "arc", 3, 48, False, 256, "long"),
]
MIXES = {
    "long": dict(system_prompts=4, system_len=(40, 160), user_len=(1, 50), output_len=(1, 10)),
    "sessions": dict(system_prompts=3, system_len=(16, 80), user_len=(1, 40), output_len=(1, 16), p_session=0.6),
    "tenants": dict(system_prompts=4, system_len=(16, 120), user_len=(1, 60), output_len=(1, 12),
                    p_namespace=0.5, p_repeat=0.2),
}

# SGLang HiCache: (mode, seed, device tokens, page, write policy, ratio, mix)
HICACHE = [
    (mode, 40 + k, cap, page, policy, ratio, mix)
    for k, (mode, cap, page, policy, ratio, mix) in enumerate([
        ("sequential", 256, 1, "write_through", 1.0, "long"),
        ("sequential", 320, 16, "write_through", 0.6, "sessions"),
        ("sequential", 256, 1, "write_through_selective", 1.5, "sessions"),
        ("sequential", 384, 16, "write_through_selective", 0.8, "long"),
        ("sequential", 256, 1, "write_back", 0.7, "long"),
        ("sequential", 320, 16, "write_back", 1.2, "sessions"),
        ("sequential", 512, 4, "write_through", 2.0, "tenants"),
        ("sequential", 400, 8, "write_back", 0.5, "tenants"),
        ("steps", 384, 16, "write_through", 1.0, "sessions"),
        ("steps", 320, 1, "write_through_selective", 1.5, "long"),
        ("steps", 448, 16, "write_back", 0.8, "sessions"),
    ])
]


def vllm_jobs(tmp: Path) -> list[dict]:
    jobs = []
    for k, (mode, seed, gpu, cpu, policy, thr, ob, async_, budget, mix) in enumerate(VLLM):
        w = random_workload(seed, SchedMix(n=120, burst=(1, 6), gap=2.5, **MIXES[mix]))
        path = tmp / f"engine-vllm{k}.npz"
        offload_client.write_workload(path, w.prompts, w.outputs, w.arrival, loras=w.loras, salts=w.salts)
        jobs.append(dict(kind="sched", workload=str(path), record=False, mode=mode, num_gpu_blocks=gpu,
                         cpu_bytes_to_use=cpu * PAGE * (ob // 16), eviction_policy=policy, store_threshold=thr,
                         offload_block_size=ob, async_scheduling=async_, max_num_batched_tokens=budget,
                         max_num_seqs=8, finish_order="insertion", **SHAPE))
    return jobs


def hicache_jobs(tmp: Path) -> list[dict]:
    jobs = []
    for k, (mode, seed, cap, page, policy, ratio, mix) in enumerate(HICACHE):
        w = random_workload(seed, SchedMix(n=100, burst=(1, 4), gap=2.0, **MIXES[mix]))
        path = tmp / f"engine-hicache{k}.npz"
        offload_client.write_workload(path, w.prompts, w.outputs, w.arrival, loras=w.loras, salts=w.salts)
        jobs.append(dict(kind="hicache", workload=str(path), mode=mode, capacity=cap, page_size=page,
                         hicache_write_policy=policy, hicache_ratio=ratio, max_running_requests=8))
    return jobs


def kvsim_workload(path: str, keep=None):
    """A driver workload as kvsim's :class:`~kvsim.engines.base.Workload` (LoRA paths are the
    adapter names, as the driver's ``LoRARequest``); ``keep``: only these requests (bool mask)."""
    import json

    import numpy as np

    from kvsim.engines.base import Workload

    z = np.load(path, allow_pickle=False)
    names = json.loads(str(z["names"]))
    n = len(z["prompt_off"]) - 1
    idx = np.arange(n) if keep is None else np.nonzero(keep)[0]
    prompts = [z["prompt_tok"][z["prompt_off"][i]:z["prompt_off"][i + 1]] for i in idx]
    outputs = [z["out_tok"][z["out_off"][i]:z["out_off"][i + 1]] for i in idx]
    cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64)  # noqa: E731
    off = lambda xs: np.concatenate([[0], np.cumsum([len(x) for x in xs])]).astype(np.int64)  # noqa: E731
    name = lambda c: None if c < 0 else names[int(c)]  # noqa: E731
    return Workload(cat(prompts).astype(np.int64), off(prompts), cat(outputs).astype(np.int64), off(outputs),
                    [name(z["lora"][i]) for i in idx], [name(z["salt"][i]) for i in idx], np.zeros(len(idx), bool),
                    np.full(len(idx), -1, np.int64), [str(i) for i in idx])


def step_replay(settings, path: str):
    """The driver workload at ``path`` through ``settings``' scheduler engine on the step clock,
    arriving as logged; the engine's result."""
    import numpy as np

    from kvsim.drive.clock import run_steps

    work = kvsim_workload(path)
    prompts = [work.prompt_tokens[work.prompt_offsets[i]:work.prompt_offsets[i + 1]] for i in range(len(work))]
    outputs = [work.output_tokens[work.output_offsets[i]:work.output_offsets[i + 1]] for i in range(len(work))]
    engine = settings.engine(prompts, outputs, loras=work.lora, salts=work.cache_salt)
    run_steps(engine, np.load(path)["arrival"])
    return engine.result
