"""The recommendation follows the numbers: engine, block size, changes ranked by tokens."""
from __future__ import annotations

import numpy as np

from kvsim.analyze import analyze
from kvsim.io.trace.columns import Trace


def test_sharing_that_ends_inside_blocks_favours_radix():
    """Prompts share 12 tokens (less than a block) then differ: APC reuses nothing."""
    rng = np.random.default_rng(2)
    prompts = [list(range(12)) + rng.integers(10**5, 10**6, 30).tolist() for _ in range(40)]
    report = analyze(Trace.from_prompts(prompts))
    rec = report.recommendation
    assert report.bound["block16"] == 0 and report.bound["radix"] > 0.2
    assert rec["engine"] == "RadixAttention" and rec["size"] == 1
    assert rec["numbers"]["partial_block_loss_tokens"] == report.bound["radix_tokens"]


def test_block_aligned_sharing_favours_apc_and_a_large_block():
    """A 512-token system prompt and long unique questions: every size up to 512 loses nothing."""
    rng = np.random.default_rng(3)
    system = list(range(512))
    prompts = [system + rng.integers(10**5, 10**6, 100).tolist() for _ in range(20)]
    rec = analyze(Trace.from_prompts(prompts)).recommendation
    assert rec["engine"] == "APC" and rec["size"] == 512


def test_changes_are_ranked_and_computed():
    """Two salted tenants on one system prompt, and unsalted requests with a volatile id:
    both fixes appear, biggest first, each with its computed saving."""
    system = list(range(1000, 1600))
    other = list(range(3000, 3300))
    prompts, salts = [], []
    for i in range(8):
        prompts.append(system + [90_000 + i])
        salts.append(f"t{i % 2}")
    for i in range(10):
        prompts.append(other[:5] + [70_000 + 10 * i, 70_001 + 10 * i] + other[5:] + [91_000 + i])
        salts.append(None)
    report = analyze(Trace.from_prompts(prompts, cache_salts=salts))
    changes = report.recommendation["changes"]
    assert [c["tokens_saved"] for c in changes] == sorted((c["tokens_saved"] for c in changes), reverse=True)
    metric = "token" if report.recommendation["engine"] == "RadixAttention" else "block16"
    salt = next(c for c in changes if "cache salts" in c["change"])
    assert salt["tokens_saved"] == report.isolation["salts_ignored"][f"{metric}_cost_tokens"]
    assert report.isolation["salts_ignored"]["token_cost_tokens"] == 600   # one tenant's copy of the prompt
    move = next(c for c in changes if "volatile value at token 5" in c["change"])
    site = report.divergence["volatile"]["sites"][0]
    assert move["tokens_saved"] == site["moved_bound"][f"{metric}_gain_tokens"]
    assert site["moved_bound"]["token_gain_tokens"] == 9 * (300 - 5)
