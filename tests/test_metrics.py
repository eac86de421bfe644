"""Summary figures computed from a replay result (definitions in kvsim/drive/metrics.py)."""
import numpy as np
import pytest

from kvsim.io.trace.columns import Trace
from kvsim.drive.metrics import breakdown, per_request_frame, summarize
from kvsim.drive.result import ReplayResult


def _result(cached, rejected=None, read=None):
    n = len(cached)
    return ReplayResult(
        policy="apc", config={}, cached_tokens=np.array(cached),
        rejected=np.zeros(n, bool) if rejected is None else np.array(rejected),
        read_cache=np.ones(n, bool) if read is None else np.array(read),
        evictions=np.arange(n), evicted_tokens=np.arange(n) * 16, capacity_tokens=1000, peak_used_tokens=640)


@pytest.fixture
def trace():
    return Trace.from_prompts([[1] * 100, [2] * 50, [3] * 30, [4] * 20], output_lengths=[5, 0, 3, 2],
                              cache_salts=["a", "a", None, "b"], loras=[None, None, None, None])


def test_hit_rates_count_admitted_requests_only(trace):
    s = summarize(_result([64, 32, 0, 16], rejected=[False, False, False, True]), trace)
    assert s["admitted"] == 3 and s["rejected"] == 1
    assert s["prompt_tokens"] == 180 and s["cached_tokens"] == 96 and s["computed_tokens"] == 84
    assert s["token_hit_rate"] == pytest.approx(96 / 180)
    assert s["request_hit_rate"] == pytest.approx(2 / 3)
    assert s["mean_cached_fraction"] == pytest.approx((0.64 + 0.64 + 0) / 3)
    assert s["output_tokens"] == 5 + 1 + 3            # an engine always generates >= 1 token
    assert s["evictions"] == 0 + 1 + 2 + 3


def test_vllm_logged_rate_leaves_out_requests_that_skip_the_cache_read(trace):
    s = summarize(_result([64, 32, 0, 0], read=[True, False, True, True]), trace)
    assert s["vllm_logged_hit_rate"] == pytest.approx(64 / (100 + 30 + 20))
    assert s["token_hit_rate"] == pytest.approx(96 / 200)


def test_per_request_frame_is_in_input_order_with_required_fields(trace):
    f = per_request_frame(_result([64, 32, 0, 16], rejected=[False, False, False, True]), trace)
    assert list(f["index"]) == [0, 1, 2, 3]
    assert {"request_id", "prompt_tokens", "cached_tokens", "computed_tokens", "output_tokens"} <= set(f.columns)
    assert list(f["computed_tokens"]) == [36, 18, 30, 0]
    assert list(f["cache_salt"]) == ["a", "a", None, "b"]


def test_breakdown_groups_by_salt(trace):
    b = breakdown(_result([64, 32, 0, 16]), trace, "cache_salt")
    assert b.loc["a", "prompt_tokens"] == 150 and b.loc["a", "cached_tokens"] == 96
    assert b.loc["(none)", "token_hit_rate"] == 0
    assert b.loc["b", "token_hit_rate"] == pytest.approx(16 / 20)


def test_calibration_turns_saved_tokens_into_seconds(trace):
    class Linear:
        def prefill_seconds(self, new_tokens, context_tokens):
            return 0.001 + 1e-4 * new_tokens + 1e-7 * new_tokens * (context_tokens + new_tokens / 2)

    s = summarize(_result([64, 32, 0, 16]), trace, calibration=Linear())
    assert s["prefill_gpu_seconds_saved"] > 0
    assert s["prefill_gpu_seconds_without_cache"] > s["prefill_gpu_seconds_with_cache"]
