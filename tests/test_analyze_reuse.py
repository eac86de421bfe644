"""The prefix index: per-request reuse equals an obviously-correct slow model."""
from __future__ import annotations

import numpy as np
import pytest

from kvsim.analyze import reuse as R
from kvsim.io.trace.columns import Trace


def index_of(trace: Trace, salt: bool = True, lora: bool = True, outputs: bool = True) -> R.PrefixIndex:
    ext = R.output_extensions(trace) if outputs else (None, None)
    return R.build_prefix_index(trace.tokens, trace.offsets, R.namespace_roots(trace, salt, lora), *ext)


def random_prompts(rng: np.random.Generator, n: int, vocab: int = 4) -> list[np.ndarray]:
    """Prompts that often extend or cut earlier ones (a random prefix tree)."""
    prompts: list[np.ndarray] = []
    for _ in range(n):
        if prompts and rng.random() < 0.8:
            base = prompts[rng.integers(len(prompts))]
            cut = rng.integers(0, len(base) + 1)
            p = np.concatenate([base[:cut], rng.integers(0, vocab, rng.integers(0, 60))])
        else:
            p = rng.integers(0, vocab, rng.integers(0, 80))
        prompts.append(p.astype(np.int64))
    return prompts


@pytest.mark.parametrize("seed", range(12))
def test_reuse_equals_reference_model(seed):
    """Longest prefix of each prompt that an earlier request (same namespace) already had."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 50))
    prompts = random_prompts(rng, n)
    salts = [None if s == 0 else f"s{s}" for s in rng.integers(0, 3, n)] if seed % 3 == 0 else None
    outputs = [rng.integers(0, 4, rng.integers(1, 20)) for _ in range(n)] if seed % 2 else None
    trace = Trace.from_prompts(prompts, outputs=outputs, cache_salts=salts)
    idx = index_of(trace)
    roots = list(trace.cache_salt)
    ext = None if outputs is None else [o[:-1] for o in outputs]
    expected = R.reference_reuse(prompts, roots, ext)
    assert idx.reuse.tolist() == expected.tolist()
    # the source is the first request that had the reused prefix
    for i in range(n):
        r = int(idx.reuse[i])
        if r == 0:
            assert idx.source[i] == -1
            continue
        owners = [j for j in range(i) if roots[j] == roots[i]
                  and len(seq := (prompts[j] if ext is None else np.concatenate([prompts[j], ext[j]]))) >= r
                  and (seq[:r] == prompts[i][:r]).all()]
        assert idx.source[i] == owners[0]


def test_tables_grow(monkeypatch):
    """Tiny starting tables must grow without changing any answer."""
    monkeypatch.setattr(R, "_INITIAL_NODES", 8)
    monkeypatch.setattr(R, "_INITIAL_PARTIALS", 16)
    rng = np.random.default_rng(7)
    prompts = random_prompts(rng, 120, vocab=50)
    trace = Trace.from_prompts(prompts)
    assert index_of(trace).reuse.tolist() == R.reference_reuse(prompts).tolist()


def test_known_answers_at_block_edges():
    """Reuse ends exactly where the prompts differ, inside or at the edge of a 16-block."""
    a = np.arange(100, 140)                  # 40 tokens
    b = np.r_[a[:37], [1, 2, 3]]             # differs at 37 (inside block 2)
    c = np.r_[a[:32], [9] * 10]              # differs at 32 (a block edge)
    d = a[:16]                               # a prefix of a, one full block
    e = a.copy()                             # identical
    idx = index_of(Trace.from_prompts([a, b, c, d, e]))
    assert idx.reuse.tolist() == [0, 37, 32, 16, 40]
    assert idx.source.tolist() == [-1, 0, 0, 0, 0]


def test_namespaces_isolate_and_can_be_ignored():
    """A salt or an adapter is its own namespace; ignoring it shares across them."""
    p = list(range(50))
    trace = Trace.from_prompts([p, p, p, p], cache_salts=["t1", "t2", "t1", None], loras=[None, None, "a", None])
    assert index_of(trace).reuse.tolist() == [0, 0, 0, 0]
    assert index_of(trace, salt=False).reuse.tolist() == [0, 50, 0, 50]
    assert index_of(trace, lora=False).reuse.tolist() == [0, 0, 50, 0]
    assert index_of(trace, salt=False, lora=False).reuse.tolist() == [0, 50, 50, 50]


def test_logged_outputs_are_cached_except_the_last_token():
    """Turn 2 repeats prompt 1 + reply 1: all but the reply's last token was cached."""
    p1 = list(range(30))
    o1 = list(range(500, 520))
    p2 = p1 + o1 + [7, 7, 7]
    trace = Trace.from_prompts([p1, p2], outputs=[o1, None])
    assert index_of(trace).reuse.tolist() == [0, 30 + 20 - 1]
    assert index_of(trace, outputs=False).reuse.tolist() == [0, 30]


def test_block_tree_nodes():
    """Level 1 gives one node per distinct full 16-block, with its parent."""
    a = np.arange(48)
    b = np.r_[np.arange(32), np.arange(900, 916)]
    idx = index_of(Trace.from_prompts([a, b, a]))
    assert idx.num_nodes == 4          # a's 3 blocks + b's third block
    assert idx.node_parent[idx.ids[idx.blk_off[1] + 2]] == idx.ids[idx.blk_off[0] + 1]
    assert idx.node_first.tolist() == [0, 0, 0, 1]
