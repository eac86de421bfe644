"""The timed replay: the step-cost model against hand-computed rooflines, and latencies on small hand cases."""
from __future__ import annotations

import numpy as np
import pytest

from kvsim.errors import ConfigError
from kvsim.costs.calibration import Calibration
from kvsim.drive.clock import Releases
from kvsim.engines.sglang.scheduler import SglangSchedSettings
from kvsim.drive.step_cost import CalibratedStepCost, step_cost
from kvsim.drive.timed import compare_prefix_caching, replay_steps, replay_timed
from kvsim.engines.vllm.scheduler import VllmSchedSettings

# Llama-3-8B (32 layers, 32 heads, 8 KV heads, head_dim 128, hidden 4096, vocab 128256,
# 8.03e9 parameters, bf16) on an H100 SXM (989.4 TFLOP/s bf16 dense, 3.35 TB/s).
LINEAR = 8.03e9 - 2 * 128256 * 4096          # weights the tokens multiply (no embeddings)
ATTN_PER_PAIR = 4 * 32 * 32 * 128            # QK + PV FLOPs per (query, key) pair, all layers
LM_HEAD = 2 * 4096 * 128256                  # logits of one position
WEIGHT_BYTES = 8.03e9 * 2
KV_BYTES = 2 * 32 * 8 * 128 * 2              # K and V of one token, all layers: 131,072 bytes


def test_decode_step_is_memory_bound_by_the_weights():
    """One decode token after 1,000 cached: ~4.83 ms, the weights read at 3.35 TB/s."""
    cost = step_cost("llama-3-8b", "H100-80GB")
    flops = 2 * LINEAR + ATTN_PER_PAIR * (1000 + 1) + LM_HEAD
    nbytes = WEIGHT_BYTES + KV_BYTES * 1001 + KV_BYTES
    assert cost.flops([1], [1000]) == pytest.approx(flops)
    assert cost.bytes([1], [1000]) == pytest.approx(nbytes)
    assert cost.seconds([1], [1000]) == pytest.approx(nbytes / 3.35e12)
    assert cost.seconds([1], [1000]) == pytest.approx(4.8332e-3, rel=1e-4)


def test_prefill_step_is_compute_bound():
    """4,096 new tokens, no cache: FLOPs / 989.4 TFLOP/s (about 62 ms)."""
    cost = step_cost("llama-3-8b", "H100-80GB")
    n = 4096
    flops = 2 * LINEAR * n + ATTN_PER_PAIR * (n * (n + 1) / 2) + LM_HEAD
    assert cost.seconds([n], [0]) == pytest.approx(flops / 989.4e12)
    assert 0.060 < cost.seconds([n], [0]) < 0.064


def test_a_batch_shares_the_weight_read():
    """64 decodes in one step cost far less than 64 steps of one decode."""
    cost = step_cost("llama-3-8b", "H100-80GB")
    batch = cost.seconds([1] * 64, [1000] * 64)
    assert batch == pytest.approx((WEIGHT_BYTES + 64 * KV_BYTES * 1002) / 3.35e12)
    assert batch < 2 * cost.seconds([1], [1000])


def test_cached_prefix_saves_prefill_time():
    """Prefilling 96 new tokens after 4,000 cached is cheaper than all 4,096 from scratch."""
    cost = step_cost("llama-3-8b", "H100-80GB")
    assert cost.seconds([96], [4000]) < cost.seconds([4096], [0]) / 10


def test_calibrated_step_cost_sums_the_batch():
    c = Calibration("H100", "llama-3-8b", "bf16", fixed_s=1e-3, per_token_s=1e-5, per_context_token_s=1e-9)
    cost = CalibratedStepCost(c)
    pairs = 100 * 0 + 100 * 101 / 2 + 1 * 500 + 1
    assert cost.seconds([100, 1], [0, 500]) == pytest.approx(1e-3 + 1e-5 * 101 + 1e-9 * pairs)
    assert cost.seconds([], []) == 0.0


@pytest.mark.parametrize("kwargs", [dict(model="llama-3-8b"), dict(gpu="H100-80GB"),
                                    dict(model="llama-3-8b", gpu="L40S")])
def test_step_cost_needs_model_and_known_gpu(kwargs):
    with pytest.raises(ConfigError):
        step_cost(**kwargs)


class PerStep:
    """One second per step that computes anything."""

    def seconds(self, new, context) -> float:
        return 1.0 if len(new) else 0.0


def three_requests(arrival):
    prompts = [list(range(k * 100, k * 100 + 20)) for k in range(len(arrival))]
    return prompts, [[1, 2, 3]] * len(arrival), Releases.logged(np.asarray(arrival, float))


@pytest.mark.parametrize("settings", [VllmSchedSettings(num_gpu_blocks=64, async_scheduling=False),
                                      SglangSchedSettings(capacity=1024, overlap=False)],
                         ids=["vllm", "sglang"])
def test_latencies_of_a_lone_request(settings):
    """Released at 5 s into an idle engine: first token after one step, last after three."""
    prompts, outputs, releases = three_requests([5.0])
    r = replay_timed(settings, prompts, outputs, releases, PerStep())
    assert r.released.tolist() == [5.0]
    assert r.queueing.tolist() == [0.0]
    assert r.ttft.tolist() == [1.0] and r.e2e.tolist() == [3.0]
    assert r.prefill_tokens.tolist() == [20] and r.decode_tokens.tolist() == [2]
    assert r.busy_s == 3.0


@pytest.mark.parametrize("settings", [VllmSchedSettings(num_gpu_blocks=64, max_num_seqs=1, async_scheduling=False),
                                      SglangSchedSettings(capacity=1024, max_running_requests=1, overlap=False)],
                         ids=["vllm", "sglang"])
def test_queueing_behind_a_single_slot(settings):
    """One running slot, three requests at once: each waits for the ones before it."""
    prompts, outputs, releases = three_requests([0.0, 0.0, 0.0])
    r = replay_timed(settings, prompts, outputs, releases, PerStep())
    assert r.ttft[0] < r.ttft[1] < r.ttft[2]
    assert r.queueing[0] == 0.0 and r.queueing[1] >= 3.0 and r.queueing[2] >= r.queueing[1] + 3.0
    assert np.all(r.e2e >= r.ttft + 2.0)


@pytest.mark.parametrize("settings", [VllmSchedSettings(num_gpu_blocks=2000), SglangSchedSettings(capacity=40000)],
                         ids=["vllm", "sglang"])
def test_prefix_caching_lowers_ttft_on_the_same_load(settings):
    """Fifty requests sharing a 2,000-token prefix: cached prefill work and TTFT drop."""
    rng = np.random.default_rng(0)
    system = rng.integers(0, 1000, 2000)
    prompts = [np.concatenate([system, rng.integers(0, 1000, 100)]) for _ in range(50)]
    outputs = [rng.integers(0, 1000, 20) for _ in range(50)]
    with_cache, without = compare_prefix_caching(settings, prompts, outputs, Releases.logged(np.arange(50) * 0.5),
                                                 step_cost("llama-3-8b", "H100-80GB"))
    assert with_cache.steps.cached_tokens.sum() > 90_000 and without.steps.cached_tokens.sum() == 0
    assert with_cache.prefill_tokens.sum() < without.prefill_tokens.sum() / 5
    assert with_cache.summary()["ttft_p50_s"] < without.summary()["ttft_p50_s"] / 3


def test_closed_loop_releases_the_next_turn_after_the_reply_plus_think_time():
    """Turn 2 of a session logged 10 s after turn 1 waits for turn 1's reply, then 10 s."""
    prompts, outputs, _ = three_requests([0.0, 0.0, 0.0])
    releases = Releases.closed_loop(np.array([0.0, 10.0, 1.0]), np.array([7, 7, -1]))
    assert releases.after.tolist() == [-1, 0, -1] and releases.gap.tolist() == [0.0, 10.0, 0.0]
    r = replay_timed(VllmSchedSettings(num_gpu_blocks=64, async_scheduling=False), prompts, outputs, releases,
                     PerStep())
    assert r.released[1] == pytest.approx(r.released[0] + r.e2e[0] + 10.0)
    assert r.released[2] == 1.0


def test_closed_loop_on_the_step_clock():
    """On the step clock the next turn is released the step after the reply, plus the gap."""
    prompts, outputs, _ = three_requests([0, 0])
    releases = Releases.closed_loop(np.array([0, 4]), np.array([3, 3]))
    r = replay_steps(VllmSchedSettings(num_gpu_blocks=64, async_scheduling=False), prompts, outputs, releases)
    assert r.first_token_step[1] == r.finish_step[0] + 1 + 4


def test_timestamps_to_steps():
    """--arrival-from timestamp --step-seconds 0.5: steps counted from the first arrival."""
    assert Releases.steps_from_seconds([10.0, 10.4, 10.5, 13.0], 0.5).tolist() == [0, 0, 1, 6]
    with pytest.raises(ConfigError):
        Releases.steps_from_seconds([1.0, float("nan")], 0.5)
    with pytest.raises(ConfigError):
        Releases.steps_from_seconds([1.0], 0.0)


def test_step_seconds_is_the_roofline_of_flops_and_bytes():
    """The per-step fast path gives max(FLOPs / peak, bytes / bandwidth) of flops() and bytes()."""
    cost = step_cost("llama-3-8b", "H100-80GB")
    rng = np.random.default_rng(1)
    for size in (1, 3, 40):
        new, ctx = rng.integers(1, 3000, size).tolist(), rng.integers(0, 9000, size).tolist()
        expected = max(cost.flops(new, ctx) / 989.4e12, cost.bytes(new, ctx) / 3.35e12)
        assert cost.seconds(new, ctx) == pytest.approx(expected, rel=1e-12)
