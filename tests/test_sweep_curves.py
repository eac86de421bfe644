"""One-pass hit-rate curves against direct simulations and the exact replays.

Where the one-pass model is exact (see ``kvsim/sweep/stack.py``):
- block LRU: at every capacity;
- APC: at every capacity that rejects no request, when no block is written twice (no
  block-aligned prompt re-using its last block, no prompt-logprob request).
Elsewhere the error is bounded by what is measured here.
"""
from __future__ import annotations

import heapq
import math
from collections import OrderedDict

import numpy as np
import pytest

from kvsim.io.trace.columns import Trace
from kvsim.drive.sequential import replay
from kvsim.drive.metrics import summarize
from kvsim.engines.options import SimOptions
from kvsim.sweep import curve, curve_model
from kvsim.sweep.curves import apc_curve, block_lru_curve, measured_mask, radix_curve


def workload(seed: int, n: int = 250, block: int = 4, aligned: bool = True, logprobs: bool = False,
             namespaces: bool = False) -> Trace:
    """Prompts that share prefixes in many ways: common system prompts, follow-ups of earlier
    prompts cut anywhere, random suffixes; random output lengths."""
    rng = np.random.default_rng(seed)
    systems = [list(rng.integers(0, 50, rng.integers(1, 40))) for _ in range(8)]
    prompts: list[list[int]] = []
    for _ in range(n):
        if prompts and rng.random() < 0.5:
            p = list(prompts[rng.integers(len(prompts))])[: rng.integers(1, 60)]
        else:
            p = list(systems[rng.integers(len(systems))])
        p += list(rng.integers(0, 50, rng.integers(0, 30)))
        if not p or (not aligned and len(p) % block == 0):
            p.append(7)
        prompts.append(p)
    salts = [f"t{rng.integers(2)}" if namespaces and rng.random() < 0.3 else None for _ in range(n)]
    loras = [f"a{rng.integers(2)}" if namespaces and rng.random() < 0.2 else None for _ in range(n)]
    logprob = [bool(logprobs and rng.random() < 0.1) for _ in range(n)]
    return Trace.from_prompts(prompts, output_lengths=rng.integers(1, 12, n).tolist(), cache_salts=salts,
                              loras=loras, prompt_logprobs=logprob)


# -- block LRU: exact at every capacity ------------------------------------------------------

def block_lru_reference(trace: Trace, block: int, capacity_blocks: int, order: str, warmup: float = 0.0):
    """A plain LRU over prefix blocks (a block's identity is its whole prefix)."""
    cache: OrderedDict = OrderedDict()
    hit = total = 0
    first = math.floor(len(trace) * warmup)
    for i in range(len(trace)):
        p = tuple(int(t) for t in trace.prompt(i))
        keys = [p[: min((j + 1) * block, len(p))] for j in range(-(-len(p) // block))]
        h = 0
        for k in keys:
            if k not in cache:
                break
            h += len(k) - (len(keys[keys.index(k) - 1]) if keys.index(k) else 0)
        if i >= first:
            hit, total = hit + h, total + len(p)
        for k in (reversed(keys) if order == "tail-first" else keys):
            cache[k] = True
            cache.move_to_end(k)
        while len(cache) > capacity_blocks:
            cache.popitem(last=False)
    return hit / total if total else 0.0


@pytest.mark.parametrize("order", ["tail-first", "forward"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_block_lru_curve_equals_direct_lru_at_every_capacity(seed, order):
    tr = workload(seed, n=120)
    warmup = 0.25 if seed == 2 else 0.0
    model = block_lru_curve(tr, 4, warmup=warmup, order=order)
    for blocks in range(1, model.saturation_units + 3):
        got = model.hit_rate_at_units([blocks])[0]
        assert got == pytest.approx(block_lru_reference(tr, 4, blocks, order, warmup), abs=1e-12), blocks


def mooncake_lab_lru(trace: Trace, block: int, capacity: int) -> float:
    """The LRU of the Mooncake team's KV-cache simulator (kvcache-blog ``kv-cache-lab.js``,
    ``simulatePrefixTriePolicy``), rewritten in Python: a prefix trie of blocks, hits
    touched first to last, missing blocks inserted first to last, the least recently used
    *leaf* evicted, the blocks the request already had cached protected, insertion stops
    when nothing can be evicted. No warm-up."""
    ids: dict = {}
    parent = [0]
    reqs = []
    for i in range(len(trace)):
        p = [int(t) for t in trace.prompt(i)]
        nodes, sizes, node = [], [], 0
        for j in range(-(-len(p) // block)):
            piece = tuple(p[j * block:(j + 1) * block])
            node = ids.setdefault((node, piece), len(parent))
            if node == len(parent):
                parent.append(nodes[-1] if nodes else 0)
            nodes.append(node)
            sizes.append(len(piece))
        reqs.append((nodes, sizes))
    n = len(parent)
    present, children, stamp, version, protect = [0] * n, [0] * n, [0] * n, [0] * n, [0] * n
    present[0] = 1
    heap: list = []
    clock = size = mark = hit = total = 0

    def push_leaf(x):
        if x and present[x] and not children[x]:
            version[x] += 1
            heapq.heappush(heap, (stamp[x], -x, version[x], x))

    def touch(x):
        nonlocal clock
        clock += 1
        stamp[x] = clock
        push_leaf(x)

    def evict_leaf():
        nonlocal size
        skipped, ok = [], False
        while heap:
            item = heapq.heappop(heap)
            k, _, v, x = item
            if not present[x] or children[x] or version[x] != v or stamp[x] != k:
                continue
            if protect[x] == mark:
                skipped.append(item)
                continue
            present[x] = 0
            size -= 1
            children[parent[x]] -= 1
            if parent[x] and present[parent[x]] and not children[parent[x]]:
                push_leaf(parent[x])
            ok = True
            break
        for item in skipped:
            heapq.heappush(heap, item)
        return ok

    for nodes, sizes in reqs:
        alive = True
        for x, t in zip(nodes, sizes):
            total += t
            if present[x] and alive:
                hit += t
                touch(x)
            elif not present[x]:
                alive = False
        mark += 1
        for x in nodes:
            if present[x]:
                protect[x] = mark
        for x in nodes:
            if present[x]:
                continue
            if size >= capacity and not evict_leaf():
                break
            if size < capacity and present[parent[x]]:
                present[x] = 1
                size += 1
                children[parent[x]] += 1
                touch(x)
            else:
                break
    return hit / total


@pytest.mark.parametrize("seed", [0, 1])
def test_block_lru_is_the_mooncake_simulators_lru(seed):
    """Same hit rate at every capacity that holds the largest request (below it, that
    simulator evicts a request's own new blocks and stops inserting)."""
    tr = workload(seed, n=120)
    model = block_lru_curve(tr, 4)
    largest = max(-(-len(tr.prompt(i)) // 4) for i in range(len(tr)))
    for blocks in range(largest, model.saturation_units + 2, 3):
        assert model.hit_rate_at_units([blocks])[0] == pytest.approx(mooncake_lab_lru(tr, 4, blocks), abs=1e-12)


def test_block_lru_namespaces_never_share():
    """The same prompt under two salts shares nothing."""
    tr = Trace.from_prompts([[1, 2, 3, 4, 5]] * 2, cache_salts=["a", "b"])
    assert block_lru_curve(tr, 2).hit_rate([math.inf])[0] == 0.0
    tr = Trace.from_prompts([[1, 2, 3, 4, 5]] * 2)
    assert block_lru_curve(tr, 2).hit_rate([math.inf])[0] == pytest.approx(5 / 10)


# -- APC: the exact replay -------------------------------------------------------------------

def exact_rates(trace: Trace, block: int, capacities, engine_version=None):
    out = []
    for cap in capacities:
        r = replay("apc", trace, SimOptions(capacity_tokens=cap, block_size=block, engine_version=engine_version))
        s = summarize(r, trace)
        out.append((r.capacity_tokens, s["token_hit_rate"], s["rejected"]))
    return out


@pytest.mark.parametrize("engine_version", [None, "0.11"])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_apc_curve_is_exact_without_rejections_or_duplicates(seed, engine_version):
    """Both free orders (0.24+: unhashed blocks to the head; 0.11: all to the tail)."""
    tr = workload(seed, aligned=False, namespaces=seed % 2 == 1)
    model = apc_curve(tr, 4, engine_version=engine_version)
    smallest = model.extra["min_exact_tokens"]
    caps = [smallest, smallest + 4, 2 * smallest, 3 * smallest + 8, 10 * smallest, math.inf]
    for cap, rate, rejected in exact_rates(tr, 4, caps, engine_version):
        assert rejected == 0
        assert model.hit_rate([cap])[0] == pytest.approx(rate, abs=1e-12), cap


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_apc_curve_error_is_small_with_duplicates_and_rejections(seed):
    """Block-aligned prompts and prompt-logprob requests write duplicate blocks; small caches reject."""
    tr = workload(seed, n=300, aligned=True, logprobs=True, namespaces=True)
    model = apc_curve(tr, 4)
    smallest = model.extra["min_exact_tokens"]
    caps = [16, 40, 80, 160, smallest, 2 * smallest, 6 * smallest, math.inf]
    for cap, rate, rejected in exact_rates(tr, 4, caps):
        err = abs(model.hit_rate([cap])[0] - rate)
        if rejected == 0:
            assert err <= 0.005, (cap, err)
        elif rejected <= 0.05 * len(tr):
            assert err <= 0.01, (cap, err)


def test_apc_curve_counts_only_admitted_requests():
    """A request too big for the cache is rejected: out of the denominator, as in the replay.

    Known limit of the one pass (module docstring): the rejected request still passes
    through the model's stack, so below its footprint the model loses what it flushed.
    """
    tr = Trace.from_prompts([[1] * 9, [2] * 40, [1] * 9], output_lengths=[1, 1, 1])
    model = apc_curve(tr, 4)
    assert model.extra["min_exact_tokens"] == 40
    (cap, rate, rejected), = exact_rates(tr, 4, [16])
    assert rejected == 1 and rate == pytest.approx(8 / 18)
    _, admitted = model.hits_at_units([cap // 4])
    assert admitted[0] == 18
    assert model.hit_rate([cap])[0] == 0.0  # the limit: the exact replay keeps [1]*8 cached
    (c40, r40, rej40), (c48, r48, rej48) = exact_rates(tr, 4, [40, 48])
    assert rej40 == rej48 == 0
    assert model.hit_rate([c40])[0] == r40 == 0.0  # the 10-block request pops every block
    assert model.hit_rate([c48])[0] == pytest.approx(r48) == pytest.approx(8 / 58)


def test_curve_api_returns_arrays():
    tr = workload(5, aligned=False)
    xs, ys = curve(tr, "apc", block_size=4, points=20)
    assert len(xs) == len(ys) >= 2 and np.all(np.diff(xs) > 0)
    assert np.all((ys >= 0) & (ys <= 1))
    caps, rates = curve(tr, "apc", capacities=[None, 1e3], block_size=4)
    assert math.isinf(caps[0]) and rates[0] == pytest.approx(exact_rates(tr, 4, [math.inf])[0][1])


def test_warmup_mask_and_bad_policy():
    assert measured_mask(10, 0.5).tolist() == [False] * 5 + [True] * 5
    from kvsim.errors import ConfigError

    with pytest.raises(ConfigError):
        measured_mask(10, 1.0)
    with pytest.raises(ConfigError):
        curve_model(workload(0, n=5), "belady")
    with pytest.raises(ConfigError, match="no one-pass curve"):
        curve_model(workload(0, n=5), "radix", eviction_policy="fifo")


# -- radix: an approximation (whole-leaf eviction is not modelled) ------------------------

def radix_exact(trace: Trace, page: int, capacities):
    from kvsim.drive.sequential import replay

    out = []
    for cap in capacities:
        r = replay("radix", trace, SimOptions(capacity_tokens=cap, page_size=page))
        s = summarize(r, trace)
        out.append((r.capacity_tokens, s["token_hit_rate"], s["rejected"]))
    return out


@pytest.mark.parametrize("page, granule", [(1, 1), (1, 4), (4, None)])
def test_radix_curve_is_exact_unlimited_and_close_elsewhere(page, granule):
    """Measured on these small random workloads (caches of a few hundred tokens, where one
    whole leaf is a large share of the cache): |error| <= 0.05 wherever nothing is rejected."""
    for seed in (0, 1, 2):
        tr = workload(seed, aligned=True, logprobs=True, namespaces=True)
        model = radix_curve(tr, page, granule=granule)
        for cap, rate, rejected in radix_exact(tr, page, [100, 400, 1000, 4000, math.inf]):
            err = abs(model.hit_rate([cap])[0] - rate)
            if cap is None and granule != 4:  # nothing evicted; no granule rounding
                assert err == pytest.approx(0.0, abs=1e-12)
            if rejected == 0:
                assert err <= 0.05, (seed, cap, err)


def test_radix_admission_threshold_matches_the_replay():
    """A request is admitted once the pool holds ceil_page(L) + page + 1 tokens."""
    tr = Trace.from_prompts([[1] * 20, [1] * 20], output_lengths=[1, 1])
    model = radix_curve(tr, 1, granule=1)
    for cap, rate, rejected in radix_exact(tr, 1, [21, 22, 23, 64]):
        _, admitted = model._at(model.units_of([cap]), np.array([float(cap)]))
        assert admitted[0] == 20 * (2 - rejected), cap
        assert model.hit_rate([cap])[0] == pytest.approx(rate), cap
