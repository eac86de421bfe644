"""Hash-id traces: Mooncake (bundled copies) and kv-cache-tester, tokens synthesized from ids."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import kvsim
from kvsim.errors import InputError

PUBLIC = Path(__file__).resolve().parents[1] / "traces" / "public"


@pytest.fixture(scope="module")
def conversation():
    """The Mooncake conversation trace (145M synthesized tokens), loaded once."""
    return kvsim.load_trace(PUBLIC / "conversation_trace.jsonl")


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_conversation_trace_matches_the_published_table(conversation):
    t = conversation
    assert len(t) == 12_031
    assert round(float(t.prompt_lengths.mean()), 1) == 12_035.1
    assert round(float(t.output_lengths.mean()), 1) == 342.6
    assert t.meta.formats == ["mooncake"] and t.meta.hash_block_size == 512
    assert t.arrival[0] == 0 and round(float(t.arrival[-1])) == 3_537  # ms -> s
    assert t.tokens.dtype == np.int32  # ~4 bytes per token
    # blocks: ceil(L/512) per request; one token per block start identifies its id
    nblocks = -(-t.prompt_lengths // 512)
    assert int(nblocks.sum()) == 288_500
    starts = np.repeat(t.offsets[:-1], nblocks) + 512 * (np.arange(nblocks.sum())
                                                         - np.repeat(np.cumsum(nblocks) - nblocks, nblocks))
    assert np.unique(t.tokens[starts] // 512).size == 182_790
    # every conversation request starts with the same block (id 0)
    first = t.tokens[t.offsets[:-1, None] + np.arange(512)[None, :]]
    assert (first == first[0]).all()


def test_conversation_equal_ids_give_equal_blocks(conversation):
    """Compare the synthesized tokens with the raw hash ids, block by block, on the head."""
    t = conversation
    lines = (PUBLIC / "conversation_trace.jsonl").read_text().splitlines()[:300]
    block_of: dict[int, np.ndarray] = {}
    for i, line in enumerate(lines):
        rec = json.loads(line)
        p = t.prompt(i)
        assert len(p) == rec["input_length"]
        for j, h in enumerate(rec["hash_ids"]):
            blk = p[512 * j: 512 * (j + 1)]
            seen = block_of.get(h)
            if seen is None:
                block_of[h] = blk
            else:  # equal ids: equal tokens (a partial block equals the head of the full one)
                k = min(len(seen), len(blk))
                assert np.array_equal(seen[:k], blk[:k])
    heads = {int(b[0]) for b in block_of.values()}
    assert len(heads) == len(block_of)  # different ids: different tokens from the first one on


def test_synthetic_trace_counts():
    t = kvsim.load_trace(PUBLIC / "synthetic_trace.jsonl", limit=500)
    assert len(t) == 500
    full = [json.loads(x) for x in (PUBLIC / "synthetic_trace.jsonl").read_text().splitlines()]
    assert len(full) == 3_993
    assert round(sum(r["input_length"] for r in full) / len(full), 1) == 15_325.5
    assert t.prompt_lengths.tolist() == [r["input_length"] for r in full[:500]]


def test_partial_last_block_has_its_real_length(tmp_path):
    log = write_jsonl(tmp_path / "m.jsonl", [
        {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [7, 9]},
        {"timestamp": 10, "input_length": 1024, "output_length": 5, "hash_ids": [7, 9]},
        {"timestamp": 20, "input_length": 700, "output_length": 5, "hash_ids": [7, 10]},
        {"timestamp": 30, "input_length": 5, "output_length": 1, "hash_ids": [11]},
    ])
    t = kvsim.load_trace(log)
    a, b, c, d = (t.prompt(i) for i in range(4))
    assert t.prompt_lengths.tolist() == [600, 1024, 700, 5]
    assert np.array_equal(b[:600], a)                 # same ids: a is a prefix of b
    assert np.array_equal(c[:512], a[:512]) and c[512] != a[512]
    assert not np.isin(d, np.concatenate([a, b, c])).any()
    assert t.arrival.tolist() == [0.0, 0.01, 0.02, 0.03]


def test_block_size_option_and_id_count_check(tmp_path):
    log = write_jsonl(tmp_path / "m.jsonl", [{"input_length": 100, "output_length": 1, "hash_ids": [1, 2]}])
    with pytest.raises(InputError, match=r"m.jsonl:1: 2 hash_ids for input_length 100, expected ceil\(100/512\) = 1"):
        kvsim.load_trace(log)
    t = kvsim.load_trace(log, trace_block_size=64)
    assert t.meta.hash_block_size == 64 and len(t.prompt(0)) == 100


def test_two_files_do_not_share_blocks(tmp_path):
    """Ids are local to a file: the same id in two files gives different tokens."""
    rec = {"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [0]}
    a, b = write_jsonl(tmp_path / "a.jsonl", [rec, rec]), write_jsonl(tmp_path / "b.jsonl", [rec])
    t = kvsim.load_trace([a, b])
    assert np.array_equal(t.prompt(0), t.prompt(1))
    assert not np.isin(t.prompt(2), t.prompt(0)).any()
    assert t.meta.source_requests == [2, 1]


def _infinite_cache_hit_rate(t, B: int) -> float:
    """Prefix-contiguous, token-weighted hit rate with an unlimited cache of B-token blocks."""
    seen: set = set()
    hit = total = 0
    for i in range(len(t)):
        p = t.prompt(i)
        prev, k, matching = 0, 0, True
        for j in range(len(p) // B):
            prev = hash((prev, p[j * B:(j + 1) * B].tobytes()))
            if matching and prev in seen:
                k += 1
            else:
                matching = False
                seen.add(prev)
        hit += min(B * k, len(p))
        total += len(p)
    return hit / total


@pytest.mark.parametrize("name,requests,tokens,rate", [
    ("trace_0001.json", 41, 4_873_373, 0.933),
    ("trace_0002.json", 33, None, 0.934),
])
def test_kvcache_tester_traces(name, requests, tokens, rate):
    """Counts, and the infinite-cache hit rate published with the sample, from our tokens."""
    path = PUBLIC / "kv-cache-tester" / name
    doc = json.loads(path.read_text())
    t = kvsim.load_trace(path)
    assert t.meta.formats == ["kvcache-tester"] and t.meta.hash_block_size == 64
    assert len(t) == requests
    assert t.prompt_lengths.tolist() == [r["in"] for r in doc["requests"]]
    assert t.output_lengths.tolist() == [r["out"] for r in doc["requests"]]
    assert t.arrival.tolist() == [float(r["t"]) for r in doc["requests"]]
    if tokens is not None:
        assert t.num_prompt_tokens == tokens == doc["totals"]["parent_tokens"]["input"]
    assert t.session_names == [doc["id"]] and (t.session == 0).all()
    assert round(_infinite_cache_hit_rate(t, 64), 3) == rate


def test_kvcache_tester_tail_matches_nothing_and_subagents(tmp_path):
    doc = {"id": "x", "block_size": 4, "hash_id_scope": "local", "requests": [
        {"t": 0.0, "type": "n", "in": 10, "out": 3, "hash_ids": [1, 2]},
        {"t": 5.0, "type": "subagent", "agent_id": "agent_001", "requests": [
            {"t": 1.0, "type": "n", "in": 4, "out": 1, "hash_ids": [1]}]},
        {"t": 9.0, "type": "n", "in": 10, "out": 3, "hash_ids": [1, 2]},
    ]}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    t = kvsim.load_trace(path, format="kvcache-tester")
    assert len(t) == 2 and any("1 sub-agent record" in n for n in t.meta.notes)
    a, b = t.prompt(0), t.prompt(1)
    assert np.array_equal(a[:8], b[:8])                # the two full blocks
    assert not np.isin(a[8:], b).any() and not np.isin(b[8:], a).any()  # tails match nothing
    sub = kvsim.load_trace(path, reader_options={"subagents": True})
    assert len(sub) == 3 and sub.arrival.tolist() == [0.0, 6.0, 9.0]
    assert np.array_equal(sub.prompt(1), a[:4])        # shared hash namespace with the parent
    assert sub.session_names == ["x", "x/agent_001"]


def test_kvcache_tester_wrong_id_count(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"block_size": 64, "requests": [{"t": 0, "in": 130, "out": 1, "hash_ids": [1]}]}))
    with pytest.raises(InputError, match=r"floor\(130/64\) = 2"):
        kvsim.load_trace(path)
