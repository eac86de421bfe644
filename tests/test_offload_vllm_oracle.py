"""kvsim's WHOLE vLLM replay with a CPU tier against the REAL vLLM 0.33.0 scheduler + OffloadingConnector.

The tier oracle process (``offload_runs.all_systems``) replays the acceptance workloads of
``docs/engines/offload.md §1.13``, the tier models' random workloads and the engine
workloads of ``oracle/offload_engine_jobs.py`` (shared prefixes, multi-turn sessions,
repeats, LoRA / cache-salt tenants; GPU pools of 10-50 blocks, CPU tiers of 3-200 chunks,
offload blocks of 1-4 GPU blocks, lru and arc, store thresholds 2 and 3, token budgets
64-2048, sync and async scheduling) through vLLM's real scheduler with the real connector
and manager. kvsim replays the same requests through its own engine with the tier on,
resolved from the options as ``kvsim simulate --offload native`` resolves them (the CPU
size in bytes with a model of the driver's shape): per request the reported
``cached_tokens`` (local + external) and its CPU part must be equal, in both
implementations.
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "oracle"))
import offload_runs  # noqa: E402
from offload_engine_jobs import kvsim_workload, step_replay  # noqa: E402

from kvsim.engines.options import SimOptions  # noqa: E402
from kvsim.engines.vllm.sequential import APCFast, APCReference  # noqa: E402
from kvsim.engines.vllm.settings import APCSettings  # noqa: E402

pytestmark = pytest.mark.oracle


@pytest.fixture(scope="module")
def real():
    runs = offload_runs.all_systems()
    if "skip" in runs:
        pytest.skip(runs["skip"])
    return runs


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """The driver's model shape as a config.json: 1 layer, 2 KV heads of 16, fp32 (4 KiB per block)."""
    path = tmp_path_factory.mktemp("model") / "config.json"
    path.write_text(json.dumps({"num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
                                "hidden_size": 32, "torch_dtype": "float32"}))
    return str(path)


def settings(job: dict, model: str) -> APCSettings:
    """kvsim's settings for a driver job, through SimOptions as the CLI builds them."""
    extra = {"offload": "native", "offload_size": f"{job['cpu_bytes_to_use']}B",
             "offload_block_size": job.get("offload_block_size") or 16,
             "offload_eviction_policy": job.get("eviction_policy", "lru"),
             "offload_store_threshold": job.get("store_threshold", 0)}
    s = APCSettings.from_options(SimOptions(num_gpu_blocks=job["num_gpu_blocks"], block_size=16, model=model,
                                            extra=extra))
    # the sequential replay's token budget is vLLM's default for --gpu; the jobs set their own
    return replace(s, offload=replace(s.offload, token_budget=int(job.get("max_num_batched_tokens", 8192))))


def sequential_runs(real) -> list[tuple[dict, dict]]:
    runs = [*real["scenarios"].values(), *real["random"], *real["engine_vllm"]]
    return [(j, r) for j, r in runs if j.get("mode", "sequential") == "sequential"]


def test_sequential_replay_equals_the_real_engine_per_request(real, model):
    """Per request: rejected, cached_tokens = local + external, and its CPU part, as vLLM reports
    them (PrefillStats), for kvsim's fast and readable engines; CPU capacity from bytes as vLLM's spec."""
    runs = sequential_runs(real)
    assert len(runs) >= 20
    seen = {"external": 0, "requests_with_cpu_hit": 0, "evicted_chunks": 0, "store_failures": 0}
    kinds = set()
    for job, res in runs:
        s = settings(job, model)
        assert s.offload.native.num_chunks == res["counters"]["num_chunks"], job
        work = kvsim_workload(job["workload"])
        want_rejected = res["rejected"].astype(bool)
        want_cached = np.where(want_rejected, 0, res["local"] + res["external"])
        want_cpu = np.where(want_rejected, 0, res["external"])
        for cls in (APCFast, APCReference):
            engine = cls.for_workload(s, work)
            cols = engine.replay(work)
            run = engine.tier.run()
            name = f"{Path(job['workload']).name} {cls.__name__}"
            np.testing.assert_array_equal(cols.rejected, want_rejected, err_msg=name)
            np.testing.assert_array_equal(np.where(cols.rejected, 0, cols.cached_tokens), want_cached, err_msg=name)
            np.testing.assert_array_equal(run.by_tier["cpu"], want_cpu, err_msg=name)
            np.testing.assert_array_equal(run.by_tier["gpu"] + run.by_tier["cpu"], cols.cached_tokens, err_msg=name)
        seen["external"] += int(want_cpu.sum())
        seen["requests_with_cpu_hit"] += int((want_cpu > 0).sum())
        seen["evicted_chunks"] += res["counters"]["evicted_chunks"]
        seen["store_failures"] += res["counters"]["store_failures"]
        kinds.add((job.get("eviction_policy", "lru"), int(job.get("store_threshold", 0)) >= 2,
                   job.get("offload_block_size") or 16))
    # the runs reach every rule: CPU hits under pressure, evictions, refused stores, both policies,
    # thresholds, offload blocks of 1, 2, 3 and 4 GPU blocks
    assert seen["requests_with_cpu_hit"] > 150 and all(v > 0 for v in seen.values()), seen
    assert {k[0] for k in kinds} == {"lru", "arc"} and any(k[1] for k in kinds)
    assert {k[2] for k in kinds} >= {16, 32, 48, 64}


def test_step_clock_replay_equals_the_real_scheduler_per_request(real, model):
    """On the step clock (the engine jobs: bursts of arrivals, GPU pressure, preemption, loads
    deferred behind pending stores, sync and async scheduling): per request cached_tokens, its
    CPU part, the first-token and finishing steps and the preemptions equal the real scheduler's."""
    from kvsim.engines.vllm.connector import OffloadSchedSettings
    from kvsim.engines.vllm.scheduler import scheduler_settings

    runs = [(j, r) for j, r in real["engine_vllm"] if j["mode"] == "steps"]
    assert len(runs) >= 8
    seen = {"external": 0, "preemptions": 0, "async": 0}
    for job, res in runs:
        options = SimOptions(num_gpu_blocks=job["num_gpu_blocks"], block_size=16, model=model, extra={
            "offload": "native", "offload_size": f"{job['cpu_bytes_to_use']}B",
            "offload_block_size": job["offload_block_size"], "offload_eviction_policy": job["eviction_policy"],
            "offload_store_threshold": job["store_threshold"]})
        s, _ = scheduler_settings(options, {"max_num_batched_tokens": job["max_num_batched_tokens"],
                                            "max_num_seqs": job["max_num_seqs"],
                                            "async_scheduling": job["async_scheduling"]})
        assert isinstance(s, OffloadSchedSettings) and s.offload.native.num_chunks == res["counters"]["num_chunks"]
        got, name = step_replay(s, job["workload"]), Path(job["workload"]).name
        served = ~res["rejected"].astype(bool)
        np.testing.assert_array_equal(got.rejected, ~served, err_msg=name)
        np.testing.assert_array_equal(got.cached_tokens[served], (res["local"] + res["external"])[served], err_msg=name)
        np.testing.assert_array_equal(got.extra["offload"].by_tier["cpu"][served], res["external"][served],
                                      err_msg=name)
        for key in ("first_token_step", "finish_step", "preemptions"):
            np.testing.assert_array_equal(getattr(got, key)[served], res[key][served], err_msg=f"{name} {key}")
        seen["external"] += int(res["external"][served].sum())
        seen["preemptions"] += int(res["preemptions"].sum())
        seen["async"] += int(job["async_scheduling"])
    assert all(v > 0 for v in seen.values()), seen
