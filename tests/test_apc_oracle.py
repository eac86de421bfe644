"""Differential tests: kvsim's APC engines against the real vLLM 0.33.0 KVCacheManager.

22 seeded workloads x 1,000 requests (shared system prompts, multi-turn sessions that
resend earlier replies, repeats, block-aligned and sub-block prompts, salts, LoRA adapters,
prompt-logprob requests; block sizes 1-64; capacities from "smaller than the largest
request" to "a few requests' worth"). vLLM runs once per configuration in one subprocess
(``tests/oracle/vllm_driver.py``); both kvsim engines must match it request for request.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "oracle"))
import vllm_client
from vllm_workloads import Mix, random_trace

from kvsim.engines.vllm import hashing
from kvsim.io.trace.columns import Trace
from kvsim.drive.sequential import replay_detailed
from kvsim.engines.options import SimOptions
from kvsim.drive.requests import output_token_arrays

pytestmark = pytest.mark.oracle

# (seed, block size, capacity rule, vLLM hash algo, workload knobs). Capacity rules, in
# blocks of the workload's largest request ("max"): "p95" rejects the largest 5%.
CONFIGS = [
    (1, 16, "max", "sha256", {}),
    (2, 16, "2max", "sha256", {}),
    (3, 16, "4max", "sha256_cbor", {}),
    (4, 16, "p95", "sha256", {}),
    (5, 16, "max", "sha256", {"p_salt": 0.5, "salts": 2}),
    (6, 16, "2max", "sha256", {"p_lora": 0.5, "loras": 3}),
    (7, 16, "max", "sha256", {"p_plp": 0.3}),
    (8, 16, "2max", "sha256_cbor", {"p_aligned": 0.6}),
    (9, 16, "max", "sha256", {"p_short": 0.4, "user_len": (1, 30)}),
    (10, 16, "8max", "sha256", {"p_session": 0.7}),
    (11, 16, "max", "sha256", {"output_len": (1, 120), "p_logged": 0.3}),
    (12, 16, "p95", "sha256", {"p_repeat": 0.3}),
    (13, 1, "max", "sha256", {"user_len": (1, 40), "system_len": (5, 60)}),
    (14, 2, "2max", "sha256", {}),
    (15, 4, "max", "sha256_cbor", {}),
    (16, 8, "p95", "sha256", {}),
    (17, 32, "max", "sha256", {}),
    (18, 64, "2max", "sha256", {}),
    (19, 16, "max", "sha256", {"system_prompts": 1, "system_len": (300, 400)}),
    (20, 16, "2max", "sha256", {"vocab": 5, "p_short": 0.2}),
    (21, 16, "max", "sha256", {"p_salt": 0.3, "p_lora": 0.3, "p_plp": 0.15, "p_aligned": 0.3}),
    (22, 32, "4max", "sha256", {"p_session": 0.8, "output_len": (1, 80)}),
]


def _num_blocks(trace, block_size: int, rule: str) -> int:
    L, M = trace.prompt_lengths, np.maximum(trace.output_lengths, 1)
    need = -(-(L + M - 1) // block_size)
    if rule == "p95":
        return int(np.percentile(need, 95)) + 1
    factor = 1 if rule == "max" else int(rule[:-3])
    return factor * int(need.max()) + 1


@pytest.fixture(scope="module")
def oracle_runs(tmp_path_factory):
    python = vllm_client.oracle_python()
    if python is None:
        pytest.skip(f"vLLM oracle unavailable: {vllm_client.REASON}")
    tmp = tmp_path_factory.mktemp("apc-oracle")
    runs, jobs = [], []
    for seed, B, rule, algo, knobs in CONFIGS:
        trace = random_trace(seed, Mix(block_size=B, **knobs))
        options = SimOptions(num_gpu_blocks=_num_blocks(trace, B, rule), block_size=B)
        path = vllm_client.write_workload(trace, tmp / f"w{seed}.npz")
        jobs.append({"workload": str(path), "block_size": B, "num_gpu_blocks": options.num_gpu_blocks,
                     "hash_algo": algo, "track_used": B >= 16, "probe_rejections": True,
                     "return_hashes": 60})
        runs.append((trace, options, algo))
    # one more job: NONE_HASH seeded by PYTHONHASHSEED, one-character names (shared by CPython)
    seeded = Trace.from_prompts([list(range(k, k + 40)) for k in range(6)], output_lengths=[20] * 6,
                                loras=["x", "adapter", None, "x", "adapter", None],
                                cache_salts=["s", None, "tenant", None, "s", "tenant"])
    path = vllm_client.write_workload(seeded, tmp / "seeded.npz")
    jobs.append({"workload": str(path), "block_size": 16, "num_gpu_blocks": 1000, "return_hashes": 6,
                 "pythonhashseed": "1234"})
    results = vllm_client.run_jobs(jobs, python)
    ORACLE_EXTRA["seeded"] = (seeded, results.pop())
    return [(*run, res) for run, res in zip(runs, results)]


ORACLE_EXTRA: dict = {}


@pytest.mark.parametrize("k", range(len(CONFIGS)), ids=[f"seed{c[0]}-B{c[1]}-{c[2]}" for c in CONFIGS])
@pytest.mark.parametrize("engine", ["fast", "reference"])
def test_replay_matches_vllm(oracle_runs, k, engine):
    """Per-request cached tokens, rejections, evictions, hit stats and the final pool equal vLLM's."""
    trace, options, _, vllm = oracle_runs[k]
    result, cache = replay_detailed("apc", trace, options, implementation=engine)
    final = cache.final_state()
    np.testing.assert_array_equal(result.rejected, vllm["rejected"])
    np.testing.assert_array_equal(result.cached_tokens, vllm["cached"])
    np.testing.assert_array_equal(result.evictions, vllm["evicted"])
    assert final.free_queue == vllm["queue"].tolist()
    assert final.map_keys == int(vllm["map_keys"])
    assert final.cached_blocks == int(vllm["cached_blocks"])
    assert result.extra["vllm_prefix_cache_queries"] == int(vllm["queries"])
    assert result.extra["vllm_prefix_cache_hits"] == int(vllm["hits"])
    if vllm["used_after"].max() >= 0:  # blocks held at the end of each request = the peak
        assert result.peak_used_tokens == int(vllm["used_after"].max()) * options.block_size
    # the workload really exercises the rules
    assert result.cached_tokens.sum() > 0 and result.evictions.sum() > 0


def test_configurations_cover_the_rules(oracle_runs):
    """Together the configurations hit every feature the model must get right."""
    covered = {"rejected": 0, "plp": 0, "salt": 0, "lora": 0, "aligned_full_hit": 0, "duplicates": 0}
    for trace, options, _, vllm in oracle_runs:
        B = options.block_size
        L = trace.prompt_lengths
        ok = ~vllm["rejected"]
        covered["rejected"] += int(vllm["rejected"].sum())
        covered["plp"] += int((trace.prompt_logprobs & ok).sum())
        covered["salt"] += int(((trace.cache_salt >= 0) & (vllm["cached"] > 0)).sum())
        covered["lora"] += int(((trace.lora >= 0) & (vllm["cached"] > 0)).sum())
        covered["aligned_full_hit"] += int(((L % B == 0) & (vllm["cached"] == L - B) & (L > B)).sum())
        covered["duplicates"] += int(vllm["cached_blocks"]) - int(vllm["map_keys"])
    assert len(oracle_runs) >= 20 and all(len(t) == 1000 for t, *_ in oracle_runs)
    assert all(v > 0 for v in covered.values()), covered


def test_rejected_requests_are_refused_by_vllm(oracle_runs):
    """A request over the peak-footprint rule fails vLLM's own allocate_slots even in an empty cache."""
    probed = 0
    for _, _, _, vllm in oracle_runs:
        steps = vllm["probe"][vllm["rejected"]]
        assert (steps >= 0).all()
        probed += len(steps)
    assert probed > 0


@pytest.mark.parametrize("k", [0, 2, 5, 6, 14])
def test_exact_hashes_match_vllm(oracle_runs, k):
    """sha256 / sha256_cbor block hashes are byte-for-byte vLLM's (prompt and output blocks)."""
    trace, options, algo, vllm = oracle_runs[k]
    expected = vllm_client.split_hashes(vllm)
    out, out_off = output_token_arrays(trace)
    checked = 0
    for i, want in enumerate(expected):
        if vllm["rejected"][i]:
            continue
        lora = trace.name_of("lora", int(trace.lora[i]))
        seq = np.concatenate([trace.prompt(i), out[out_off[i]:out_off[i + 1]]])
        got = hashing.exact_block_hashes(seq, options.block_size, algo, None if lora is None else (lora, lora),
                                         trace.name_of("cache_salt", int(trace.cache_salt[i])))
        assert got == want
        checked += len(want)
    assert checked > 100
    assert hashing.none_hash(algo) == vllm["none_hash"].tobytes()


def test_pythonhashseed_sets_none_hash_as_in_vllm(oracle_runs):
    """With PYTHONHASHSEED set, vLLM and kvsim both seed NONE_HASH with it."""
    trace, res = ORACLE_EXTRA["seeded"]
    assert res["none_hash"].tobytes() == hashing.none_hash("sha256", seed="1234")
    assert res["none_hash"].tobytes() != hashing.none_hash("sha256", seed=hashing.DEFAULT_NONE_HASH_SEED)
    out, out_off = output_token_arrays(trace)
    for i, want in enumerate(vllm_client.split_hashes(res)):
        lora = trace.name_of("lora", int(trace.lora[i]))
        seq = np.concatenate([trace.prompt(i), out[out_off[i]:out_off[i + 1]]])
        assert hashing.exact_block_hashes(seq, 16, "sha256", None if lora is None else (lora, lora),
                                          trace.name_of("cache_salt", int(trace.cache_salt[i])),
                                          seed="1234") == want
