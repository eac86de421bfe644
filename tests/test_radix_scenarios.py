"""The test scenarios of ``docs/engines/radix.md §9``, with their exact numbers.

Every number here was confirmed against the real SGLang 0.5.23 code (``RadixCache`` and
both cores of ``UnifiedRadixCache``) before it was written down: the tree-level ones
(1-14, 26) by calling the real trees directly, the request-level ones (16-19, 25) through
``tests/oracle/sglang_driver.py``; ``tests/test_radix_oracle.py`` re-checks 16-19, 25
and 26 against the real code on every run, and the logprob scenarios (§2.1) likewise.
Scenarios 15 and 20-24 need several
requests in one batch (the concurrent scheduler, a later issue) and are not here.
"""
from __future__ import annotations

import numpy as np
import pytest

from kvsim.engines.base import Request
from kvsim.engines.sglang.tree import RadixTree
from kvsim.engines.sglang.sequential import RadixReference
from kvsim.engines.sglang.sequential import RadixFast
from kvsim.engines.sglang.settings import RadixSettings

FLAVORS = ["unified", "classic"]


class Tree:
    """The spec's shorthand: ins(X), m(X), ev(n) on a tree with distinct fresh slots."""

    def __init__(self, flavor: str, page_size: int = 1, policy: str = "lru"):
        self.t = RadixTree(page_size, policy, flavor)
        self.slot = 0

    def ins(self, tokens, ns=None, prio=0) -> int:
        v = np.arange(self.slot, self.slot + len(tokens))
        self.slot += len(tokens)
        return self.t.insert(np.array(tokens), v, ns, priority=prio)[0]

    def m(self, tokens, ns=None) -> int:
        return self.t.match_prefix(np.array(tokens), ns)[0]

    def node(self, tokens, ns=None):
        return self.t.match_prefix(np.array(tokens), ns)[1]

    def ev(self, n: int) -> int:
        return self.t.evict(n)[0]

    def sizes(self):
        self.t.check()
        return self.t.total_size, self.t.evictable_size, self.t.protected_size


@pytest.fixture(params=FLAVORS)
def flavor(request):
    return request.param


def test_1_split_on_match(flavor):
    """A match ending inside an edge splits it; sizes do not change."""
    t = Tree(flavor)
    assert (t.ins([1, 2, 3]), t.m([1, 2, 3]), t.m([1, 2])) == (0, 3, 2)
    assert t.t.paths() == [(2,), (2, 1)]
    assert t.sizes() == (3, 3, 0)


def test_2_branching_insert(flavor):
    t = Tree(flavor)
    assert t.ins(range(1, 9)) == 0
    assert t.ins([1, 2, 9, 10]) == 2
    assert t.t.paths() == [(2,), (2, 2), (2, 6)]
    assert t.sizes() == (10, 10, 0)


def test_3_dedup_return_value(flavor):
    """insert returns the tokens already cached: the duplicate KV the caller frees."""
    t = Tree(flavor)
    assert [t.ins([1, 2, 3]), t.ins([1, 2, 3]), t.ins([1, 2, 3, 4])] == [0, 3, 3]
    assert t.sizes()[0] == 4


def test_4_extra_key_isolation(flavor):
    t = Tree(flavor)
    t.ins([1, 2, 3], "k1")
    t.ins([1, 2, 3], "k2")
    assert len(t.t.root.children) == 2 and t.sizes()[0] == 6
    assert [t.m([1, 2, 3], "k1"), t.m([1, 2, 3], "k2"), t.m([1, 2, 3]), t.m([1, 2, 3], "zz")] == [3, 3, 0, 0]


def test_5_page_alignment(flavor):
    t = Tree(flavor, page_size=4)
    t.ins(range(1, 9))
    assert t.m(range(1, 11)) == 8
    assert t.m(range(1, 8)) == 4          # splits [1..8] into [1..4] -> [5..8]
    assert t.t.paths() == [(4,), (4, 4)]
    assert t.m([1, 2, 3, 4, 5, 6, 99, 8]) == 4
    assert t.m([1, 2, 3]) == 0


def test_6_paged_siblings_share_first_token(flavor):
    t = Tree(flavor, page_size=2)
    t.ins(range(1, 7))
    assert t.ins([1, 2, 3, 9, 9, 9]) == 2
    assert t.t.paths() == [(2,), (2, 4), (2, 4)]
    first_tokens = sorted(int(c.key[0]) for c in t.node([1, 2]).children.values())
    assert first_tokens == [3, 3]


def test_7_lru_whole_leaf_overshoot(flavor):
    t = Tree(flavor)
    t.ins([1, 2, 3])
    t.ins([4, 5])
    t.ins([6, 7, 8, 9])
    t.m([1, 2, 3])
    assert t.ev(2) == 2                   # B
    assert t.sizes()[1] == 7
    assert t.ev(1) == 4                   # C, whole
    assert t.sizes()[0] == 3 and t.m([1, 2, 3]) == 3
    big = Tree(flavor)
    big.ins(range(100))
    assert big.ev(1) == 100


def test_8_leaf_first_cascade(flavor):
    t = Tree(flavor)
    t.ins([1, 2, 3, 4])
    t.ins([1, 2, 5, 6])
    assert t.ev(3) == 4                   # both leaves before their parent
    assert t.t.paths() == [(2,)]
    assert t.ev(10) == 2 and t.sizes()[0] == 0


def test_9_locks(flavor):
    t = Tree(flavor)
    t.ins([1, 2, 3])
    node = t.node([1, 2, 3])
    t.t.lock(node)
    assert t.sizes() == (3, 0, 3) and t.ev(10) == 0
    t.t.unlock(node)
    assert t.sizes()[1] == 3 and t.ev(10) == 3
    u = Tree(flavor)
    u.ins([1, 2, 3, 4])
    u.ins([1, 2, 5, 6])
    u.t.lock(u.node([1, 2, 5, 6]))
    assert u.sizes() == (6, 2, 4)
    assert u.ev(100) == 2                 # only [3,4]


def test_10_split_inherits_the_lock(flavor):
    t = Tree(flavor)
    t.ins(range(1, 7))
    t.t.lock(t.node(range(1, 7)))
    assert t.m([1, 2, 3, 9]) == 3
    head = t.node([1, 2, 3])
    assert t.t.paths() == [(3,), (3, 3)]
    assert head.lock_ref == 1 and next(iter(head.children.values())).lock_ref == 1
    assert t.sizes()[2] == 6


def test_11_partial_match_refreshes_the_suffix(flavor):
    """Both trees end up refreshing the old edge's suffix (classic: stamped before the
    split; unified: the split restamps the child)."""
    t = Tree(flavor)
    t.ins(range(1, 9))
    t.ins([20, 21])
    assert t.m([1, 2, 3, 9]) == 3
    assert [t.ev(1), t.ev(1), t.ev(1)] == [2, 5, 3]


@pytest.mark.parametrize("policy, survivor", [("lru", "A"), ("lfu", "A"), ("fifo", "B"), ("mru", "B"),
                                              ("filo", "A")])
def test_12_policy_comparison(flavor, policy, survivor):
    t = Tree(flavor, policy=policy)
    t.ins([1, 2])
    t.ins([3, 4])
    t.m([1, 2])
    t.ev(1)
    assert (t.m([1, 2]) == 2) == (survivor == "A")
    assert (t.m([3, 4]) == 2) == (survivor == "B")


def test_13_lfu_counts_inserts_not_matches(flavor):
    """Matches do not count: LFU then orders by recency, like LRU (spec 13). In 0.5.23
    inserts do count (``hit_count`` grows for nodes a request inserts through), which the
    spec did not have: a twice-inserted A outlives a more recent B under LFU only."""
    t = Tree(flavor, policy="lfu")
    t.ins([1, 2])
    t.ins([3, 4])
    for _ in range(5):
        t.m([3, 4])
    t.m([1, 2])
    t.ev(1)
    assert t.m([1, 2]) == 2 and t.m([3, 4]) == 0
    for policy, a_kept in (("lfu", True), ("lru", False)):
        u = Tree(flavor, policy=policy)
        u.ins([1, 2])
        u.ins([1, 2])
        u.ins([3, 4])
        u.m([3, 4])
        u.ev(1)
        assert (u.m([1, 2]) == 2) == a_kept


def test_14_priority_policy(flavor):
    t = Tree(flavor, policy="priority")
    t.ins([1, 2], prio=5)
    t.ins([3, 4])
    t.ins([5, 6])
    t.m([3, 4])
    t.ev(1)
    assert (t.m([5, 6]), t.m([3, 4]), t.m([1, 2])) == (0, 2, 2)
    t.ev(1)
    assert (t.m([3, 4]), t.m([1, 2])) == (0, 2)
    t.ev(1)
    assert t.m([1, 2]) == 0
    u = Tree(flavor, policy="priority")
    u.ins([1, 2, 3, 4])
    u.ins([1, 2, 7, 8], prio=9)
    assert u.node([1, 2]).priority == 9   # the split node takes the higher priority
    u.ev(1)
    assert (u.m([1, 2, 3, 4]), u.m([1, 2, 7, 8])) == (2, 4)


# -- request level: the scheduler's flow (radix_cache / radix_fast) ---------------------

P = list(range(1, 11))


def serve_all(reqs, engine="reference", **kw):
    """Serve (prompt, outputs) pairs one at a time; returns cached tokens and the model."""
    kw = {"capacity": 100_000, **kw}
    if engine == "reference":
        m = RadixReference(RadixSettings(**kw))
        out = [m.serve(Request(str(i), np.array(p), np.array(o))) for i, (p, o) in enumerate(reqs)]
    else:
        m = RadixFast(RadixSettings(**kw))
        out = [m.serve_tokens(np.array(p, np.int64), np.array(o, np.int64), None) for p, o in reqs]
    return out, m


@pytest.fixture(params=["reference", "fast"])
def engine(request):
    return request.param


def paths(m):
    return m.tree.paths() if isinstance(m, RadixReference) else m.paths()


def test_16_len_minus_one_and_the_next_turn(engine, flavor):
    out, m = serve_all([(P, [77, 78, 79, 80, 81]), (P, [5]), (P + [77, 78, 79, 80, 81, 90, 91, 92], [6])],
                       engine, tree=flavor)
    assert [o.cached_tokens for o in out] == [0, 9, 14]


def serve_starts(reqs, engine, **kw):
    """Serve (prompt, outputs, logprob_start_len) triples one at a time."""
    kw = {"capacity": 100_000, **kw}
    if engine == "reference":
        m = RadixReference(RadixSettings(**kw))
        out = [m.serve(Request(str(i), np.array(p), np.array(o), logprob_start_len=s))
               for i, (p, o, s) in enumerate(reqs)]
    else:
        m = RadixFast(RadixSettings(**kw))
        out = [m.serve_tokens(np.array(p, np.int64), np.array(o, np.int64), None, s) for p, o, s in reqs]
    total = m.total_size if engine == "fast" else m.tree.total_size
    return out, total


def test_prompt_logprobs_match_nothing_but_still_insert(engine, flavor):
    """§2.1: a request with logprob_start_len 0 (prompt logprobs) matches nothing, is
    prefilled in full and still inserts; its duplicate KV is freed, the tree keeps 14."""
    out, total = serve_starts([(P, [77, 78, 79, 80, 81], -1), (P, [5], 0), (P, [6], -1)], engine, tree=flavor)
    assert [o.cached_tokens for o in out] == [0, 0, 9] and total == 14 + 1 - 1
    assert not any(o.rejected for o in out)


@pytest.mark.parametrize("page, start, cached", [(1, 6, 6), (1, 9, 9), (1, 12, 12), (1, 14, 12), (4, 6, 4),
                                                 (4, 7, 4), (4, 8, 8), (4, 10, 8), (4, 14, 12)])
def test_logprob_start_caps_the_match(engine, flavor, page, start, cached):
    """An explicit start s caps the match at min(len - 1, s), page-floored: a start
    inside a page loses the whole page; a start >= len - 1 adds no limit."""
    first, second = P + [11, 12], P + [11, 12, 13, 14]   # 12 tokens cached, 14-token prompt
    out, _ = serve_starts([(first, [99], -1), (second, [5], start)], engine, tree=flavor, page_size=page)
    assert out[1].cached_tokens == cached


def test_logprob_start_past_the_prompt_is_refused(engine, flavor):
    """A start past the prompt's end: SGLang refuses the request (HTTP 400) and runs the
    one-token placeholder [0], which inserts [0] + its sampled token (overlap on)."""
    out, total = serve_starts([(P, [5], -1), (P, [6, 7, 8], 11)], engine, tree=flavor)
    assert [o.rejected for o in out] == [False, True] and out[1].cached_tokens == 0
    assert total == 10 + 2     # P, and the placeholder's [0, 6] (its wasted decode step)


def test_17_fragmentation_from_len_minus_one(engine, flavor):
    out, m = serve_all([(P, [77, 78, 79]), (P, [55, 56, 57])], engine, tree=flavor)
    assert [o.cached_tokens for o in out] == [0, 9]
    assert paths(m) == [(9,), (9, 1), (9, 1, 2), (9, 1, 2)]
    total = m.total_size if engine == "fast" else m.tree.total_size
    assert total == 14


def test_18_page_size_4_lifecycle(engine, flavor):
    out, m = serve_all([(P, [77, 78, 79, 80, 81])], engine, tree=flavor, page_size=4)
    assert paths(m) == [(8,), (8, 4)]    # committed 14 -> 12 inserted, split at the prompt
    out2, _ = serve_all([(P, [77, 78, 79, 80, 81]), (P + [77, 78, 79, 80, 81, 90, 91], [1])], engine,
                        tree=flavor, page_size=4)
    assert out2[1].cached_tokens == 12


def test_19_chunked_prefill_node_boundaries(engine, flavor):
    out, m = serve_all([(P, [1])], engine, tree=flavor, chunked_prefill_size=4)
    assert paths(m) == [(4,), (4, 4), (4, 4, 2)]
    assert out[0].cached_tokens == 0 and out[0].extend_tokens == 10   # #new-token 4 + 4 + 2


A = list(range(1000, 1100))
B = list(range(2000, 2120))
OA = list(range(3000, 3010))
OB = list(range(4000, 4010))
ROUNDS = [(A, OA), (B, OB), (A + OA + list(range(5000, 5050)), [1]), (B + OB + list(range(6000, 6030)), [1])]


@pytest.mark.parametrize("overlap, finish, expect", [
    (False, "length", [109, 129]), (True, "length", [109, 129]),
    (False, "stop", [109, 129]), (True, "stop", [110, 130])])
def test_25_multi_turn_two_clients(engine, flavor, overlap, finish, expect):
    """Sequential form of the round-barrier scenario. The overlap scheduler inserts one
    token more only for replies that end with a stop token: a finish by length is known
    in advance and its wasted decode step is skipped (0.5.23's skip-finishing-decode)."""
    out, m = serve_all(ROUNDS, engine, tree=flavor, overlap=overlap, finish=finish)
    cached = [o.cached_tokens for o in out]
    assert cached[2:] == expect
    assert sum(cached) / sum(len(p) for p, _ in ROUNDS) == pytest.approx(sum(expect) / 540)


@pytest.mark.parametrize("amount, freed", [("shortfall", 3), ("need", 6)])
def test_26_eviction_amount(engine, flavor, amount, freed):
    """Free 4, leaves X, Y, Z of 3 in LRU order, a 5-token allocation: 0.5.23 evicts the
    shortfall (X only); before PR #32016 SGLang asked for the whole need (X and Y)."""
    reqs = [([1, 2, 3], [9]), ([4, 5, 6], [9]), ([7, 8, 9], [9]), ([10, 11, 12, 13, 14], [9])]
    out, m = serve_all(reqs, engine, tree=flavor, capacity=13, eviction_amount=amount)
    assert [o.evicted_tokens for o in out] == [0, 0, 0, freed]
    assert [o.evictions for o in out] == [0, 0, 0, freed // 3]


# -- rules of 0.5.23's scheduler that random workloads rarely reveal --------------------
# (both confirmed against the real code: tests/test_radix_oracle.py::test_scenarios_on_the_real_flow)

X = list(range(100, 120))
N = list(range(200, 210))
FILLERS = [[1000 + 10 * i + j for j in range(5)] for i in range(40)]


def refresh_workload():
    """X -> N cached long ago, 30 newer 5-token leaves, a full pool; request 32 (a refresh
    pass) sends X + N[0]: its len-1 match stops at X and would leave N the oldest leaf."""
    return [(X, [1]), (X + N, [1])] + [(FILLERS[i], [1]) for i in range(30)] + [(X + [200], [1])]


def overlap_workload():
    """The same tree, one free slot, a probe on pass 33 (no refresh) with two output tokens."""
    return [(X, [1]), (X + N, [1])] + [(FILLERS[i], [1]) for i in range(31)] + [(X + [200], [1, 2])]


def test_waiting_prefix_refresh_every_32nd_pass(engine, flavor):
    """With LRU, every 32nd scheduling pass first matches the waiting request's whole
    prompt (SchedulePolicy._touch_waiting_prefixes): N is refreshed and a filler goes."""
    out, _ = serve_all(refresh_workload(), engine, tree=flavor, capacity=180)
    assert out[-1].evicted_tokens == 5
    out, _ = serve_all(refresh_workload(), engine, tree=flavor, capacity=180, eviction_policy="lfu")
    assert out[-1].evicted_tokens == 10      # no refresh for other policies: N is evicted whole


@pytest.mark.parametrize("overlap, evicted", [(True, 10), (False, 0)])
def test_overlap_prepares_the_first_decode_before_the_prompt_checkpoint(engine, flavor, overlap, evicted):
    """Overlap: the first decode slot is allocated (evicting the oldest leaf, N) before the
    prefill result inserts the prompt; without overlap the insert first finds N[0] in the
    tree, frees the request's duplicate slot, and the decode step needs no eviction."""
    out, _ = serve_all(overlap_workload(), engine, tree=flavor, capacity=186, overlap=overlap)
    assert out[-1].evicted_tokens == evicted


@pytest.mark.parametrize("flavor, order", [("unified", [5, 3, 2]), ("classic", [5, 2, 3])])
def test_split_keeps_the_creation_time_in_the_unified_tree(flavor, order):
    """FIFO: the unified tree's split prefix keeps the old edge's creation time, so it goes
    before a later-created leaf; the classic tree stamps it new (the only §9-style case
    where the two trees SGLang 0.5.23 ships evict differently)."""
    t = Tree(flavor, policy="fifo")
    t.ins(range(1, 9))
    t.ins([20, 21])
    t.m([1, 2, 3, 9])
    assert [t.ev(1), t.ev(1), t.ev(1)] == order
