"""The specs' scheduler scenarios as workloads, shared by the model tests and the oracle tests.

vLLM: ``vllm_apc.md`` X1-X6; SGLang: ``sglang_radix.md`` 15-16; and a designed workload
on which SGLang's ``lpm`` beats ``fcfs`` on hits. Each scenario is (prompts, outputs,
arrival steps, settings knobs); the expected numbers are the specs' (and, for the lpm
workload, the real SGLang's, equal to kvsim's).
"""
from __future__ import annotations

import numpy as np

MODES = [False, True]   # vLLM async scheduling off / on


def distinct(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


# -- vLLM X1-X6 ----------------------------------------------------------------------------
def vllm_scenarios() -> dict:
    """name -> (prompts, outputs, arrival steps, settings knobs); the specs' setups."""
    rng = np.random.default_rng(0)
    x3_prompts = [rng.integers(0, 50_000, 100).tolist() for _ in range(5)]
    x3_outputs = [rng.integers(0, 50_000, 200).tolist() for _ in range(5)]
    x4_out = distinct(2000, 188)
    P = distinct(100, 100)
    return {
        # X1: 17 x 101, then the same prompt again after the first finished
        "X1": ([[101] * 17] * 2, [[5, 6, 7]] * 2, [0, 50],
               dict(num_gpu_blocks=100, max_num_batched_tokens=6, long_prefill_token_threshold=2, max_num_seqs=3)),
        # X2: two identical 100-token prompts before the first step, budget 1000
        "X2": ([P, P], [[1, 2, 3]] * 2, [0, 0], dict(num_gpu_blocks=100, max_num_batched_tokens=1000)),
        # X3: five 100-token prompts x 200 outputs, then prompt + outputs as the next turns
        "X3": (x3_prompts + [p + o for p, o in zip(x3_prompts, x3_outputs)], x3_outputs + [[1]] * 5,
               [0] * 5 + [1000] * 5, dict(num_gpu_blocks=200, max_num_batched_tokens=2048)),
        # X4: 100 x 7 with 188 outputs; the 288th token is never computed
        "X4": ([[7] * 100, [7] * 100 + x4_out + distinct(3000, 20)], [x4_out, [1]], [0, 1000],
               dict(num_gpu_blocks=100, max_num_batched_tokens=2048)),
        # X5: 4 usable blocks, 30- and 32-token prompts, 4 outputs each
        "X5": ([distinct(100, 30), distinct(200, 32)], [[1, 2, 3, 4]] * 2, [0, 0],
               dict(num_gpu_blocks=5, max_num_batched_tokens=200, max_num_seqs=16)),
        # X6: budget 40; r1 = P + 100 more arrives while r0 = P is being chunked
        "X6": ([P, P + distinct(500, 100)], [[1, 2]] * 2, [0, 1],
               dict(num_gpu_blocks=100, max_num_batched_tokens=40, max_num_seqs=16)),
    }


VLLM_EXPECTED = {     # cached tokens per request
    "X1": [0, 16], "X2": [0, 96], "X3": [0] * 5 + [288] * 5, "X4": [0, 272], "X5": [0, 0], "X6": [0, 96],
}


def sglang_15_16():
    P, out = distinct(1, 10), distinct(77, 5)
    prompts = [P, P, P, P + out + [90, 91, 92]]
    outputs = [out, out, distinct(300, 3), distinct(400, 3)]
    return prompts, outputs, [0, 0, 50, 100], dict(capacity=100, overlap=False, chunked_prefill_size=4096)


def lpm_workload():
    """60 requests at once over three 300-token system prompts, interleaved; room for ~2 prompts."""
    rng = np.random.default_rng(0)
    systems = [rng.integers(0, 1000, 300) for _ in range(3)]
    prompts = [np.concatenate([systems[i % 3], rng.integers(0, 1000, 20)]) for i in range(60)]
    outputs = [rng.integers(0, 1000, 10) for _ in range(60)]
    settings = dict(capacity=700, max_running_requests=4, chunked_prefill_size=512, max_prefill_tokens=1024)
    return prompts, outputs, np.zeros(60, np.int64), settings


LPM_HITS = {"fcfs": 8700, "lpm": 16802}     # equal to SGLang 0.5.23's (test_sched_sglang_oracle.py)




def vllm_job(path, s) -> dict:
    """A ``vllm_sched_driver.py`` job for settings ``s`` (a ``VllmSchedSettings``)."""
    return {"workload": str(path), "block_size": s.block_size, "num_gpu_blocks": s.num_gpu_blocks,
            "max_num_batched_tokens": s.max_num_batched_tokens, "max_num_seqs": s.max_num_seqs,
            "long_prefill_token_threshold": s.long_prefill_token_threshold, "policy": s.policy,
            "async_scheduling": s.async_scheduling, "watermark": s.watermark,
            "reserve_full_isl": s.reserve_full_isl, "enable_chunked_prefill": s.enable_chunked_prefill,
            "max_model_len": s.max_model_len, "enable_prefix_caching": s.enable_prefix_caching}


def sglang_job(path, s) -> dict:
    """A ``sglang_sched_driver.py`` job for settings ``s`` (a ``SglangSchedSettings``)."""
    return {"workload": str(path), "capacity": s.capacity, "page_size": s.page_size,
            "schedule_policy": s.schedule_policy, "chunked_prefill_size": s.chunked_prefill_size,
            "max_prefill_tokens": s.max_prefill_tokens, "max_running_requests": s.max_running_requests,
            "schedule_conservativeness": s.schedule_conservativeness, "overlap": s.overlap,
            "finish": s.finish, "max_new_tokens": s.max_new_tokens, "random_seed": s.random_seed,
            "context_len": s.context_len}
