"""In kind: llm-d's tiered CPU offloading guide (``docs/offload.md``), scaled down 10x.

A memory-bound load (45 groups whose shared prompts together outgrow the GPU's KV pool)
gains from a CPU tier: more cached tokens, lower TTFT; a compute-bound one (prompts whose
groups all fit on the GPU) does not change. Both engines, each of its tiers, the timed
replay (Llama-3-8B shape on an H100, roofline; the PCIe Gen5 link of kvsim/costs/links.py).
docs/offload.md runs the full-size workloads (30,000- and 8,000-token prompts).
"""
from __future__ import annotations

import pytest

from kvsim.drive.concurrent import ReplayMode, run_concurrent
from kvsim.engines.options import SimOptions
from kvsim.workloads.shared_prefix import trace as shared_prefix

GPU_TOKENS = 45_000        # one tenth of what the full-size run's H100 holds (~450,000 tokens)
TIERS = {"apc": ("native", "lmcache"), "radix": ("hicache",)}


def load(prompt_len: int):
    return shared_prefix(groups=45, prompts_per_group=4, system_prompt_len=prompt_len, question_len=64, output_len=16,
                         rate=4.0, seed=1)


def options(tier: str | None) -> SimOptions:
    extra = {} if tier is None else {"offload": tier, "offload_size": 200_000}
    if tier == "lmcache":
        extra["lmcache_chunk_size"] = 256
    return SimOptions(capacity_tokens=GPU_TOKENS, model="llama-3-8b", gpu="H100-80GB", extra=extra)


@pytest.fixture(scope="module")
def runs():
    out = {}
    for name, prompt_len in (("memory", 3_000), ("compute", 600)):
        trace = load(prompt_len)
        for policy, tiers in TIERS.items():
            for tier in tiers:
                r = run_concurrent(trace, [policy], options(tier), ReplayMode("timed"))[policy]
                out[name, policy, tier] = (trace, r)
    return out


@pytest.mark.parametrize("policy, tier", [(p, t) for p, ts in TIERS.items() for t in ts])
def test_memory_bound_the_tier_helps(runs, policy, tier):
    trace, r = runs["memory", policy, tier]
    o = r.steps.extra["offload"].summary(trace.prompt_lengths, ~r.steps.rejected)
    assert o["offloaded_hit_rate"] > 0.3                     # the CPU tier serves a third of the prompt tokens
    with_tier, without = r.timed.ttft[~r.steps.rejected].mean(), r.untiered.ttft[~r.steps.rejected].mean()
    assert with_tier < 0.75 * without, (with_tier, without)  # mean TTFT falls by more than a quarter


@pytest.mark.parametrize("policy, tier", [(p, t) for p, ts in TIERS.items() for t in ts])
def test_compute_bound_no_change(runs, policy, tier):
    trace, r = runs["compute", policy, tier]
    o = r.steps.extra["offload"].summary(trace.prompt_lengths, ~r.steps.rejected)
    assert o["offloaded_hit_tokens"] == 0 and o["notes"]     # "too small (or the GPU holds the reuse already)"
    served = ~r.steps.rejected
    assert (r.timed.ttft[served] == r.untiered.ttft[served]).all()
