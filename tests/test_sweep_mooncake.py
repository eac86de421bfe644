"""Mooncake FAST'25 Fig. 9 on the released conversation and synthetic traces."""
from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import pytest

import kvsim
from kvsim.sweep.mooncake import (
    FIG9_CAPACITIES,
    FIG9_PUBLISHED,
    READ_TOLERANCE,
    fig9_table,
    markdown,
    trace_name,
)

TRACES = Path(__file__).resolve().parents[1] / "traces" / "public"


def trace_path(name: str) -> Path:
    path = TRACES / f"{name}_trace.jsonl"
    if not path.exists():
        pytest.skip(f"{path} is not in this checkout")
    return path


def lru_from_raw_hash_ids(path: Path, capacity_tokens: float) -> float:
    """Fig. 9's model straight from the file's hash_ids (not through kvsim's loader or hashing)."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    cache: OrderedDict = OrderedDict()
    blocks = int(capacity_tokens // 512)
    hit = total = 0
    for rec in records:
        ids, length = rec["hash_ids"], rec["input_length"]
        for j, h in enumerate(ids):
            if h not in cache:
                break
            hit += min(512, length - 512 * j)
        total += length
        for h in reversed(ids):  # tail first: a sequence's prefix is evicted last
            cache[h] = True
            cache.move_to_end(h)
        while len(cache) > blocks:
            cache.popitem(last=False)
    return hit / total


@pytest.fixture(scope="module")
def tables():
    out = {}
    for name in ("synthetic", "conversation"):
        path = trace_path(name)
        out[name] = (path, fig9_table(kvsim.load_trace(path, format="mooncake"), name, with_variants=False))
    return out


def test_synthetic_matches_the_published_curve(tables):
    _, t = tables["synthetic"]
    assert list(t["published"]) == list(FIG9_PUBLISHED["synthetic"])
    assert t["within"].all(), t[["capacity_tokens", "published", "kvsim"]]


def test_conversation_sits_below_the_published_curve_by_the_sample_gap(tables):
    """1e4 matches; above it kvsim is lower by about the gap between the released file's
    unlimited hit rate and the paper's Table 2 (40%), traces/README.md §5."""
    _, t = tables["conversation"]
    assert t["within"].iloc[0]
    gap = 0.40 - t.attrs["unlimited"]
    assert 0.02 < gap < 0.03
    for diff in t["diff"].iloc[1:]:
        assert -0.04 <= diff < -READ_TOLERANCE


@pytest.mark.slow
def test_one_pass_equals_a_direct_lru_on_the_raw_hash_ids(tables):
    path, t = tables["synthetic"]
    for cap, got in zip(FIG9_CAPACITIES, t["kvsim"]):
        assert got == pytest.approx(lru_from_raw_hash_ids(path, cap), abs=1e-12), cap


def test_markdown_and_names(tables):
    text = markdown({name: t for name, (_, t) in tables.items()})
    assert text.count("\n") == 2 + 2 * (len(FIG9_CAPACITIES) + 1) - 1
    assert "| synthetic | 1e6 | 0.150 |" in text
    assert trace_name("x/conversation_trace.jsonl") == "conversation"
    with pytest.raises(ValueError):
        trace_name("toolagent_trace.jsonl")
