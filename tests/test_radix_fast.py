"""The fast radix engine against the readable reference: identical results on random workloads.

Every option combination that changes a decision is covered: both trees, every eviction
policy, page sizes 1/4/16, overlap on and off, finish by length or stop token, chunked
prefill, the eviction amount, unlimited and tight capacities (rejections included).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from kvsim.engines.base import Request
from kvsim.engines.sglang.rules import namespace
from kvsim.engines.sglang.sequential import RadixReference
from kvsim.engines.sglang.sequential import RadixFast
from kvsim.engines.sglang.settings import RadixSettings
from kvsim.engines.sglang.stats import tree_report
from tests.oracle.sglang_workloads import make_workload

POLICIES = ["lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru"]


def both(workload, **kw):
    ref = RadixReference(RadixSettings(**kw))
    fast = RadixFast(RadixSettings(**kw))
    rows_ref, rows_fast = [], []
    for i, (p, o, lora, salt) in enumerate(zip(workload.prompts, workload.outputs, workload.loras,
                                                 workload.salts)):
        a = ref.serve(Request(str(i), p, o, lora=lora, cache_salt=salt))
        b = fast.serve_tokens(np.asarray(p, np.int64), np.asarray(o, np.int64), namespace(lora, salt))
        rows_ref.append((a.cached_tokens, a.rejected, a.evicted_tokens, a.evictions, a.max_new,
                         a.extend_tokens, ref.used_tokens(), ref.tree.evictable_size))
        rows_fast.append((b.cached_tokens, b.rejected, b.evicted_tokens, b.evictions, b.max_new,
                          b.extend_tokens, fast.used_tokens(), fast.evictable))
    ref.tree.check()
    return ref, fast, rows_ref, rows_fast


CASES = [
    dict(tree=f, eviction_policy=pol, page_size=p, overlap=ov, finish=fin)
    for (f, pol), p, ov, fin in itertools.product(
        [(f, pol) for f in ("unified", "classic") for pol in POLICIES if not (f == "classic" and pol == "tlru")],
        (1, 4), (True,), ("length",))
] + [
    dict(tree="unified", eviction_policy="lru", page_size=16, overlap=ov, finish=fin)
    for ov in (True, False) for fin in ("length", "stop")
] + [
    dict(tree="classic", eviction_policy="lru", page_size=1, overlap=False, finish="stop"),
    dict(tree="unified", eviction_policy="lru", page_size=1, eviction_amount="need"),
    dict(tree="unified", eviction_policy="fifo", page_size=4, eviction_amount="need", finish="stop",
         max_new_tokens=12),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(str(v) for v in c.values()))
def test_fast_equals_reference(case):
    p = case["page_size"]
    w = make_workload(7 + p, 150, sys_len=(4, 60 * p), turn_len=(1, 30 * p), out_len=(1, 12 * p))
    capacity = {1: 240, 4: 720, 16: 2560}[p]
    kw = dict(case, capacity=capacity, chunked_prefill_size=48 * p)
    if kw["eviction_policy"] == "tlru":
        kw["policy_config"] = {"threshold": 80, "next_prompt_estimate": 10}
    ref, fast, a, b = both(w, **kw)
    assert a == b
    assert ref.tree.paths() == fast.paths()
    assert tree_report(ref.tree) == tree_report(fast)
    assert ref.peak_used_tokens == fast.peak_used_tokens
    assert sum(r[2] for r in a) > 0, "the capacity should force evictions"


def test_fast_equals_reference_unlimited_and_rejections():
    w = make_workload(3, 120, sys_len=(4, 200), turn_len=(1, 200), out_len=(1, 40))
    for cap in (None, 150):
        ref, fast, a, b = both(w, capacity=cap, chunked_prefill_size=-1 if cap is None else 64)
        assert a == b and ref.tree.paths() == fast.paths()
        if cap is None:
            assert not any(r[1] for r in a) and sum(r[2] for r in a) == 0
        else:
            assert any(r[1] for r in a)   # prompts longer than the pool are rejected
