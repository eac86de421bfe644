"""The concurrent view's data: sequential vs concurrent hit rates, TTFT with and without caching, lpm vs fcfs."""
from __future__ import annotations

import numpy as np
import pytest

from kvsim.io.trace.columns import Trace
from kvsim.engines.options import SimOptions
from kvsim.engines.sglang.scheduler import sglang_settings
from kvsim.engines.vllm.scheduler import vllm_budget_defaults, vllm_settings
from kvsim.drive.step_cost import step_cost
from kvsim.drive.views import concurrent_view


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


def burst_log(block: int = 16) -> Trace:
    """Two requests over one 64-token prefix at t = 0, a third much later; 16-token tails, 4-token replies."""
    rng = np.random.default_rng(3)
    system = rng.integers(0, 1000, 64)
    prompts = [np.concatenate([system, rng.integers(1000, 2000, 16)]) for _ in range(3)]
    outputs = [rng.integers(2000, 3000, 4) for _ in range(3)]
    return Trace.from_prompts(prompts, outputs=outputs, output_lengths=[4] * 3, arrival=[0.0, 0.0, 1000.0])


@pytest.mark.parametrize("policy, concurrent_cached", [
    ("apc", 64 + 64),    # vLLM caches r0's blocks as they are allocated: r1 hits them in the same step
    ("radix", 0 + 64),   # SGLang inserts r0 after its prefill: r1, prefilled with it, hits nothing
])
def test_hit_rates_by_hand_on_a_burst(policy, concurrent_cached):
    """Sequential: r1 and r2 each hit the 64-token prefix (128 of 240 prompt tokens)."""
    view = concurrent_view(burst_log(), SimOptions(capacity_tokens=10_000), policy)
    assert view.sequential_hit_rate == pytest.approx(128 / 240)
    assert view.concurrent_hit_rate == pytest.approx(concurrent_cached / 240)
    assert (view.served, view.rejected, view.preemptions) == (3, 0, 0)


@pytest.mark.parametrize("policy", ["apc", "radix"])
def test_view_equals_the_scheduler_replays(policy):
    """Every number of the timed view is what kvsim.sched's replays give directly."""
    from kvsim.drive.requests import output_token_arrays
    from kvsim.drive.clock import Releases
    from kvsim.drive.timed import replay_timed, without_prefix_caching

    trace = shared_prefix_trace(gap=0.02, n=30)
    options = SimOptions(capacity_tokens=3000, gpu="H100-80GB")
    cost = step_cost("llama-3-8b", "H100-80GB")
    view = concurrent_view(trace, options, policy, cost=cost, speedup=2.0)
    out, off = output_token_arrays(trace)
    prompts = [trace.prompt(i) for i in range(len(trace))]
    outputs = [out[off[i]:off[i + 1]] for i in range(len(trace))]
    settings, _ = (vllm_settings if policy == "apc" else sglang_settings)(options)
    releases = Releases.logged(trace.arrival / 2.0)
    cached = replay_timed(settings, prompts, outputs, releases, cost)
    uncached = replay_timed(without_prefix_caching(settings), prompts, outputs, releases, cost)
    served = ~cached.steps.rejected
    rate = cached.steps.cached_tokens[served].sum() / trace.prompt_lengths[served].sum()
    assert view.concurrent_hit_rate == pytest.approx(rate)
    np.testing.assert_array_equal(view.ttft_cached, cached.ttft[served])
    np.testing.assert_array_equal(view.ttft_uncached, uncached.ttft[served])
    assert view.preemptions == cached.steps.preemptions[served].sum()
    if policy == "radix":
        import dataclasses

        lpm = replay_timed(dataclasses.replace(settings, schedule_policy="lpm"), prompts, outputs, releases, cost)
        assert view.policy_hit_rates["fcfs"] == pytest.approx(rate)        # SGLang 0.5.23's default
        assert view.policy_hit_rates["lpm"] == pytest.approx(
            lpm.steps.cached_tokens[served].sum() / trace.prompt_lengths[served].sum())


def test_a_warmup_window_leaves_the_first_requests_out():
    """Measured = requests 1 and 2 only: sequential 128 of 160 tokens, concurrent (radix) 64 of 160."""
    measured = np.array([False, True, True])
    view = concurrent_view(burst_log(), SimOptions(capacity_tokens=10_000), "radix", measured=measured)
    assert view.sequential_hit_rate == pytest.approx(128 / 160)
    assert view.concurrent_hit_rate == pytest.approx(64 / 160)


def test_concurrent_columns_of_a_sweep_row():
    """The sweep's row figures are the view's concurrent numbers."""
    from kvsim.drive.concurrent import ReplayMode
    from kvsim.drive.views import concurrent_columns

    cost = step_cost("llama-3-8b", "H100-80GB")
    trace = shared_prefix_trace(gap=0.05, n=20)
    options = SimOptions(capacity_tokens=4000)
    row = concurrent_columns(trace, options, "apc", ReplayMode("timed"), cost)
    view = concurrent_view(trace, options, "apc", cost=cost)
    assert row["concurrent_hit_rate"] == pytest.approx(view.concurrent_hit_rate)
    assert row["concurrent_preemptions"] == view.preemptions
    assert row["ttft_p90_s"] == pytest.approx(np.percentile(view.ttft_cached, 90))
