"""Upper bounds at token and block granularity, the recompute rule, hash-id conventions."""
from __future__ import annotations

import json

import numpy as np
import pytest

import kvsim
from kvsim.analyze import AnalyzeOptions, analyze
from kvsim.analyze.upper_bound import hit_tokens, native_hash_bound
from kvsim.io.trace.columns import Trace


@pytest.mark.parametrize("n, cached", [(17, 16), (32, 16), (33, 32), (48, 32), (100, 96), (300, 288)])
def test_apc_recompute_rule_examples(n, cached):
    """docs/engines/apc.md §2.2: a fully seen prompt of N tokens hits floor((N-1)/16) blocks."""
    got = hit_tokens(np.array([n]), np.array([n]), block=16, recompute=True)
    assert got.tolist() == [cached]


def test_radix_recompute_rule():
    """docs/engines/radix.md §2.1: at most L-1 tokens, paged floor((L-1)/p)*p."""
    r, L = np.array([20, 20, 19]), np.array([20, 40, 19])
    assert hit_tokens(r, L, 1, recompute=True).tolist() == [19, 20, 18]
    assert hit_tokens(r, L, 4, recompute=True).tolist() == [16, 20, 16]


def test_bounds_on_a_hand_built_log():
    """A: 40 tokens; B shares 37 of them then 10 new; C repeats A exactly."""
    a = list(range(100, 140))
    b = a[:37] + list(range(10))
    c = list(a)
    ub = analyze(Trace.from_prompts([a, b, c]), AnalyzeOptions(block_sizes=(16, 32, 64))).upper_bound
    total = 40 + 47 + 40
    assert ub["prompt_tokens"] == total
    assert ub["token"]["hit_tokens"] == 37 + 40
    assert ub["token"]["token_weighted"] == pytest.approx(77 / total)
    assert ub["token"]["request_weighted"] == pytest.approx((0 + 37 / 47 + 1) / 3)
    assert ub["token"]["hit_tokens_recompute"] == 37 + 39
    rows = {r["block_size"]: r for r in ub["blocks"]}
    assert rows[16]["hit_tokens"] == 32 + 32 and rows[16]["hit_tokens_recompute"] == 32 + 32
    assert rows[32]["hit_tokens"] == 32 + 32 and rows[32]["hit_tokens_recompute"] == 32 + 32
    assert rows[64]["hit_tokens"] == 0
    assert ub["fully_reused_requests"] == 1 and ub["requests_with_reuse"] == 2


def test_aligned_prompt_loses_its_last_block_to_recompute():
    p = list(range(64))
    ub = analyze(Trace.from_prompts([p, p]), AnalyzeOptions(block_sizes=(16,))).upper_bound
    assert ub["blocks"][0]["hit_tokens"] == 64
    assert ub["blocks"][0]["hit_tokens_recompute"] == 48


def write_mooncake(path, rows):
    path.write_text("".join(json.dumps({"timestamp": k, "input_length": L, "output_length": 5, "hash_ids": ids}) + "\n"
                            for k, (L, ids) in enumerate(rows)))
    return path


def test_mooncake_partial_block_convention(tmp_path):
    """Mooncake: the partial last block has an id; a match counts its real length."""
    path = write_mooncake(tmp_path / "m.jsonl", [(700, [1, 2]), (700, [1, 2]), (600, [1, 3])])
    trace = kvsim.load_trace(path, format="mooncake")
    report = analyze(trace)
    h = report.hash_native
    assert h["block_size"] == 512 and h["tail_has_id"]
    assert h["hit_tokens"] == 700 + 512
    assert h["token_weighted"] == pytest.approx((700 + 512) / 2000)
    assert h["block_weighted"] == pytest.approx(3 / 6)
    assert h["request_weighted"] == pytest.approx((0 + 1 + 512 / 600) / 3)
    assert h["after_warmup_token_weighted"] == pytest.approx((700 + 512) / 1300)
    # APC at 16-token blocks: the whole 700-token repeat minus the recomputed last token
    assert report.bound["block16_tokens"] == (699 // 16) * 16 + 512


def test_tail_without_id_never_counts():
    """kv-cache-tester: floor(L/B) ids; the tail has no id and matches nothing."""
    r = np.array([0, 128, 100])
    L = np.array([150, 150, 150])
    h = native_hash_bound(r, L, 64, tail_has_id=False)
    assert h["hit_tokens"] == 128 + 64
    assert h["ids"] == 6 and h["ids_hit"] == 2 + 1
