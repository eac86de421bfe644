"""replay_radix: options, results and reports."""
from __future__ import annotations

import numpy as np
import pytest

from kvsim.errors import ConfigError
from kvsim.io.trace.columns import Trace
from kvsim.engines.options import SimOptions
from kvsim.engines.sglang.settings import RadixSettings, sglang_chunked_prefill_size
from kvsim.drive.sequential import replay
from tests.oracle.sglang_workloads import make_workload


@pytest.fixture(scope="module")
def trace() -> Trace:
    return make_workload(5, 300, sys_len=(10, 80), turn_len=(1, 40), out_len=(1, 20)).trace()


def test_engines_agree_and_result_fields(trace):
    opts = SimOptions(capacity_tokens=400, extra={"chunked_prefill_size": 64})
    fast = replay("radix", trace, opts)
    ref = replay("radix", trace, opts, implementation="reference")
    for col in ("cached_tokens", "rejected", "evictions", "evicted_tokens"):
        assert np.array_equal(getattr(fast, col), getattr(ref, col)), col
    assert fast.peak_used_tokens == ref.peak_used_tokens <= 400
    assert fast.extra["tree"] == ref.extra["tree"]
    assert fast.policy == "radix" and fast.capacity_tokens == 400 and fast.read_cache.all()
    assert fast.evictions.sum() > 0 and fast.evicted_tokens.sum() >= fast.evictions.sum()
    e = fast.extra
    assert (e["page_size"], e["eviction_policy"], e["max_total_tokens"]) == (1, "lru", 400)
    assert 1 <= e["tree"]["namespaces"] <= 9   # None plus (lora, salt) combinations
    ok = ~fast.rejected
    assert e["sglang_cached_token_sum"] == fast.cached_tokens[ok].sum()
    # sequential, no retraction: #new-token sums to the uncached prompt tokens
    assert e["sglang_new_token_sum"] == (trace.prompt_lengths - fast.cached_tokens)[ok].sum()
    assert e["sglang_logged_hit_rate"] == pytest.approx(e["sglang_prompt_hit_rate"])


def test_unlimited_never_evicts(trace):
    r = replay("radix", trace, SimOptions())
    assert r.capacity_tokens is None and r.evictions.sum() == 0 and not r.rejected.any()
    assert r.extra["tree"]["tokens"] == r.peak_used_tokens   # nothing freed, nothing running


def test_rejected_prompt_changes_nothing_and_replay_goes_on():
    t = Trace.from_prompts([[1, 2, 3, 4], list(range(10, 40)), [1, 2, 3, 4, 5]], output_lengths=[2, 2, 2])
    r = replay("radix", t, SimOptions(capacity_tokens=16))
    assert list(r.rejected) == [False, True, False]
    assert list(r.cached_tokens) == [0, 0, 4]


def test_page_size_and_capacity_units():
    t = Trace.from_prompts([list(range(40)), list(range(40)) + [7]], output_lengths=[3, 1])
    r = replay("radix", t, SimOptions(page_size=16, capacity_tokens=1000))
    assert r.capacity_tokens == 992           # floored to whole pages
    assert list(r.cached_tokens) == [0, 32]   # 40 - 1 -> page-floored; the reply is not a full page


def test_progress_reports_every_request(trace):
    seen = []
    replay("radix", trace, SimOptions(capacity_tokens=500), progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (len(trace), len(trace))
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


@pytest.mark.parametrize("extra, message", [
    ({"radix_tree": "nope"}, "unknown radix tree"),
    ({"finish": "eos"}, "unknown finish"),
    ({"eviction_amount": "all"}, "unknown eviction amount"),
    ({"chunked_prefill_size": 0}, "chunked prefill size"),
    ({"radix_tree": "classic", "tlru_threshold": 10}, None),
])
def test_bad_options_are_config_errors(trace, extra, message):
    opts = SimOptions(extra=extra, eviction_policy="tlru" if "tlru_threshold" in extra else "lru")
    with pytest.raises(ConfigError, match=message or "tlru"):
        replay("radix", trace, opts)


def test_unknown_policy_and_tlru_config():
    with pytest.raises(ConfigError, match="unknown radix eviction policy"):
        RadixSettings.from_options(SimOptions(eviction_policy="random"))
    with pytest.raises(ConfigError, match="threshold"):
        replay("radix", Trace.from_prompts([[1, 2]]), SimOptions(eviction_policy="tlru", extra={"tlru_threshold": 5,
                                                              "tlru_next_prompt_estimate": 9}))
    s = RadixSettings.from_options(SimOptions(eviction_policy="SLRU", extra={"slru_protected_threshold": 4}))
    assert (s.eviction_policy, s.policy_config) == ("slru", {"protected_threshold": 4})


def test_chunked_prefill_default_follows_the_gpu():
    assert sglang_chunked_prefill_size(None) == 4096
    assert sglang_chunked_prefill_size("H100-80GB") == 8192
    assert sglang_chunked_prefill_size("B200") == 16384
    assert RadixSettings.from_options(SimOptions(gpu="L4", model="llama-3-8b")).chunked_prefill_size == 4096
