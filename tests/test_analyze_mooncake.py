"""Reproduce the Mooncake FAST'25 "cache ratio" (Table 2: conversation 40%, synthetic 66%)
on the bundled copies of the released traces, and pin down which definition gives what."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvsim
from kvsim.analyze import analyze

PUBLIC = Path(__file__).resolve().parents[1] / "traces" / "public"


def reference_ratios(path: Path) -> dict[str, float]:
    """Straight from the JSON, independent of kvsim: prefix-contiguous matching of hash ids
    against every earlier request, unlimited cache, the partial last block at its length."""
    seen: set[int] = set()
    tokens = hits = ids = ids_hit = 0
    per_request = []
    for line in path.open():
        row = json.loads(line)
        length, hash_ids = row["input_length"], row["hash_ids"]
        matched = 0
        for h in hash_ids:
            if h not in seen:
                break
            matched += 1
        hit = min(matched * 512, length)
        tokens += length
        hits += hit
        ids += len(hash_ids)
        ids_hit += matched
        per_request.append(hit / length)
        seen.update(hash_ids)
    return {"token_weighted": hits / tokens, "block_weighted": ids_hit / ids,
            "request_weighted": sum(per_request) / len(per_request)}


@pytest.mark.parametrize("name, published", [("conversation_trace.jsonl", 0.40), ("synthetic_trace.jsonl", 0.66)])
def test_mooncake_cache_ratio(name, published):
    path = PUBLIC / name
    report = analyze(kvsim.load_trace(path, format="mooncake"))
    h = report.hash_native
    ref = reference_ratios(path)
    for key in ("token_weighted", "block_weighted", "request_weighted"):
        assert h[key] == pytest.approx(ref[key], abs=1e-12), key
    # 16-token APC blocks lose almost nothing on 512-token hash blocks
    assert report.bound["block16"] == pytest.approx(h["token_weighted"], abs=1e-3)
    if name.startswith("synthetic"):
        # the natural definition reproduces the paper within a point
        assert abs(h["token_weighted"] - published) < 0.01
    else:
        # token-weighted lands below 40%; excluding warm-up or weighting by request reaches it
        assert 0.36 < h["token_weighted"] < 0.38
        assert abs(h["after_warmup_token_weighted"] - published) < 0.005
        assert abs(h["request_weighted"] - published) < 0.01
