"""The KV capacity for a share of the upper bound: one definition, shared by analyze and report."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvsim.analyze import AnalyzeOptions, analyze
from kvsim.io.trace.columns import Trace
from kvsim.drive.sequential import replay
from kvsim.engines.options import SimOptions

TRACES = Path(__file__).resolve().parents[1] / "traces"


def apc_cached(trace: Trace, capacity_tokens: float) -> int:
    """Prompt tokens an exact sequential APC replay serves from the cache (admitted requests)."""
    r = replay("apc", trace, SimOptions(capacity_tokens=capacity_tokens))
    return int(r.cached_tokens[~r.rejected].sum())


def test_capacity_keeps_the_share_in_an_exact_replay():
    """At the reported capacity an exact APC replay keeps >= X% of the unlimited cache's hits;
    one block less keeps fewer."""
    rng = np.random.default_rng(11)
    systems = [list(range(s * 1000, s * 1000 + 16 * int(rng.integers(2, 12)))) for s in range(6)]
    pick = rng.choice(6, size=60, p=[0.4, 0.25, 0.15, 0.1, 0.05, 0.05])
    prompts = [systems[k] + rng.integers(10**6, 2 * 10**6, 20).tolist() for k in pick]
    trace = Trace.from_prompts(prompts, output_lengths=[1] * len(prompts))
    rd = analyze(trace).reuse_distance[0]
    total = apc_cached(trace, float("inf"))
    assert rd["hit_tokens"] == total > 0
    assert [row["share_of_bound"] for row in rd["capacity"]] == [50, 80, 90, 99]
    for row in rd["capacity"]:
        need = row["share_of_bound"] / 100 * total
        assert apc_cached(trace, row["tokens"]) >= need
        assert apc_cached(trace, row["tokens"] - 16) < need


def test_analyze_and_report_give_the_same_capacity(tmp_path):
    """`kvsim analyze --json` and the report's key number read the KV for 90% of the bound off
    one pass, so they agree."""
    from kvsim.cli import run
    from kvsim.io.load import load_trace
    from kvsim.report import build_report

    log = TRACES / "support_chat.tokens.jsonl"
    out = tmp_path / "a.json"
    assert run(["analyze", str(log), "--json", str(out)]) == 0
    rows = {r["share_of_bound"]: r["tokens"] for r in json.loads(out.read_text())["reuse_distance"][0]["capacity"]}
    report = build_report(load_trace(log))
    assert report.numbers["target_share"] == 0.9
    assert rows[90] == report.numbers["capacity_for_target"]["apc"] > 0


def test_gib_with_a_model():
    p = list(range(64))
    report = analyze(Trace.from_prompts([p + [1], list(range(500, 600)), p + [2]]), AnalyzeOptions(model="llama-3-8b"))
    row = report.reuse_distance[0]["capacity"][0]
    # Llama-3-8B: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes = 131,072 bytes per token
    assert report.settings["kv_bytes_per_token"] == 131072
    assert row["gib"] == pytest.approx(row["tokens"] * 131072 / 2**30)


def test_hash_trace_adds_its_own_block_size(tmp_path):
    import kvsim

    path = tmp_path / "m.jsonl"
    rows = [(1024, [1, 2]), (1024, [1, 3]), (1100, [1, 2, 4])]
    path.write_text("".join(json.dumps({"timestamp": 0, "input_length": L, "output_length": 1, "hash_ids": ids})
                            + "\n" for L, ids in rows))
    rd = analyze(kvsim.load_trace(path, format="mooncake")).reuse_distance
    assert [r["block_size"] for r in rd] == [16, 512]
    # APC at 512-token blocks: request 2 hits block 1 (its last block is recomputed), request 3
    # blocks 1 and 2 (apc.md §2.2: at most floor((L-1)/B) blocks)
    assert rd[1]["hit_tokens"] == (1 + 2) * 512
