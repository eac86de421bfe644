"""A small replay is served by the readable model (no compiled kernels to load at start-up):
it gives exactly what the fast engine gives, for every option that changes a replay."""
from __future__ import annotations

import json

import numpy as np
import pytest

import kvsim
from kvsim.drive.sequential import SMALL_REPLAY_TOKENS, replay, replay_detailed, small_replay
from kvsim.engines.options import SimOptions

FIELDS = ("cached_tokens", "rejected", "read_cache", "evictions", "evicted_tokens")


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """Shared prefixes, outputs, salts, adapters, a prompt-logprob request, one request too big."""
    rng = np.random.default_rng(5)
    system = rng.integers(0, 500, 90).tolist()
    lines = []
    for i in range(40):
        prompt = system[: int(rng.integers(0, 90))] + rng.integers(0, 500, int(rng.integers(1, 60))).tolist()
        rec = {"prompt_token_ids": prompt, "output_token_ids": rng.integers(0, 500, int(rng.integers(1, 20))).tolist()}
        if i % 7 == 3:
            rec["cache_salt"] = "s"
        if i % 11 == 5:
            rec["lora"] = "adapter"
        if i == 9:
            rec["prompt_logprobs"] = 1
        lines.append(rec)
    lines.append({"prompt_token_ids": list(range(900))})
    path = tmp_path_factory.mktemp("small") / "log.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    t = kvsim.load_trace(path)
    assert small_replay(t) and t.num_prompt_tokens < SMALL_REPLAY_TOKENS
    return t


@pytest.mark.parametrize("policy,options", [
    ("apc", SimOptions()), ("apc", SimOptions(capacity_tokens=400)),
    ("apc", SimOptions(capacity_tokens=640, block_size=4, engine_version="0.11")),
    ("radix", SimOptions()), ("radix", SimOptions(capacity_tokens=300)),
    ("radix", SimOptions(capacity_tokens=500, page_size=4, eviction_policy="lfu")),
])
def test_small_replay_equals_the_fast_engine(trace, policy, options):
    small = replay(policy, trace, options)
    fast = replay_detailed(policy, trace, options, implementation="fast")[0]
    for name in FIELDS:
        assert np.array_equal(getattr(small, name), getattr(fast, name)), name
    assert small.evictions.sum() > 0 or options.capacity_tokens is None
    assert (small.config, small.extra, small.capacity_tokens, small.peak_used_tokens) == \
        (fast.config, fast.extra, fast.capacity_tokens, fast.peak_used_tokens)
