"""Sequential APC replay: the fast engine equals the reference, sequential scenarios, options, errors."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "oracle"))
from vllm_workloads import Mix, random_trace

from kvsim.engines.vllm.metrics import CachingMetrics, PrefixCacheStats, sequential_hit_rate_figures
from kvsim.errors import ConfigError, KvsimError
from kvsim.io.trace.columns import Trace
from kvsim.drive.sequential import replay, replay_detailed
from kvsim.engines.options import SimOptions

C48 = [0] * 16 + [1] * 16 + [2] * 16


def both(trace: Trace, **kw):
    """Replay with both engines; they must agree on everything."""
    options = SimOptions(**kw)
    fast, fast_engine = replay_detailed("apc", trace, options, implementation="fast")
    ref, ref_engine = replay_detailed("apc", trace, options, implementation="reference")
    fast_final, ref_final = fast_engine.final_state(), ref_engine.final_state()
    for name in ("cached_tokens", "rejected", "read_cache", "evictions", "evicted_tokens"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(ref, name), err_msg=name)
    assert fast.peak_used_tokens == ref.peak_used_tokens and fast.capacity_tokens == ref.capacity_tokens
    assert fast_final == ref_final
    for key in ("peak_blocks_in_use", "evicted_blocks", "vllm_prefix_cache_queries", "vllm_prefix_cache_hits"):
        assert fast.extra[key] == ref.extra[key], key
    return fast, fast_final


CASES = [
    (1, 16, 60, "0.33", "fast"), (2, 16, 120, "0.11", "fast"), (3, 4, 200, "0.33", "sha256"),
    (4, 1, 900, "0.33", "fast"), (5, 32, 20, "0.11", "sha256_cbor"), (6, 16, None, "0.33", "fast"),
    (7, 8, 70, "0.33", "fast"), (8, 16, 40, "0.33", "fast"),
]


@pytest.mark.parametrize("seed, B, blocks, version, algo", CASES)
def test_fast_engine_equals_reference(seed, B, blocks, version, algo):
    trace = random_trace(seed, Mix(n=400, block_size=B, p_plp=0.1))
    kw = {"num_gpu_blocks": blocks} if blocks else {"capacity_tokens": math.inf}
    result, _ = both(trace, block_size=B, engine_version=version, hash_algo=algo, **kw)
    assert result.cached_tokens.sum() > 0
    if blocks:
        assert result.evictions.sum() > 0


def test_hash_algorithms_give_the_same_replay():
    """Only hash equality matters: fast, sha256 and sha256_cbor replay identically."""
    trace = random_trace(11, Mix(n=300))
    runs = [replay("apc", trace, SimOptions(num_gpu_blocks=80, hash_algo=a)) for a in ("fast", "sha256", "sha256_cbor")]
    for r in runs[1:]:
        np.testing.assert_array_equal(r.cached_tokens, runs[0].cached_tokens)
        np.testing.assert_array_equal(r.evictions, runs[0].evictions)


def _seq_trace(prompts, **kw):
    return Trace.from_prompts(prompts, output_lengths=[1] * len(prompts), **kw)


@pytest.mark.parametrize("version, queue", [("0.33", [1, 2, 3, 10, 9, 8, 7, 6, 5, 4]),
                                            ("0.11", [1, 2, 3, 6, 5, 4, 10, 9, 8, 7])])
def test_sequential_s1(version, queue):
    """S1's requests one at a time (one output token each), worked by hand from docs/engines/apc.md §3.5."""
    trace = _seq_trace([C48 + [3] * 7, C48 + [3] * 5, C48 + [3] * 6, [99] * 160])
    result, final = both(trace, num_gpu_blocks=11, engine_version=version)
    assert result.cached_tokens.tolist() == [0, 48, 48, 0]
    assert result.evictions.tolist() == [0, 0, 0, 3]  # r3 reuses the cached blocks 3, 2, 1
    assert final.free_queue == queue


def test_sequential_prompt_logprobs_s2():
    trace = _seq_trace([C48 + [3] * 7, C48 + [3] * 5, C48 + [3] * 6], prompt_logprobs=[True, False, True])
    result, final = both(trace, num_gpu_blocks=11)
    assert result.cached_tokens.tolist() == [0, 48, 0]
    assert result.read_cache.tolist() == [False, True, False]
    assert final.map_keys == 3 and final.cached_blocks == 6  # r2 wrote duplicates
    assert result.extra["vllm_prefix_cache_queries"] == 53  # only r1 is counted


def test_sequential_evict_s4_s5_s6():
    r = both(_seq_trace([list(range(87)), list(range(87, 135)), list(range(35))]), num_gpu_blocks=11)[0]
    assert r.cached_tokens.tolist() == [0, 0, 32]
    r = both(_seq_trace([list(range(16)), list(range(15))]), num_gpu_blocks=2)[0]
    assert r.cached_tokens.tolist() == [0, 0] and r.evictions.tolist() == [0, 1]
    r = both(_seq_trace([list(range(16)), list(range(16, 32)), list(range(32))]), num_gpu_blocks=3)[0]
    assert r.cached_tokens.tolist() == [0, 0, 16] and r.evictions.tolist() == [0, 0, 1]  # S6: hit 1 kept, 2 reused


def test_namespaces_isolate_salts_and_adapters():
    """S10: the same tokens share only within one (salt, adapter) namespace."""
    p = C48 + [3] * 11
    trace = _seq_trace([p] * 6, cache_salts=["s1", "s1", "s2", None, None, None],
                       loras=[None, None, None, None, "a", "a"])
    r = both(trace, num_gpu_blocks=100)[0]
    assert r.cached_tokens.tolist() == [0, 48, 0, 0, 0, 48]


def test_block_aligned_prompt_recomputes_its_last_block():
    """N = kB: cap (kB-1)//B = k-1 blocks (docs/engines/apc.md §2.2)."""
    trace = _seq_trace([list(range(32)), list(range(32)), list(range(33)), list(range(17)), [5]])
    r = both(trace, num_gpu_blocks=50)[0]
    assert r.cached_tokens.tolist() == [0, 16, 32, 16, 0]


def test_x1_x3_x4_decode_blocks_are_cached_except_the_last_token():
    """X1: 17x101 twice -> 16. X3: turn 2 = 100-token prompt + its 200 outputs -> 288.
    X4: 100 + 188 outputs: the 288th token is never computed -> a follow-up hits 272."""
    r = both(Trace.from_prompts([[101] * 17, [101] * 17], output_lengths=[5, 5]), num_gpu_blocks=20)[0]
    assert r.cached_tokens.tolist() == [0, 16]
    assert (r.extra["vllm_prefix_cache_queries"], r.extra["vllm_prefix_cache_hits"]) == (34, 16)
    rng = np.random.default_rng(0)
    firsts = [rng.integers(0, 10**6, 100).tolist() for _ in range(5)]
    outs = [rng.integers(0, 10**6, 200).tolist() for _ in range(5)]
    trace = Trace.from_prompts(firsts + [p + o for p, o in zip(firsts, outs)], outputs=outs + [[1]] * 5)
    r = both(trace, num_gpu_blocks=200)[0]
    assert r.cached_tokens.tolist() == [0] * 5 + [288] * 5
    out = list(range(500, 688))
    trace = Trace.from_prompts([[7] * 100, [7] * 100 + out + list(range(20))], outputs=[out, [1]])
    assert both(trace, num_gpu_blocks=100)[0].cached_tokens.tolist() == [0, 272]


def test_synthesized_outputs_match_nothing():
    """Outputs known only by length are distinct ids: a prompt cannot hit their blocks."""
    trace = Trace.from_prompts([[1] * 20, [1] * 20 + [-1] * 40], output_lengths=[40, 1])
    assert both(trace, num_gpu_blocks=100)[0].cached_tokens.tolist() == [0, 16]


def test_rejected_request_is_counted_and_leaves_the_cache_alone():
    """Peak footprint ceil((L + M - 1)/B) > N - 1 -> rejected; the replay goes on unchanged."""
    small, big = list(range(40)), list(range(1000, 1100))
    prompts = [small, big, small, [], small]
    trace = Trace.from_prompts(prompts, output_lengths=[1, 1, 1, 1, 30])
    r, final = both(trace, num_gpu_blocks=5)  # 4 usable blocks = 64 tokens
    assert r.rejected.tolist() == [False, True, False, True, True]  # 40+30-1 = 69 > 64
    assert r.cached_tokens.tolist() == [0, 0, 32, 0, 0] and r.evictions.sum() == 0
    without = replay_detailed("apc", trace.select([0, 2]), SimOptions(num_gpu_blocks=5))[1].final_state()
    assert final == without
    fits = Trace.from_prompts([list(range(40))], output_lengths=[25])  # 64 tokens: just fits
    assert not replay("apc", fits, SimOptions(num_gpu_blocks=5)).rejected[0]


def test_unlimited_capacity_is_the_upper_bound():
    trace = random_trace(3, Mix(n=500))
    unlimited = both(trace, capacity_tokens=math.inf)[0]
    assert unlimited.capacity_tokens is None and unlimited.evictions.sum() == 0
    assert not unlimited.rejected.any()
    for blocks in (40, 150, 600):
        finite = replay("apc", trace, SimOptions(num_gpu_blocks=blocks))
        ok = ~finite.rejected
        assert (finite.cached_tokens[ok] <= unlimited.cached_tokens[ok]).all()


def test_capacity_units_and_result_fields():
    trace = random_trace(4, Mix(n=200))
    r = replay("apc", trace, SimOptions(capacity_tokens=1000))
    assert r.extra["num_gpu_blocks"] == 1000 // 16 + 1 and r.capacity_tokens == 62 * 16
    assert r.policy == "apc" and len(r) == 200
    for key in ("block_size", "hash_algo", "engine_version", "peak_blocks_in_use", "evicted_blocks",
                "vllm_prefix_cache_queries", "vllm_prefix_cache_hits", "vllm_hit_rate_window"):
        assert key in r.extra
    assert r.extra["engine_version"] == "0.33" and r.extra["hash_algo"] == "fast"
    assert r.peak_used_tokens <= r.capacity_tokens
    np.testing.assert_array_equal(r.evicted_tokens, r.evictions * 16)
    assert r.extra["evicted_blocks"] == r.evictions.sum()
    assert replay("apc", trace, SimOptions(capacity_tokens=1000)).cached_tokens.tolist() == \
        r.cached_tokens.tolist()


def test_progress_reports_completion():
    calls = []
    replay("apc", random_trace(5, Mix(n=50)), SimOptions(num_gpu_blocks=60), progress=lambda d, t: calls.append((d, t)))
    assert calls and calls[-1] == (50, 50)


def test_vllm_hit_rate_window_follows_caching_metrics():
    rng = np.random.default_rng(1)
    q = rng.integers(1, 500, 2500)
    h = (q * rng.random(2500)).astype(int) // 16 * 16
    metrics = CachingMetrics()
    for qi, hi in zip(q, h):
        metrics.observe(PrefixCacheStats(requests=1, queries=int(qi), hits=int(hi)))
    fig = sequential_hit_rate_figures(q, h)
    assert fig["vllm_hit_rate_window"] == pytest.approx(metrics.hit_rate)
    assert fig["vllm_hit_rate_total"] == pytest.approx(h.sum() / q.sum())


@pytest.mark.parametrize("change, message", [
    ({"block_size": 0}, "block size"),
    ({"block_size": "x"}, "block size"),
    ({"capacity_tokens": "lots"}, "capacity"),
    ({"hash_algo": "md5"}, "hash algorithm"),
    ({"engine_version": "0.7"}, "engine-version"),
    ({"concurrency": 4}, "sequential"),
])
def test_bad_configurations_are_config_errors(change, message):
    options = SimOptions(capacity_tokens=1000)
    for k, v in change.items():
        setattr(options, k, v)
    with pytest.raises(ConfigError, match=message):
        replay("apc", random_trace(6, Mix(n=5)), options)


def test_bad_engine_and_length_only_trace():
    trace = random_trace(7, Mix(n=5))
    with pytest.raises(ConfigError, match="engine"):
        replay("apc", trace, SimOptions(), implementation="turbo")
    lengths_only = Trace(offsets=np.array([0, 10]), tokens=None, output_lengths=np.array([3]),
                         arrival=np.array([0.0]))
    with pytest.raises(KvsimError, match="prefix information"):
        replay("apc", lengths_only, SimOptions())


@pytest.mark.parametrize("algo", ["fast", "sha256"])
def test_fast_engine_serves_one_request_at_a_time_like_a_replay(algo):
    """APCFast.serve (one request per call, on a pool that lives across calls) gives the
    same per-request results and the same final pool as replaying the whole trace at once,
    and the reference model's serve agrees with both."""
    from kvsim.engines.vllm.sequential import APCFast
    from kvsim.engines.vllm.sequential import APCReference
    from kvsim.engines.vllm.settings import APCSettings
    from kvsim.drive.requests import workload

    trace = random_trace(21, Mix(n=300, p_plp=0.1))
    settings = APCSettings(block_size=16, num_gpu_blocks=90, hash_algo=algo)
    work = workload(trace)
    whole = APCFast(settings)
    cols = whole.replay(work)
    one, ref = APCFast(settings), APCReference(settings)
    served = [one.serve(req) for req in work]
    assert [s.cached_tokens for s in served] == cols.cached_tokens.tolist()
    assert [s.rejected for s in served] == cols.rejected.tolist()
    assert [s.evictions for s in served] == cols.evictions.tolist()
    assert one.final_state() == whole.final_state()
    assert [ref.serve(req) for req in work] == served
    assert ref.final_state() == whole.final_state() and cols.evictions.sum() > 0
