"""The compiled block pool (``implementation="fast"``) equals the reference objects in the vLLM scheduler replay.

Seeded workloads that chunk, preempt (tight memory), run async and sync, use the priority
policy, the watermark, LoRA / cache-salt namespaces, prompt-logprob requests, exact sha256
keys, a model-length cap and prefix caching off: per request the same cached tokens, first-token and finish steps,
preemptions and rejections, the same number of steps, and the same free queue at the end
(block for block, in eviction order). The real vLLM scheduler is the oracle for both
(``test_sched_vllm_oracle.py``).
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "oracle"))
from sched_workloads import SchedMix, random_workload

from kvsim.errors import ConfigError
from kvsim.drive.clock import Releases, run
from kvsim.drive.timed import make_engine
from kvsim.engines.vllm.scheduler import VllmSchedSettings

SHORT = dict(system_len=(8, 60), user_len=(1, 40), output_len=(1, 60))
LONG = dict(system_len=(40, 300), user_len=(10, 200), output_len=(20, 120))

# (seed, workload knobs, block size, memory (x the largest request's blocks), settings)
CASES = [
    (31, {}, 16, 1.0, dict(max_num_batched_tokens=256, max_num_seqs=16, async_scheduling=False)),
    (32, {}, 16, 1.0, dict(max_num_batched_tokens=256, max_num_seqs=16, async_scheduling=True)),
    (33, LONG, 8, 1.2, dict(max_num_batched_tokens=128, max_num_seqs=32, long_prefill_token_threshold=32)),
    (34, dict(priorities=4, **LONG), 16, 1.0, dict(policy="priority", max_num_batched_tokens=256,
                                                   max_num_seqs=16)),
    (35, dict(p_namespace=0.6, p_session=0.6, p_logprob=0.2), 16, 1.5, dict(max_num_batched_tokens=256, max_num_seqs=16,
                                                              watermark=0.05)),
    (36, dict(p_namespace=0.5, **SHORT), 4, 1.0, dict(max_num_batched_tokens=64, max_num_seqs=8,
                                                      hash_algo="sha256", async_scheduling=False)),
    (37, dict(burst=(5, 40), gap=12.0), 16, 2.0, dict(max_num_batched_tokens=4096, max_num_seqs=256,
                                                      enable_chunked_prefill=False, max_model_len=4096)),
    (38, dict(p_repeat=0.4), 16, 1.0, dict(max_num_batched_tokens=256, max_num_seqs=16,
                                           enable_prefix_caching=False)),
    (39, LONG, 16, 1.0, dict(max_num_batched_tokens=128, max_num_seqs=16, reserve_full_isl=False,
                             max_model_len="longest prompt + 30")),
]


def _replay(w, settings):
    engine = make_engine(settings, w.prompts, w.outputs, w.priority, w.loras, w.salts, w.prompt_logprobs)
    steps, _ = run(engine, Releases.logged(w.arrival))
    return engine, steps


@pytest.mark.parametrize("seed, knobs, B, factor, extra", CASES, ids=[f"seed{c[0]}" for c in CASES])
def test_fast_pool_equals_reference(seed, knobs, B, factor, extra):
    w = random_workload(seed, SchedMix(n=150, **knobs))
    need = -(-w.peak_tokens() // B)
    if extra.get("max_model_len") == "longest prompt + 30":    # some replies stop at the cap
        extra = {**extra, "max_model_len": max(map(len, w.prompts)) + 30}
    settings = VllmSchedSettings(num_gpu_blocks=int(factor * int(need.max())) + 1, block_size=B, **extra)
    (ref, ref_steps), (fast, fast_steps) = (_replay(w, dataclasses.replace(settings, implementation=impl))
                                            for impl in ("reference", "fast"))
    assert fast_steps == ref_steps
    for field in ("rejected", "cached_tokens", "first_token_step", "finish_step", "preemptions", "output_tokens"):
        np.testing.assert_array_equal(getattr(fast.result, field), getattr(ref.result, field), err_msg=field)
    assert fast.scheduler.cache.free_block_ids() == ref.scheduler.cache.free_block_ids()
    # the workload exercises what it is meant to: hits (when caching), several requests at once
    served = ~ref.result.rejected
    assert (ref.result.cached_tokens[served].sum() > 0) == settings.enable_prefix_caching
    assert (ref.result.finish_step[served] - ref.result.first_token_step[served]).max() > 0


def test_tight_cases_preempt():
    """The memory-tight cases above really preempt (else they would not test recompute)."""
    seed, knobs, B, factor, extra = CASES[3]
    w = random_workload(seed, SchedMix(n=150, **knobs))
    need = -(-w.peak_tokens() // B)
    engine, _ = _replay(w, VllmSchedSettings(num_gpu_blocks=int(factor * int(need.max())) + 1, block_size=B,
                                             **extra))
    assert engine.result.preemptions.sum() > 0


def test_unknown_implementation_is_a_clear_error():
    with pytest.raises(ConfigError, match="implementation"):
        VllmSchedSettings(num_gpu_blocks=10, implementation="turbo")


@pytest.mark.parametrize("diverge_at", [0, 5, 16, 23, 40])
def test_block_keys_follow_the_sampled_tokens(diverge_at):
    """Keys hashed ahead from the planned outputs are used only while the sampled tokens
    follow the plan; after a different token they are those of the tokens really appended."""
    from kvsim.engines.vllm.scheduler import kv_cache_manager as make_kv_cache

    rng = np.random.default_rng(diverge_at)
    prompt, planned = rng.integers(0, 50, 37), rng.integers(0, 50, 45)
    sampled = planned.copy()
    sampled[diverge_at:] = rng.integers(50, 99, len(planned) - diverge_at)
    ref, fast = (make_kv_cache(impl, 64, 8) for impl in ("reference", "fast"))
    seqs = [cache.new_sequence("r", prompt, "adapter", "salt", outputs=planned) for cache in (ref, fast)]
    for k, token in enumerate(sampled.tolist()):
        if k == 30:             # a bulk append in the middle, as decode runs do
            for cache, seq in zip((ref, fast), seqs):
                cache.append_many(seq, sampled[30:38])
        if 30 <= k < 38:
            continue
        for cache, seq in zip((ref, fast), seqs):
            cache.append(seq, token)
        assert [int(h) for h in seqs[1].block_hashes] == [int(h) for h in seqs[0].block_hashes]
    assert len(seqs[1].block_hashes) == (len(prompt) + len(planned)) // 8
