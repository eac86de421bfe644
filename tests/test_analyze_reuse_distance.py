"""Reuse distance (LRU stack distances) and the capacity needed for a share of the bound."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from kvsim.analyze import AnalyzeOptions, analyze
from kvsim.analyze.reuse import build_prefix_index, namespace_roots
from kvsim.analyze.reuse_distance import block_accesses
from kvsim.io.trace import Trace
from kvsim.kernels.stack import stack_distances


def naive_distances(seq: list[int]) -> list[int]:
    """Distinct other ids since the previous access of the same id (-1 on first access)."""
    out = []
    for t, x in enumerate(seq):
        prev = max((p for p in range(t) if seq[p] == x), default=None)
        out.append(-1 if prev is None else len(set(seq[prev + 1:t])))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_stack_distances_match_naive(seed):
    rng = np.random.default_rng(seed)
    seq = rng.integers(0, 12, 200)
    assert stack_distances(seq.astype(np.int64), 12).tolist() == naive_distances(seq.tolist())


def lru_block_hits(trace: Trace, capacity_blocks: int) -> int:
    """A plain LRU over the 16-token block accesses: prompt blocks found in the cache."""
    idx = build_prefix_index(trace.tokens, trace.offsets, namespace_roots(trace))
    ids, in_prompt = block_accesses(idx, 16)
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for x, p in zip(ids.tolist(), in_prompt.tolist()):
        if x in cache:
            hits += p
            cache.move_to_end(x)
        else:
            cache[x] = None
            if len(cache) > capacity_blocks:
                cache.popitem(last=False)
    return hits


def test_capacity_captures_the_share_under_lru():
    """At the reported capacity an LRU cache keeps >= X% of the block hits; one block less does not."""
    rng = np.random.default_rng(11)
    systems = [list(range(s * 1000, s * 1000 + 16 * int(rng.integers(2, 12)))) for s in range(6)]
    pick = rng.choice(6, size=60, p=[0.4, 0.25, 0.15, 0.1, 0.05, 0.05])
    prompts = [systems[k] + rng.integers(10**6, 2 * 10**6, 20).tolist() for k in pick]
    trace = Trace.from_prompts(prompts)
    rd = analyze(trace).reuse_distance[0]
    total = rd["hit_blocks"]
    assert total == lru_block_hits(trace, 10**9)
    for row in rd["capacity"]:
        c = row["tokens"] // 16
        assert lru_block_hits(trace, c) >= row["share_of_bound"] / 100 * total
        assert lru_block_hits(trace, c - 1) < row["share_of_bound"] / 100 * total


def test_gib_with_a_model():
    p = list(range(64))
    report = analyze(Trace.from_prompts([p + [1], list(range(500, 600)), p + [2]]), AnalyzeOptions(model="llama-3-8b"))
    row = report.reuse_distance[0]["capacity"][0]
    # Llama-3-8B: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes = 131,072 bytes per token
    assert report.settings["kv_bytes_per_token"] == 131072
    assert row["gib"] == pytest.approx(row["tokens"] * 131072 / 2**30)
    # each of the 4 reused blocks was last used 9 distinct blocks earlier (the other 3 of its
    # own prompt and the 6 of the prompt in between), so LRU needs 10 blocks to keep it
    assert row["tokens"] == (9 + 1) * 16


def test_hash_trace_adds_its_own_block_size(tmp_path):
    import json

    import kvsim

    path = tmp_path / "m.jsonl"
    rows = [(1024, [1, 2]), (1024, [1, 3]), (1100, [1, 2, 4])]
    path.write_text("".join(json.dumps({"timestamp": 0, "input_length": L, "output_length": 1, "hash_ids": ids})
                            + "\n" for L, ids in rows))
    rd = analyze(kvsim.load_trace(path, format="mooncake")).reuse_distance
    assert [r["block_size"] for r in rd] == [16, 512]
    assert rd[1]["hit_blocks"] == 1 + 2
