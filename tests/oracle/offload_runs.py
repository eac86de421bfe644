"""The tier oracle runs, built once per test session: one subprocess for all three systems.

``test_tiers_{vllm,lmcache,hicache}_oracle.py`` read the results of :func:`all_systems`.
LMCache's token database and SGLang both import vLLM, whose import is the largest cost,
so one process (``offload_vllm_driver.py``, which hands LMCache and HiCache jobs to their
drivers' functions) pays it once.
"""
from __future__ import annotations

import copy
import functools
import tempfile
from pathlib import Path
from typing import Any

import offload_client
import offload_engine_jobs
from offload_lmcache_ops import random_script as lmcache_script
from offload_manager_ops import random_script as manager_script
from sched_workloads import SchedMix, random_workload

PAGE = 2 * 16 * 2 * 16 * 4           # one GPU block: 16 tokens x 2 heads x 16 dims x K,V x fp32 = 4 KiB
SHAPE = {"block_size": 16, "kv_heads": 2, "head_size": 16}
FAMILY = {c: list(range(1000 * (k + 1), 1000 * (k + 1) + 48)) for k, c in enumerate("ABCXY")}

MANAGER_JOBS = [dict(kind="manager", seed=seed, capacity=cap, policy=policy, store_threshold=thr,
                     tracker_size=tracker)
                for seed, cap in enumerate((6, 12, 20, 9, 30, 4))
                for policy in ("lru", "arc")
                for thr, tracker in ((0, 64_000), (2, 5))]

# (mode, GPU blocks, CPU chunks, policy, store threshold, offload block, async scheduling)
RANDOM = [
    ("sequential", 24, 40, "lru", 0, 16, False),
    ("sequential", 24, 40, "arc", 0, 16, False),
    ("sequential", 20, 25, "lru", 2, 16, False),
    ("sequential", 30, 12, "arc", 0, 32, False),
    ("sequential", 24, 60, "lru", 0, 64, False),
    ("sequential", 24, 3, "lru", 0, 16, False),         # a CPU tier smaller than a prompt: failures
    ("sequential", 24, 30, "arc", 2, 32, True),
    ("steps", 40, 30, "lru", 0, 16, False),
    ("steps", 40, 20, "arc", 0, 32, False),
    ("steps", 32, 30, "lru", 2, 16, True),
    ("steps", 14, 16, "lru", 0, 16, False),             # GPU pressure: preemption
    ("steps", 40, 6, "lru", 0, 16, False),              # pending stores of others: refused, retried
]

# LMCache: (seed, chunk bytes, slots of 4 KiB in max_local_cpu_size, save_unfull_chunk)
LMCACHE = [(0, 4096, 8, False), (1, 2048, 14, False), (2, 6016, 12, False), (3, 4096, 20, False),
           (4, 4096, 10, True), (5, 2048, 8, False)]
LMCACHE_CHUNK = 16


def w_workload(seq: str, outputs: int = 3) -> tuple[list, list]:
    """Workload W of offload.md §1.13: a 48-token shared prefix (family) + 24 tokens of its own."""
    prompts = [FAMILY[c] + list(range(100_000 + 100 * i, 100_000 + 100 * i + 24)) for i, c in enumerate(seq)]
    return prompts, [list(range(200_000 + 10 * i, 200_000 + 10 * i + outputs)) for i in range(len(seq))]


def scenario_jobs(tmp: Path) -> dict[str, dict]:
    """The acceptance workloads (offload.md §1.13) as driver jobs."""
    out = {}

    def job(name, prompts, outputs, arrival=None, **kw):
        path = tmp / f"{name}.npz"
        offload_client.write_workload(path, prompts, outputs, arrival or [0] * len(prompts))
        out[name] = dict(kind="sched", workload=str(path), record=True,
                         **{"cpu_bytes_to_use": 30 * PAGE, **SHAPE, **kw})

    job("V1", *w_workload("ABCAA"), num_gpu_blocks=100)
    job("V2", *w_workload("ABCAA"), num_gpu_blocks=10)
    job("V2-async", *w_workload("ABCAA"), num_gpu_blocks=10, async_scheduling=True)
    base = list(range(5000, 5200))
    job("V5", [base, list(range(7000, 7100)), base[:48] + list(range(8000, 8152)), base], [[1, 2], [3], [4], [5]],
        num_gpu_blocks=14, offload_block_size=64, cpu_bytes_to_use=30 * 4 * PAGE)
    p, o = w_workload("AXA")
    job("V6", p, [o[0][:1], o[1], o[2]], arrival=[0, 1, 1], num_gpu_blocks=6, mode="steps")
    job("V7", *w_workload("AXAYA"), num_gpu_blocks=6, store_threshold=2)
    return out


def random_jobs(tmp: Path) -> list[dict]:
    """Random workloads (shared prefixes, multi-turn, tenants) under GPU and CPU pressure."""
    jobs = []
    for k, (mode, gpu, cpu, policy, thr, ob, async_) in enumerate(RANDOM):
        mix = SchedMix(n=110, system_len=(16, 100), user_len=(1, 60), output_len=(1, 12), p_namespace=0.3,
                       burst=(1, 6), gap=2.0)
        w = random_workload(700 + k, mix)
        path = tmp / f"random{k}.npz"
        offload_client.write_workload(path, w.prompts, w.outputs, w.arrival, loras=w.loras, salts=w.salts)
        jobs.append(dict(kind="sched", workload=str(path), record=True, mode=mode, num_gpu_blocks=gpu,
                         cpu_bytes_to_use=cpu * PAGE * (ob // 16), eviction_policy=policy, store_threshold=thr,
                         offload_block_size=ob, async_scheduling=async_, max_num_batched_tokens=256,
                         max_num_seqs=8, **SHAPE))
    return jobs


HICACHE_POLICIES = ("write_through", "write_through_selective", "write_back")
# (device tokens, page, ratio, hicache_size GB) of the host-pool jobs
HICACHE_POOLS = [(160, 16, 2.0, 0.0), (1000, 1, 2.0, 0.0), (1000, 16, 1.5, 0.0), (4096, 64, 3.0, 0.0),
                 (512, 16, 2.0, 0.001)]


def hicache_jobs(tmp: Path) -> dict[str, dict]:
    """The HiCache acceptance workloads (offload.md §3.7), host pools, random workloads."""
    jobs: dict[str, dict] = {}

    def job(name, prompts, outputs, arrival=None, **kw):
        path = tmp / f"{name}.npz"
        offload_client.write_workload(path, prompts, outputs, arrival or [0] * len(prompts))
        jobs[name] = dict(kind="hicache", workload=str(path), max_running_requests=8,
                          **{"capacity": 160, "page_size": 16, **kw})

    for policy in HICACHE_POLICIES:
        job(f"H-{policy}", *w_workload("ABCA"), hicache_write_policy=policy)
    job("H4", *w_workload("ABCA"), capacity=4096)
    t = list(range(5000, 5039))
    job("H5", [t, list(range(6000, 6060)), t[:9] + list(range(7000, 7020)), t[:30] + [1, 2]], [[9], [8], [7], [6]],
        capacity=64, page_size=1)
    for k, (dev, page, ratio, size) in enumerate(HICACHE_POOLS):
        job(f"pool{k}", [list(range(50))], [[1]], capacity=dev, page_size=page, hicache_ratio=ratio,
            hicache_size=size)
    for k, policy in enumerate(HICACHE_POLICIES):
        for mode in ("sequential", "steps"):
            w = random_workload(900 + k, SchedMix(n=60, system_prompts=3, system_len=(16, 80), user_len=(1, 40),
                                                  output_len=(1, 10), burst=(1, 4), gap=2.0))
            job(f"random-{policy}-{mode}", w.prompts, w.outputs, arrival=w.arrival.tolist(), capacity=384,
                page_size=16, hicache_write_policy=policy, hicache_ratio=1.5, mode=mode)
    return jobs


def lmcache_jobs() -> list[dict]:
    return [dict(kind="storage", chunk_size=LMCACHE_CHUNK, chunk_bytes=cb, max_local_cpu_size=slots * 4096 / 2**30,
                 save_unfull_chunk=unfull, script=lmcache_script(seed, LMCACHE_CHUNK, n=80))
            for seed, cb, slots, unfull in LMCACHE]


@functools.cache
def all_systems() -> dict[str, Any]:
    """Every tier job through the real code, in one subprocess (``{"skip": why}``: no oracle)."""
    python, why = offload_client.oracle_python("vllm")
    if python is None:
        return {"skip": why}
    _, lmcache_why = offload_client.oracle_python("lmcache")
    _, hicache_why = offload_client.oracle_python("hicache")
    tmp = Path(tempfile.mkdtemp(prefix="kvsim-tier-runs-"))
    parts: dict[str, Any] = {
        "managers": [dict(j, script=manager_script(j["seed"])) for j in MANAGER_JOBS],
        "scenarios": scenario_jobs(tmp),
        "random": random_jobs(tmp),
        "lmcache": [] if lmcache_why else lmcache_jobs(),
        "hicache": {} if hicache_why else hicache_jobs(tmp),
        # the whole-replay differentials of kvsim's engines with a tier (test_offload_*_oracle.py)
        "engine_vllm": offload_engine_jobs.vllm_jobs(tmp),
        "engine_hicache": [] if hicache_why else offload_engine_jobs.hicache_jobs(tmp),
    }
    flat = [j for part in parts.values() for j in (part.values() if isinstance(part, dict) else part)]
    results = iter(offload_client.run_jobs("vllm", copy.deepcopy(flat), python))
    out: dict[str, Any] = {"lmcache_skip": lmcache_why, "hicache_skip": hicache_why}
    for name, part in parts.items():
        if isinstance(part, dict):
            out[name] = {key: (job, next(results)) for key, job in part.items()}
        else:
            out[name] = [(job, next(results)) for job in part]
    return out
