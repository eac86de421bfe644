"""kvsim's engines with an offload tier, against each other (the real engines are in
``test_offload_*_oracle.py``): the fast and readable sequential replays give the same requests;
the schedulers fed one request at a time give the sequential replay's; the HiCache tree keeps
its invariants; a step that loads takes the transfer's time."""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "oracle"))
from sched_workloads import SchedMix, random_workload  # noqa: E402

from kvsim.engines.base import Workload  # noqa: E402
from kvsim.engines.options import SimOptions  # noqa: E402
from kvsim.engines.sglang.hicache import HiCacheSchedSettings  # noqa: E402
from kvsim.engines.sglang.sequential import RadixFast, RadixReference  # noqa: E402
from kvsim.engines.sglang.settings import RadixSettings  # noqa: E402
from kvsim.engines.vllm.connector import OffloadSchedSettings  # noqa: E402
from kvsim.engines.vllm.sequential import APCFast, APCReference  # noqa: E402
from kvsim.engines.vllm.settings import APCSettings  # noqa: E402


def workload(seed: int, n: int = 80, **mix) -> Workload:
    w = random_workload(seed, SchedMix(n=n, system_prompts=4, system_len=(20, 120), user_len=(1, 50),
                                       output_len=(1, 12), p_session=0.5, p_repeat=0.15, **mix))
    cat = lambda xs: np.concatenate([np.asarray(x, np.int64) for x in xs])  # noqa: E731
    off = lambda xs: np.concatenate([[0], np.cumsum([len(x) for x in xs])]).astype(np.int64)  # noqa: E731
    return Workload(cat(w.prompts), off(w.prompts), cat(w.outputs), off(w.outputs), list(w.loras), list(w.salts),
                    np.zeros(w.n, bool), np.full(w.n, -1, np.int64), [str(i) for i in range(w.n)])


def apc(blocks: int, **extra) -> APCSettings:
    return APCSettings.from_options(SimOptions(num_gpu_blocks=blocks, block_size=16, extra=extra))


VLLM_TIERS = [
    dict(offload="native", offload_size=640),
    dict(offload="native", offload_size=2000, offload_block_size=32, offload_eviction_policy="arc"),
    dict(offload="native", offload_size=800, offload_store_threshold=2),
    dict(offload="lmcache", offload_size=640, lmcache_chunk_size=16),
    dict(offload="lmcache", offload_size=256, disk_size=1024, lmcache_chunk_size=32, lmcache_save_unfull_chunk=True),
]


@pytest.mark.parametrize("tier", VLLM_TIERS, ids=lambda t: "-".join(f"{v}" for v in t.values()))
def test_vllm_fast_and_readable_replays_agree(tier):
    """Per request: cached tokens and each tier's part; per run the tier's counters."""
    w = workload(3, p_namespace=0.3)
    s = apc(20, **tier)
    fast, ref = APCFast.for_workload(s, w), APCReference.for_workload(s, w)
    a, b = fast.replay(w), ref.replay(w)
    np.testing.assert_array_equal(a.cached_tokens, b.cached_tokens)
    ra, rb = fast.tier.run(), ref.tier.run()
    for t in ra.tiers():
        np.testing.assert_array_equal(ra.by_tier[t], rb.by_tier[t])
    assert (ra.stored_tokens, ra.loaded_tokens, ra.evicted_tokens) == (rb.stored_tokens, rb.loaded_tokens,
                                                                        rb.evicted_tokens)
    assert sum(int(ra.by_tier[t].sum()) for t in ra.tiers() if t != "gpu") > 0
    # the GPU part is the tier-less replay's, request for request (offload.md §4)
    plain = APCFast.for_workload(replace(s, offload=None), w).replay(w)
    np.testing.assert_array_equal(ra.by_tier["gpu"], plain.cached_tokens)


def run_one_at_a_time(engine, n: int) -> None:
    step = 0
    for i in range(n):
        engine.add(i)
        while engine.has_work():
            engine.step(step)
            step += 1


def per_request(w: Workload):
    prompts = [w.prompt_tokens[w.prompt_offsets[i]:w.prompt_offsets[i + 1]] for i in range(len(w))]
    outputs = [w.output_tokens[w.output_offsets[i]:w.output_offsets[i + 1]] for i in range(len(w))]
    return prompts, outputs


@pytest.mark.parametrize("tier", VLLM_TIERS, ids=lambda t: "-".join(f"{v}" for v in t.values()))
def test_vllm_scheduler_one_request_at_a_time_is_the_sequential_replay(tier):
    """The connector scheduler, each request added when the engine is idle (offload.md §4), reports
    what the sequential replay does: the shortcut of running the tier after the GPU life holds."""
    w = workload(5)
    s = apc(24, **tier)
    seq = APCReference.for_workload(replace(s, offload=replace(s.offload, token_budget=64)), w)
    cols = seq.replay(w)
    sched = OffloadSchedSettings(num_gpu_blocks=24, block_size=16, max_num_batched_tokens=64, max_num_seqs=8,
                                 async_scheduling=False, offload=replace(s.offload, token_budget=64))
    engine = sched.engine(*per_request(w), loras=w.lora, salts=w.cache_salt)
    run_one_at_a_time(engine, len(w))
    served = ~cols.rejected
    np.testing.assert_array_equal(engine.result.rejected, cols.rejected)
    np.testing.assert_array_equal(engine.result.cached_tokens[served], cols.cached_tokens[served])
    run = engine.result.extra["offload"]
    for t in run.tiers():
        np.testing.assert_array_equal(run.by_tier[t][served], seq.tier.run().by_tier[t][served])


HICACHE = [("write_through", 1, 1.0), ("write_through_selective", 16, 1.5), ("write_back", 4, 0.7),
           ("write_back", 16, 2.0)]


@pytest.mark.parametrize("policy, page, ratio", HICACHE)
def test_hicache_tree_invariants_and_scheduler_one_at_a_time(policy, page, ratio):
    """After every request the tree's sizes add up (device and host); the scheduler fed one request
    at a time reports the sequential replay's cached tokens and host part."""
    w = workload(7 + page)
    options = SimOptions(max_total_tokens=256, page_size=page, extra={
        "offload": "hicache", "hicache_write_policy": policy, "hicache_ratio": ratio, "overlap": True,
        "chunked_prefill_size": 8192})
    s = RadixSettings.from_options(options)
    ref = RadixReference.for_workload(s, w)
    for i in range(len(w)):
        ref.serve_at(w, i)
        ref.tree.check()
        assert ref.tree.host_used <= s.hicache.host_tokens
    run = ref.tier_run()
    assert int(run.by_tier["cpu"].sum()) > 0 or policy == "write_through_selective"
    fast = RadixFast.for_workload(s, w)
    np.testing.assert_array_equal(fast.replay(w).cached_tokens, run.by_tier["gpu"] + run.by_tier["cpu"])
    sched = HiCacheSchedSettings(capacity=256, page_size=page, overlap=True, chunked_prefill_size=8192,
                                 max_running_requests=8, hicache=s.hicache)
    engine = sched.engine(*per_request(w), loras=w.lora, salts=w.cache_salt)
    run_one_at_a_time(engine, len(w))
    served = ~engine.result.rejected
    np.testing.assert_array_equal(engine.result.cached_tokens[served], (run.by_tier["gpu"] + run.by_tier["cpu"])[served])
    np.testing.assert_array_equal(engine.result.extra["offload"].by_tier["cpu"][served], run.by_tier["cpu"][served])


def test_a_loading_step_takes_the_transfer_time():
    """Timed: the step that loads lasts max(compute, bytes / link) (native), compute + transfer (LMCache)."""
    w = workload(5)
    for backend, overlap in (("native", True), ("lmcache", False)):
        extra = {"offload": backend, "offload_size": 800, "offload_bandwidth": 1.0}
        if backend == "lmcache":
            extra["lmcache_chunk_size"] = 16
        s = APCSettings.from_options(SimOptions(num_gpu_blocks=24, block_size=16, model="llama-3-8b", extra=extra))
        sched = OffloadSchedSettings(num_gpu_blocks=24, block_size=16, max_num_batched_tokens=64, max_num_seqs=8,
                                     async_scheduling=False, offload=s.offload)
        engine = sched.engine(*per_request(w))
        calls = []
        engine.on_batch = lambda step, reqs, new, ctx, dec, load_s=0.0, overlap=True: calls.append((load_s, overlap))
        run_one_at_a_time(engine, len(w))
        loads = [c for c in calls if c[0] > 0]
        assert loads and all(o is overlap for _, o in loads)
        loaded = int(engine.result.extra["offload"].by_tier["cpu"].sum())
        per_token = 2 * 32 * 8 * 128 * 2          # llama-3-8b: K and V, 32 layers, 8 KV heads of 128, bf16
        assert sum(t for t, _ in loads) == pytest.approx(loaded * per_token / 1e9)
