"""Reproduce the Mooncake FAST'25 "cache ratio" (Table 2: conversation 40%, synthetic 66%)
on the bundled copies of the released traces, and pin down which definition gives what.
(Run through the CLI: this is also the clean-report check for these two bundled traces.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.cli import run

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
def test_mooncake_cache_ratio(name, published, tmp_path, capsys):
    path = PUBLIC / name
    out = tmp_path / "report.json"
    assert run(["analyze", str(path), "--format", "mooncake", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "kvsim analyze:" in text and "Hash-id trace at its own 512-token blocks" in text
    report = json.loads(out.read_text())
    h = report["hash_native"]
    ref = reference_ratios(path)
    for key in ("token_weighted", "block_weighted", "request_weighted"):
        assert h[key] == pytest.approx(ref[key], abs=1e-12), key
    # 16-token APC blocks lose almost nothing on 512-token hash blocks
    assert report["bound"]["block16"] == pytest.approx(h["token_weighted"], abs=1e-3)
    if name.startswith("synthetic"):
        # the natural definition reproduces the paper within a point
        assert abs(h["token_weighted"] - published) < 0.01
    else:
        # token-weighted lands below 40%; excluding warm-up or weighting by request reaches it
        assert 0.36 < h["token_weighted"] < 0.38
        assert abs(h["after_warmup_token_weighted"] - published) < 0.005
        assert abs(h["request_weighted"] - published) < 0.01
