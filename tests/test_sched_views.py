"""The concurrent view's data: sequential vs concurrent hit rates, TTFT with and without caching, lpm vs fcfs."""
from __future__ import annotations

import numpy as np
import pytest

from kvsim.io.trace import Trace
from kvsim.replay.options import SimOptions
from kvsim.sched.settings import sglang_settings, vllm_budget_defaults, vllm_settings
from kvsim.sched.step_cost import step_cost
from kvsim.sched.views import concurrent_view


def shared_prefix_trace(gap: float, n: int = 40, seed: int = 0) -> Trace:
    """Requests over three 400-token system prompts, interleaved, ``gap`` seconds apart."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, 1000, 400) for _ in range(3)]
    prompts = [np.concatenate([systems[i % 3], rng.integers(0, 1000, 30)]) for i in range(n)]
    outputs = [rng.integers(0, 1000, 12) for _ in range(n)]
    return Trace.from_prompts(prompts, outputs=outputs, output_lengths=[12] * n, arrival=np.arange(n) * gap)


@pytest.mark.parametrize("policy", ["apc", "radix"])
def test_far_apart_arrivals_give_the_sequential_hit_rate(policy):
    """One request at a time under load is the sequential replay: the two hit rates agree."""
    view = concurrent_view(shared_prefix_trace(gap=1000.0), SimOptions(capacity_tokens=5000), policy)
    assert view.mode == "steps"
    assert view.concurrent_hit_rate == pytest.approx(view.sequential_hit_rate)
    assert view.sequential_hit_rate > 0.5


def test_a_burst_changes_the_hit_rate():
    """Forty requests at once: identical prefixes computed together share less than in sequence."""
    view = concurrent_view(shared_prefix_trace(gap=0.0), SimOptions(capacity_tokens=100_000), "radix")
    assert view.concurrent_hit_rate < view.sequential_hit_rate
    assert set(view.policy_hit_rates) == {"fcfs", "lpm"}


@pytest.mark.parametrize("policy", ["apc", "radix"])
def test_ttft_with_and_without_prefix_caching(policy):
    """With a step-cost model the view has both TTFT distributions, caching's lower."""
    cost = step_cost("llama-3-8b", "H100-80GB")
    view = concurrent_view(shared_prefix_trace(gap=0.2), SimOptions(capacity_tokens=50_000), policy, cost=cost)
    assert view.mode == "timed" and len(view.ttft_cached) == len(view.ttft_uncached) == 40
    assert np.median(view.ttft_cached) < np.median(view.ttft_uncached)


def test_no_timestamps_no_view():
    trace = Trace.from_prompts([[1, 2, 3]], output_lengths=[2])
    assert concurrent_view(trace, SimOptions(), "apc") is None


@pytest.mark.parametrize("gpu, expected", [("H100-80GB", (8192, 1024)), ("A100-80GB", (2048, 256)),
                                           ("B200", (16384, 1024)), (None, (2048, 256))])
def test_vllm_defaults_follow_the_gpu(gpu, expected):
    assert vllm_budget_defaults(gpu)[:2] == expected


def test_settings_take_the_replay_capacity_and_overrides():
    s, note = vllm_settings(SimOptions(num_gpu_blocks=1000, gpu="H100-80GB"), max_num_seqs=64)
    assert (s.num_gpu_blocks, s.max_num_batched_tokens, s.max_num_seqs) == (1000, 8192, 64)
    r, _ = sglang_settings(SimOptions(max_total_tokens=50_000, gpu="H100-80GB"))
    assert r.capacity == 50_000 and r.chunked_prefill_size == 8192
