"""kvcache-lab's block policies (``kvsim.sweep.kvcache_lab``) against plain Python versions
written from the simulator's rules, and against the offline optimum.

The port was also run against the Mooncake team's own native simulator
(``scripts/kv-cache-lab-native-sim.cc``) with ``scripts/kvcache_lab_compare.py
--native-sim``; the tests here need nothing outside this repository.
"""
from __future__ import annotations

import heapq

import numpy as np
import pytest

from kvsim.io.trace.columns import Trace
from kvsim.sweep.kvcache_lab import block_events, simulate
from kvsim.sweep.optimal import block_optimal


def workload(seed: int, n: int = 150) -> Trace:
    rng = np.random.default_rng(seed)
    systems = [list(rng.integers(0, 40, rng.integers(1, 30))) for _ in range(6)]
    prompts: list[list[int]] = []
    for _ in range(n):
        if prompts and rng.random() < 0.5:
            p = list(prompts[rng.integers(len(prompts))])[: rng.integers(1, 50)]
        else:
            p = list(systems[rng.integers(len(systems))])
        prompts.append(p + list(rng.integers(0, 40, rng.integers(0, 25))) or [1])
    return Trace.from_prompts(prompts)


def reference(trace: Trace, B: int, policy: str, capacity: int, warmup: int) -> tuple[int, int, bool]:
    """kvcache-lab's FIFO / trie LRU / trie Belady, straight from its rules (dicts and heapq)."""
    reqs = []
    for i in range(len(trace)):
        p = [int(t) for t in trace.prompt(i)]
        reqs.append([(tuple(p[: (j + 1) * B]), len(p[j * B:(j + 1) * B])) for j in range(-(-len(p) // B))])
    order = {}
    for blocks in reqs:
        for k, _ in blocks:
            order.setdefault(k, len(order) + 1)       # node ids by first appearance
    nxt: list[list[int]] = [[] for _ in reqs]
    last: dict = {}
    for r in range(len(reqs) - 1, -1, -1):
        nxt[r] = [last.get(k, len(reqs) + 1) for k, _ in reqs[r]]
        for k, _ in reqs[r]:
            last[k] = r
    hit = total = 0
    filled = False
    cache: dict = {}                                  # key -> heap key (LRU clock or next use)
    children: dict = {}
    queue: list = []
    heap: list = []
    clock = 0

    def push(k):
        if k in cache and not children.get(k):
            sign = -1 if policy == "belady" else 1
            heapq.heappush(heap, (sign * cache[k], -order[k], k))

    for r, blocks in enumerate(reqs):
        alive = True
        for j, (k, t) in enumerate(blocks):
            h = k in cache
            if r >= warmup:
                total += t
                hit += t if alive and h else 0
            if alive and h and policy != "fifo":
                clock += 1
                cache[k] = nxt[r][j] if policy == "belady" else clock
                push(k)
            alive = alive and h
        mine = {k for k, _ in blocks if k in cache}
        for j, (k, _) in enumerate(blocks):
            if k in cache:
                continue
            if policy == "fifo":
                if len(cache) >= capacity:
                    while queue:
                        v = queue.pop(0)
                        if v in cache:
                            del cache[v]
                            break
                if len(cache) < capacity:
                    cache[k] = 0
                    queue.append(k)
                    filled = filled or (len(cache) >= capacity and r < warmup)
                continue
            if len(cache) >= capacity:
                skipped, ok = [], False
                while heap:
                    item = heapq.heappop(heap)
                    key, _, v = item
                    sign = -1 if policy == "belady" else 1
                    if v not in cache or children.get(v) or sign * cache[v] != key:
                        continue
                    if v in mine:
                        skipped.append(item)
                        continue
                    if policy == "belady" and cache[v] <= nxt[r][j]:
                        heapq.heappush(heap, item)
                        break
                    del cache[v]
                    pv = v[: (len(v) - 1) // B * B] if len(v) > B else None   # its parent block
                    if pv is not None:
                        children[pv] -= 1
                        push(pv)
                    ok = True
                    break
                for item in skipped:
                    heapq.heappush(heap, item)
                if not ok:
                    break
            pk = blocks[j - 1][0] if j else None
            if len(cache) < capacity and (pk is None or pk in cache):
                clock += 1
                cache[k] = nxt[r][j] if policy == "belady" else clock
                if pk is not None:
                    children[pk] = children.get(pk, 0) + 1
                push(k)
                filled = filled or (len(cache) >= capacity and r < warmup)
            else:
                break
    return hit, total, filled


@pytest.mark.parametrize("policy", ["fifo", "lru", "belady"])
@pytest.mark.parametrize("seed", [0, 1])
def test_port_equals_the_rules_at_every_capacity(policy, seed):
    tr = workload(seed)
    B, warm = 4, 50
    ev = block_events(tr, B)
    for cap in [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 400]:
        got = simulate(ev, policy, cap, warm)
        assert (got.hit_tokens, got.measured_tokens, got.filled) == reference(tr, B, policy, cap, warm), cap


@pytest.mark.parametrize("tail", ["weighted", "drop"])
@pytest.mark.parametrize("seed", [2, 3])
def test_no_lab_policy_beats_the_optimum(tail, seed):
    """Each lab policy is one feasible schedule of the storage model, so none beats its
    optimum (exact with whole blocks, the upper bound with partial ones)."""
    tr = workload(seed)
    B = 4
    ev = block_events(tr, B, tail)
    opt = block_optimal(tr, B, warmup=0.3, tail=tail)
    warm = int(len(tr) * 0.3)
    for cap in [1, 3, 10, 30, 100, 300]:
        best = opt.at(cap * B)
        for policy in ("fifo", "lru", "belady"):
            got = simulate(ev, policy, cap, warm)
            assert got.measured_tokens == best.measured_tokens
            assert got.hit_tokens <= best.upper_tokens, (policy, cap)
            if tail == "drop":
                assert got.hit_tokens <= best.hit_tokens


def test_drop_tail_blocks_and_first_appearance_numbering():
    tr = Trace.from_prompts([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6, 7], [9]])
    ev = block_events(tr, 2, "drop")
    assert ev.node.tolist() == [1, 2, 1, 2, 3]            # [1,2] [3,4] | [1,2] [3,4] [6,7] | nothing
    assert ev.tokens.tolist() == [2] * 5
    assert ev.request_end.tolist() == [2, 5, 5]
    assert ev.parent.tolist() == [0, 0, 1, 2]
    ev = block_events(tr, 2, "weighted")
    assert ev.tokens.tolist() == [2, 2, 1, 2, 2, 2, 1]    # partial blocks weigh their length


def test_lab_hit_rates_is_simulate_at_each_capacity():
    from kvsim.sweep.kvcache_lab import lab_hit_rates

    tr = workload(4, n=60)
    ev = block_events(tr, 4)
    got = lab_hit_rates(tr, "fifo", [3, 30, 300], 4, warmup=0.5)
    assert got.tolist() == [simulate(ev, "fifo", c, 30).hit_rate for c in (3, 30, 300)]
