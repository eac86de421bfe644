"""Shared-prefix structure: top shared prefixes, distinct system prompts, tree summary."""
from __future__ import annotations

import numpy as np

from kvsim.analyze import AnalyzeOptions, analyze
from kvsim.io.trace.columns import Trace
from tests.test_analyze_divergence import with_messages


def two_system_prompts() -> Trace:
    """S1 (100 tokens) in 6 requests, 4 of which add the same 40-token few-shot block;
    S2 (50 tokens) in 3 requests; every request ends with its own question."""
    s1 = list(range(1000, 1100))
    shots = list(range(3000, 3040))
    s2 = list(range(2000, 2050))
    prompts, starts = [], []
    for i in range(9):
        q = [50_000 + 100 * i + k for k in range(20)]
        if i < 6:
            sys = s1 + (shots if i < 4 else [])
        else:
            sys = s2
        prompts.append(sys + q)
        starts.append([0, len(sys)])
    trace = Trace.from_prompts(prompts, sessions=["a", "a", "b", "c", "d", "e", None, None, None])
    return with_messages(trace, starts, [["system", "user"]] * 9)


def test_top_shared_prefixes_exact_lengths_and_savings():
    report = analyze(two_system_prompts(), AnalyzeOptions(top=5))
    top = report.prefixes["top"]
    got = {(p["length"], p["requests"]): p for p in top}
    assert set(got) == {(140, 4), (100, 6), (50, 3)}
    assert got[(140, 4)]["tokens_saved"] == 3 * 140
    assert got[(100, 6)]["tokens_saved"] == 5 * 100
    assert got[(50, 3)]["tokens_saved"] == 2 * 50
    assert [p["tokens_saved"] for p in top] == sorted((p["tokens_saved"] for p in top), reverse=True)
    # the few-shot prefix extends the S1 prefix; sessions are counted per prefix
    ranks = {p["length"]: p["rank"] for p in top}
    assert got[(140, 4)]["extends"] == ranks[100]
    assert got[(140, 4)]["sessions"] == 3 and got[(100, 6)]["sessions"] == 5 and got[(50, 3)]["sessions"] == 0
    assert got[(100, 6)]["ends_in"] == {"message": 0, "role": "system", "offset_in_message": 99}
    # no raw text unless asked; ids are stable content hashes
    assert all("text" not in p for p in top)
    again = analyze(two_system_prompts(), AnalyzeOptions(top=5)).prefixes["top"]
    assert [p["id"] for p in again] == [p["id"] for p in top]


def test_distinct_system_prompts():
    sp = analyze(two_system_prompts()).prefixes["system_prompts"]
    # S1, S1 + few-shot and S2 are three different system messages
    assert sp["requests_with_system"] == 9 and sp["distinct"] == 3
    assert [x["requests"] for x in sp["top"]] == [4, 3, 2]
    assert sorted(x["length"] for x in sp["top"]) == [50, 100, 140]


def test_system_prompts_unknown_without_messages():
    assert analyze(Trace.from_prompts([[1, 2, 3]])).prefixes["system_prompts"] is None


def test_tree_summary():
    """Prompts A(32), A+B(16), A+C(16): 4 nodes, one branching node with 2 children."""
    a = list(range(32))
    report = analyze(Trace.from_prompts([a, a + list(range(100, 116)), a + list(range(200, 216))]))
    t = report.prefixes["tree"]
    assert t["nodes"] == 4 and t["distinct_first_blocks"] == 1
    assert t["branching_nodes"] == 1 and t["max_children"] == 2 and t["mean_children_at_branch"] == 2.0
    assert t["max_depth_tokens"] == 48 and t["leaves"] == 2


def test_nothing_shared():
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 10**6, 50).tolist() for _ in range(5)]
    assert analyze(Trace.from_prompts(prompts)).prefixes["top"] == []
