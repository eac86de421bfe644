"""The offline optimum (``kvsim.sweep.optimal``): brute force, hand cases, and the engines.

- Brute force: on small random logs, every feasible cache content after every request is
  enumerated (``optimal_brute.py``, written from the model's definition) and the best
  schedule must equal the optimum (or lie within its bracket when partial blocks weigh
  less), at every capacity.
- Hand cases with answers worked out in the comments.
- The optimum bounds every engine: no exact replay of vLLM APC or SGLang radix beats it,
  at any capacity, with or without a warm-up window.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvsim.errors import ConfigError
from kvsim.io.trace.columns import Trace
from kvsim.drive.sequential import replay
from kvsim.engines.options import SimOptions
from kvsim.sweep.optimal import apc_optimal, block_optimal, optimal_model, radix_optimal
from kvsim.sweep.packing import seg_add, seg_min, seg_new
from kvsim.sweep.prefix_trie import PrefixTrie
from kvsim.warmup import measured_mask
from optimal_brute import apc_requests, block_requests, brute_force, radix_requests

# -- the building blocks -------------------------------------------------------------------

def test_segment_tree_matches_a_plain_array():
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 7, 16, 33):
        vals = rng.integers(-5, 20, n).astype(np.int64)
        size, h, t, d = seg_new(vals)
        for _ in range(300):
            lo = int(rng.integers(n))
            hi = int(rng.integers(lo, n))
            if rng.random() < 0.5:
                v = int(rng.integers(-4, 5))
                seg_add(t, d, size, h, lo, hi, v)
                vals[lo:hi + 1] += v
            else:
                assert seg_min(t, d, size, h, lo, hi) == vals[lo:hi + 1].min()


def _lcp(a: list, b: list) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def test_trie_paths_are_whole_nodes_shared_exactly_by_common_prefixes():
    """Every chain is a run of whole nodes from 0 to its length, and a node lies on two
    chains exactly when their common prefix (same namespace) reaches its end."""
    rng = np.random.default_rng(1)
    chains = []
    for _ in range(80):
        base = list(chains[rng.integers(len(chains))][: rng.integers(0, 12)]) if chains and rng.random() < 0.7 else []
        chains.append(base + list(rng.integers(0, 3, rng.integers(0, 6))))
    W = np.array([len(c) for c in chains], np.int64)
    ns = rng.integers(0, 2, len(chains))
    off = np.zeros(len(chains) + 1, np.int64)
    off[1:] = np.cumsum(W)
    toks = np.array([t for c in chains for t in c], np.int64)
    trie = PrefixTrie.build(toks, off, np.zeros(0, np.int64), np.zeros(len(chains) + 1, np.int64), W, ns)
    # cut some chains shorter later: the cut becomes a boundary without changing anything else
    cut_r = [r for r in range(len(chains)) if W[r] > 2][:10]
    trie.split_at(np.array(cut_r), W[cut_r] - 1)
    for r, c in enumerate(chains):
        nodes = trie.path(r)
        ends = [int(trie.d1[x]) for x in nodes]
        assert [int(trie.d0[x]) for x in nodes] == ([0] + ends[:-1] if ends else [])
        assert (ends[-1] if ends else 0) == len(c)
        if r in cut_r:
            assert len(c) - 1 in ends
        for q, other in enumerate(chains):
            shared = set(nodes.tolist()) & set(trie.path(q).tolist())
            reach = _lcp(c, other) if ns[r] == ns[q] else 0
            assert shared == {x for x in nodes.tolist() if trie.d1[x] <= reach}


# -- brute force ---------------------------------------------------------------------------

@st.composite
def small_logs(draw, max_requests: int = 5, max_len: int = 4):
    """Few requests over a 3-token alphabet, built as extensions of earlier prompts (and of
    earlier prompts + replies), so chains share prefixes and outputs get re-used."""
    n = draw(st.integers(1, max_requests))
    prompts, outputs = [], []
    for _ in range(n):
        if prompts and draw(st.booleans()):
            j = draw(st.integers(0, len(prompts) - 1))
            src = prompts[j] + (outputs[j] or [])
            base = src[: draw(st.integers(0, len(src)))]
        else:
            base = []
        p = (base + draw(st.lists(st.integers(1, 3), max_size=max_len)))[:max_len]
        if not p:
            p = [draw(st.integers(1, 3))]
        prompts.append(p)
        outputs.append(draw(st.one_of(st.none(), st.lists(st.integers(1, 3), min_size=1, max_size=2))))
    salts = draw(st.lists(st.sampled_from([None, None, "s"]), min_size=n, max_size=n))
    logprobs = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    # SGLang logprob starts: none, inside the prompt, or past it (the request is refused)
    starts = [draw(st.sampled_from([-1, -1, 0, 1, 2, len(p) + 1])) if lp else -1 for lp, p in zip(logprobs, prompts)]
    return Trace.from_prompts(prompts, outputs=outputs, cache_salts=salts, prompt_logprobs=logprobs,
                              logprob_start_len=starts)


_BRUTE = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_BRUTE
@given(small_logs(), st.sampled_from([1, 2]), st.sampled_from([0.0, 0.4]))
def test_apc_optimum_equals_brute_force(trace, block, warmup):
    model = apc_optimal(trace, block, warmup=warmup)
    measured = measured_mask(len(trace), warmup)
    for K in range(0, 7):
        got = model.at(K * block)
        assert got.hit_tokens == got.upper_tokens
        assert got.hit_tokens == brute_force(apc_requests(trace, block, K, measured), K, resident=True), K


@_BRUTE
@given(small_logs(), st.sampled_from([1, 2]))
def test_radix_optimum_equals_brute_force(trace, page):
    model = radix_optimal(trace, page)
    measured = measured_mask(len(trace), 0)
    for K in range(0, 9):
        got = model.at(K * page)
        assert got.hit_tokens == brute_force(radix_requests(trace, page, K, measured), K, resident=True), K


@_BRUTE
@given(small_logs(max_requests=5, max_len=4), st.sampled_from([1, 2, 3]), st.sampled_from(["weighted", "drop"]))
def test_block_optimum_equals_brute_force(trace, block, tail):
    """Exact when every block is full; with partial blocks the brute-force optimum lies in
    the reported bracket."""
    model = block_optimal(trace, block, tail=tail)
    measured = measured_mask(len(trace), 0)
    for K in range(0, 6):
        got = model.at(K * block)
        best = brute_force(block_requests(trace, block, measured, tail), K, resident=False)
        assert got.hit_tokens <= best <= got.upper_tokens, K
        if model.exact:
            assert got.hit_tokens == best


# -- hand cases ----------------------------------------------------------------------------

def test_apc_same_prompt_three_times():
    """[1..5] three times, B=2, one output token: each request writes floor(5/2)=2 blocks,
    may read floor(4/2)=2, holds ceil(5/2)=3. With 3 usable blocks the second and third
    requests hit 4 tokens each: 8/15. With 2 nothing fits (all rejected: rate 0)."""
    tr = Trace.from_prompts([[1, 2, 3, 4, 5]] * 3, output_lengths=[1, 1, 1])
    m = apc_optimal(tr, 2)
    assert m.at(6).hit_rate == pytest.approx(8 / 15)
    assert m.at(6).admitted == 3
    assert m.at(4).admitted == 0 and m.at(4).hit_rate == 0.0


def test_apc_belady_choice_between_two_prefixes():
    """Two system prompts A = [1, 1] and B = [2, 2], each request ends with its own token;
    B=1, one output token: a request writes 3 blocks, may read 2 and holds 3 while it runs.
    Order A B A A B. With 5 usable blocks, 2 blocks of room are left during each request:
    r3 re-uses A kept through r2 (2), r4 re-uses A from r3 (adjacent, free: 2), r5 re-uses
    B kept through r3 and r4 (2): 6. With 4, one block of room: 1 + 2 + 1 = 4."""
    A, B = [1, 1], [2, 2]
    prompts = [A + [10], B + [11], A + [12], A + [13], B + [14]]
    tr = Trace.from_prompts(prompts, output_lengths=[1] * 5)
    assert apc_optimal(tr, 1).at(5).hit_tokens == 6
    assert apc_optimal(tr, 1).at(4).hit_tokens == 4


def test_keeping_a_deeper_block_never_beats_keeping_its_prefix():
    """The prefix rule: a block only hits with its whole prefix. Storage model, K=1:
    [A B] then [C] then [A B]: keeping A gives 1 hit at r3 (B is not cached); keeping B
    gives nothing (A is missing). Optimum 1 block = B tokens."""
    tr = Trace.from_prompts([[1, 2], [3], [1, 2]])
    assert block_optimal(tr, 1, tail="drop").at(1).hit_tokens == 1
    assert block_optimal(tr, 1, tail="drop").at(2).hit_tokens == 2


def test_namespaces_never_share_and_unlimited_is_the_reuse_bound():
    tr = Trace.from_prompts([[1, 2, 3, 4, 5]] * 2, cache_salts=["a", "b"])
    assert apc_optimal(tr, 2).at(math.inf).hit_tokens == 0
    tr = Trace.from_prompts([[1, 2, 3, 4, 5]] * 2, loras=["x", None])
    assert radix_optimal(tr, 1).at(None).hit_tokens == 0
    tr = Trace.from_prompts([[1, 2, 3, 4, 5]] * 2)
    assert radix_optimal(tr, 1).at(None).hit_tokens == 4     # len-1 rule
    assert block_optimal(tr, 2).at(None).hit_tokens == 5     # no recompute, partial block by length


def test_warmup_requests_fill_but_do_not_count():
    tr = Trace.from_prompts([[1, 2, 3, 4, 5]] * 4, output_lengths=[1] * 4)
    full = apc_optimal(tr, 1).at(math.inf)
    half = apc_optimal(tr, 1, warmup=0.5).at(math.inf)
    assert (full.hit_tokens, full.measured_tokens) == (12, 20)
    assert (half.hit_tokens, half.measured_tokens) == (8, 10)
    assert apc_optimal(tr, 1, warmup=3).at(math.inf).measured_tokens == 5


def test_bad_settings_are_config_errors():
    tr = Trace.from_prompts([[1, 2, 3]])
    with pytest.raises(ConfigError):
        optimal_model(tr, "lfu")
    with pytest.raises(ConfigError):
        apc_optimal(tr, 0)
    with pytest.raises(ConfigError):
        block_optimal(tr, 2, tail="cut")
    with pytest.raises(ConfigError):
        radix_optimal(tr, 16, chunked_prefill_size=8)


# -- the optimum bounds the engines ------------------------------------------------------------

def _engine_hits(result, trace: Trace, measured: np.ndarray) -> tuple[int, int]:
    ok = ~result.rejected & measured
    return int(result.cached_tokens[ok].sum()), int(trace.prompt_lengths[ok].sum())


@st.composite
def chat_logs(draw):
    """Multi-turn sessions and shared system prompts with random lengths (30-80 requests)."""
    seed = draw(st.integers(0, 10_000))
    rng = np.random.default_rng(seed)
    systems = [list(rng.integers(0, 30, rng.integers(1, 40))) for _ in range(3)]
    n = int(rng.integers(30, 80))
    prompts, outputs, salts = [], [], []
    for _ in range(n):
        if prompts and rng.random() < 0.5:
            j = int(rng.integers(len(prompts)))
            p = prompts[j] + (outputs[j] or []) + list(rng.integers(0, 30, rng.integers(1, 20)))
        else:
            p = list(systems[rng.integers(3)]) + list(rng.integers(0, 30, rng.integers(0, 25)))
        prompts.append(p[:200])
        outputs.append(list(rng.integers(0, 30, rng.integers(1, 15))) if rng.random() < 0.7 else None)
        salts.append("t" if rng.random() < 0.15 else None)
    logprobs = (rng.random(n) < 0.05).tolist()
    # SGLang logprob starts: inside the prompt, or past it (refused, run as a placeholder)
    starts = [int(rng.choice([0, len(p) // 2, len(p) + 3])) if lp else -1 for lp, p in zip(logprobs, prompts)]
    return Trace.from_prompts(prompts, outputs=outputs, cache_salts=salts, prompt_logprobs=logprobs,
                              logprob_start_len=starts)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_logs(), st.sampled_from([1, 4, 16]), st.sampled_from([0.0, 0.5]))
def test_no_apc_replay_beats_the_optimum(trace, block, warmup):
    model = apc_optimal(trace, block, warmup=warmup)
    measured = measured_mask(len(trace), warmup)
    for cap in (40, 100, 200, 400, 800, 2000, math.inf):
        got = model.at(cap)
        hits, den = _engine_hits(replay("apc", trace, SimOptions(capacity_tokens=cap, block_size=block)), trace,
                                 measured)
        assert den == got.measured_tokens
        assert hits <= got.hit_tokens, cap


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chat_logs(), st.sampled_from([1, 4, 16]), st.sampled_from([0.0, 0.5]))
def test_no_radix_replay_beats_the_optimum(trace, page, warmup):
    model = radix_optimal(trace, page, warmup=warmup)
    measured = measured_mask(len(trace), warmup)
    for cap in (64, 160, 320, 640, 1600, math.inf):
        got = model.at(cap)
        hits, den = _engine_hits(replay("radix", trace, SimOptions(capacity_tokens=cap, page_size=page)), trace,
                                 measured)
        assert den == got.measured_tokens
        assert hits <= got.hit_tokens, cap


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.sampled_from([1, 2, 4]))
def test_no_replay_beats_the_optimum_at_any_capacity(seed, unit):
    """Every capacity from nothing to unlimited, token by token, on short logs: an off-by-one
    in a footprint or a chain length shows up as a replay above the optimum."""
    rng = np.random.default_rng(seed)
    systems = [list(rng.integers(0, 9, rng.integers(2, 12))) for _ in range(3)]
    prompts, outputs = [], []
    for _ in range(14):
        if prompts and rng.random() < 0.4:
            j = int(rng.integers(len(prompts)))
            p = prompts[j] + outputs[j] + list(rng.integers(0, 9, rng.integers(1, 5)))
        else:
            p = list(systems[rng.integers(3)]) + list(rng.integers(0, 9, rng.integers(0, 6)))
        prompts.append(p[:40])
        outputs.append(list(rng.integers(0, 9, rng.integers(1, 6))))
    starts = [len(p) + 1 if k % 5 == 4 else (len(p) // 2 if k % 7 == 6 else -1) for k, p in enumerate(prompts)]
    trace = Trace.from_prompts(prompts, outputs=outputs, prompt_logprobs=[s >= 0 for s in starts],
                               logprob_start_len=starts)
    apc, radix = apc_optimal(trace, unit), radix_optimal(trace, unit)
    measured = np.ones(len(trace), bool)
    for cap in range(unit, 140 + unit, unit):
        for model, policy, key in ((apc, "apc", "block_size"), (radix, "radix", "page_size")):
            hits, _ = _engine_hits(replay(policy, trace, SimOptions(capacity_tokens=cap, **{key: unit})), trace,
                                   measured)
            assert hits <= model.at(cap).hit_tokens, (model.policy, cap)
