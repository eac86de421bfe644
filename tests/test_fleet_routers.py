"""The routers' acceptance scenarios (docs/engines/routers.md), with the spec's exact numbers."""
from __future__ import annotations

import numpy as np
import pytest

from kvsim.errors import ConfigError
from kvsim.fleet import IDLE, ROUTERS, BlockRemoved, BlockStored, ReplicaLoad, RouteRequest, make_router


def req(i: int, tokens, **kw) -> RouteRequest:
    return RouteRequest(i, f"r{i}", np.asarray(list(tokens), dtype=np.int64), float(i), **kw)


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def sequential(router, requests, n):
    out = []
    for r in requests:
        w = router.route(r, [IDLE] * n, r.arrival)
        router.prefill_done(r, w, r.arrival)
        router.finished(r, w, r.arrival)
        out.append(w)
    return out


# -- docs/engines/routers.md §1 simple routers ------------------------------------------------------------------------
def test_r1_round_robin():
    """R1: 3 replicas, 7 requests -> 0,1,2,0,1,2,0."""
    assert sequential(make_router("round_robin", 3), [req(i, [i]) for i in range(7)], 3) == [0, 1, 2, 0, 1, 2, 0]


def test_r2_least_load_sequential_stays_on_replica_0():
    """R2: every load is 0 at each dispatch; the lowest index wins."""
    assert set(sequential(make_router("least_load", 4), [req(i, [i]) for i in range(9)], 4)) == {0}


def test_least_load_counts_in_flight():
    r = make_router("least_load", 3)
    got = [r.route(req(i, [i]), [IDLE] * 3, 0) for i in range(4)]
    assert got == [0, 1, 2, 0]


def test_r3_power_of_two_sequential_is_uniform():
    """R3: both draws at load 0 -> the first drawn; uniform over replicas."""
    got = sequential(make_router("power_of_two", 4, seed=3), [req(i, [i]) for i in range(4000)], 4)
    counts = np.bincount(got, minlength=4)
    assert counts.min() > 850 and counts.max() < 1150


def test_power_of_two_never_picks_the_unique_busiest():
    r = make_router("power_of_two", 3, seed=1)
    r.in_flight[:] = [5, 0, 0]
    assert r.candidates(req(0, [1]), [IDLE] * 3, 0) == frozenset({1, 2})
    assert all(r.choose(req(0, [1]), [IDLE] * 3, 0) != 0 for _ in range(200))


def test_r4_session_affinity_and_the_missing_sessions_error():
    """R4: same session id -> same replica whatever the loads; a log without sessions is an error."""
    r = make_router("session", 5)
    first = r.route(req(0, [1], session="alice"), [IDLE] * 5, 0)
    for i in range(1, 8):
        assert r.route(req(i, [i], session="alice"), [IDLE] * 5, 0) == first
    assert len({r.route(req(9 + i, [1], session=f"s{i}"), [IDLE] * 5, 0) for i in range(40)}) == 5
    with pytest.raises(ConfigError, match="session ids"):
        r.check_log(has_sessions=False)
    make_router("round_robin", 2).check_log(has_sessions=False)


def test_options_are_typed_and_unknown_ones_listed():
    with pytest.raises(ConfigError, match=r"router dynamo has no option 'cache_threshold'; its options: mode, "):
        make_router("dynamo", 2, {"cache_threshold": "0.3"})
    with pytest.raises(ConfigError, match="must be one of events, approx"):
        make_router("dynamo", 2, {"mode": "precise"})
    with pytest.raises(ConfigError, match="not a valid float"):
        make_router("cache_aware", 2, {"cache_threshold": "high"})
    with pytest.raises(ConfigError, match="unknown router"):
        make_router("nginx", 2)
    with pytest.raises(ConfigError, match="--replicas"):
        make_router("random", 0)
    assert make_router("cache_aware", 2, {"cache_threshold": "0.5"}).settings.cache_threshold == 0.5


@pytest.mark.parametrize("name", sorted(ROUTERS))
def test_one_replica_always_routes_to_it(name):
    """One replica with any router: every request goes to replica 0."""
    r = make_router(name, 1)
    reqs = [req(i, seq(7 * i, 40 + i), session=f"s{i % 3}") for i in range(12)]
    assert set(sequential(r, reqs, 1)) == {0}


# -- docs/engines/routers.md §2 SGLang gateway cache_aware --------------------------------------------------------------
def test_sg1_affinity_then_a_miss():
    """SG1: A+q1 miss -> w; A+q2 matches 600/700 = 0.857 -> w; B+q3 matches nothing -> any worker."""
    r = make_router("cache_aware", 3)
    a = seq(10_000, 600)
    w = r.route(req(0, a + seq(1, 100)), [IDLE] * 3, 0)
    r.finished(req(0, []), w, 0)
    r2 = req(1, a + seq(200, 100))
    assert r.tree.match(r2.tokens)[0] == 600
    assert r.candidates(r2, [IDLE] * 3, 1) == frozenset({w})
    r.finished(r2, r.route(r2, [IDLE] * 3, 1), 1)
    b = req(2, seq(30_000, 700))
    # 1.13.0 ranks by dispatches since the last load poll (every 10 s): w has two, so the others
    assert r.candidates(b, [IDLE] * 3, 2) == frozenset({0, 1, 2}) - {w}
    assert r.candidates(b, [IDLE] * 3, 10) == frozenset({0, 1, 2})    # after the next poll: any


def test_sg2_threshold_is_strict():
    """SG2: 300 of 1,000 tokens matched on worker 1 -> rate 0.3 is not > 0.3 -> least loaded, inserted there."""
    r = make_router("cache_aware", 3)
    r.dispatch(req(0, seq(5_000, 300)), 1, 0.0)
    r.finished(req(0, []), 1, 0.0)
    r.next_poll = 1e9
    text = req(1, seq(5_000, 300) + seq(90_000, 700))
    assert r.tree.match(text.tokens)[0] == 300
    r.since[:] = [0, 3, 2]
    assert r.candidates(text, [IDLE] * 3, 1) == frozenset({0})
    r.dispatch(text, 0, 1)
    assert 0 in r.tree.holders(text.tokens)
    above = req(2, seq(5_000, 300) + seq(70_000, 699))        # 300/999 > 0.3 -> worker 1 keeps it
    assert r.candidates(above, [IDLE] * 3, 1) == frozenset({0, 1})


def test_sg3_zero_load_sequential_log_on_one_worker_for_0_3_2():
    """SG3: all loads 0, lowest index on misses (0.3.2): a sequential log lands on worker 0 alone."""
    reqs = [req(i, seq(1000 * i, 50)) for i in range(10)]
    assert set(sequential(make_router("cache_aware", 4, {"version": "0.3.2"}), reqs, 4)) == {0}
    assert len(set(sequential(make_router("cache_aware", 4, seed=2), reqs, 4))) > 1   # 1.13.0: random misses


def test_sg4_old_gate_sends_to_the_least_loaded_regardless_of_match():
    """SG4 (0.3.2): loads [70, 2, 5] -> 68 > 64 and 70 > 3 -> worker 1, and the text is inserted for it."""
    r = make_router("cache_aware", 3, {"version": "0.3.2"})
    a = req(0, seq(0, 500))
    r.dispatch(a, 0, 0.0)
    r.in_flight[:] = [70, 2, 5]
    b = req(1, seq(0, 500) + seq(9000, 10))
    assert r.candidates(b, [IDLE] * 3, 1) == frozenset({1})
    assert r.route(b, [IDLE] * 3, 1) == 1 and 1 in r.tree.holders(b.tokens)
    r.in_flight[:] = [60, 2, 5]                     # 58 < 64: balanced, the prefix's holders keep it
    c = req(2, seq(0, 500) + seq(7777, 10))         # stops at A's node, held by 0 and 1
    assert r.candidates(c, [IDLE] * 3, 2) == frozenset({0, 1})


def test_sg5_spill_gate_of_1_13_0():
    """SG5: the matched worker spills only past mean + margin and 1.5 x mean; margin =
    min(64, max(4, 2 sigma)) with sigma = sqrt(mean) (kvsim's reading; only the 4 floor is checked
    against the binary, tests/test_fleet_router_oracle.py)."""
    r = make_router("cache_aware", 3)
    a = seq(0, 400)
    r.dispatch(req(0, a), 0, 0.0)
    b = req(1, a + seq(7000, 20))
    for loads, spill in (([8, 0, 1], True), ([7, 0, 2], False), ([9, 4, 4], False), ([12, 1, 2], True),
                         ([13, 3, 8], False)):
        r.since[:] = loads
        got = r.candidates(b, [IDLE] * 3, 1)
        assert (0 not in got) == spill, (loads, got)


def test_sg6_a_node_shared_by_two_workers_may_go_to_either():
    """SG6: workers 0 and 1 both inserted A; A+x above the threshold -> either (kvsim: the creator)."""
    r = make_router("cache_aware", 3)
    a = seq(0, 400)
    r.dispatch(req(0, a), 0, 0.0)
    r.dispatch(req(1, a), 1, 0.0)
    x = req(2, a + seq(5000, 30))
    assert r.candidates(x, [IDLE] * 3, 1) == frozenset({0, 1})
    assert r.choose(x, [IDLE] * 3, 1) == 0


def test_cache_aware_overload_veto():
    """1.13.0: a worker reporting >= 8 waiting is left out while another is under; all over -> least loaded."""
    r = make_router("cache_aware", 2)
    r.dispatch(req(0, seq(0, 300)), 0, 0.0)
    hit = req(1, seq(0, 300) + seq(900, 5))
    assert r.candidates(hit, [IDLE, IDLE], 1) == frozenset({0})
    assert r.candidates(hit, [ReplicaLoad(8, 0, 0.1), IDLE], 1) == frozenset({1})
    assert r.candidates(hit, [ReplicaLoad(0, 0, 0.8), IDLE], 1) == frozenset({1})
    assert r.candidates(hit, [ReplicaLoad(9, 0, 0.1), ReplicaLoad(9, 0, 0.1)], 1) == frozenset({0})


def test_tree_eviction_drops_the_oldest_leaves_to_the_bound():
    r = make_router("cache_aware", 2, {"max_tree_size": "100", "eviction_interval_secs": "60"})
    r.dispatch(req(0, seq(0, 80)), 0, 0.0)
    r.dispatch(req(1, seq(1000, 80)), 1, 10.0)
    assert r.tree.total() == 160
    r.dispatch(req(2, seq(5000, 10)), 0, 61.0)        # the 60 s timer fires before this insert
    assert r.tree.total() == 90                        # the older leaf went: shared bound 100
    assert r.tree.match(np.asarray(seq(0, 80)))[0] == 0 and r.tree.match(np.asarray(seq(1000, 80)))[0] == 80
    old = make_router("cache_aware", 2, {"max_tree_size": "100", "version": "0.3.2"})
    old.dispatch(req(0, seq(0, 80)), 0, 0.0)
    old.dispatch(req(1, seq(1000, 80)), 1, 10.0)
    old.dispatch(req(2, seq(5000, 10)), 0, 61.0)      # 0.3.2: per worker, each under 100: nothing goes
    assert old.tree.total() == 170


def test_prefix_hash_same_head_same_worker_and_the_walk():
    r = make_router("prefix_hash", 4, {"prefix_token_count": "32"})
    head = seq(0, 32)
    got = {r.route(req(i, head + seq(1000 * i, 50)), [IDLE] * 4, 0) for i in range(6)}
    assert len(got) == 1
    owner = got.pop()
    r.in_flight[:] = [0] * 4
    r.in_flight[owner] = 20                       # 20 > 1.25 * 5 and 20 - 5 > 10 -> next on the ring
    assert owner not in r.candidates(req(9, head), [IDLE] * 4, 0)


# -- docs/engines/routers.md §3 Dynamo -----------------------------------------------------------------------------------
def test_dy1_load():
    """DY1: r0 = 80 tokens booked on w0; r1 = 112 distinct tokens: w1 14 vs w0 24."""
    r = make_router("dynamo", 2)
    r.dispatch(req(0, seq(0, 80)), 0, 0.0)
    r1 = req(1, seq(1000, 112))
    assert r.costs(r1, 1) == [24.0, 14.0] and r.route(r1, [IDLE] * 2, 1) == 1


def test_dy2_overlap():
    """DY2: w0 holds 4 device blocks of a 96-token prompt: w0 (96-64)/16 + 6 = 8, w1 12."""
    r = make_router("dynamo", 2)
    p = seq(0, 96)
    r.kv_event(0, BlockStored((1, 2, 3, 4), None, np.asarray(p[:64]), 16), 0)
    assert r.costs(req(0, p), 0) == [8.0, 12.0]


def test_dy3_ties_and_dy4_partial_block():
    """DY3: three idle workers tie; DY4: a 40-token prompt costs 40/16 + 2 = 4.5."""
    r = make_router("dynamo", 3, seed=5)
    x = req(0, seq(0, 40))
    assert r.costs(x, 0) == [4.5] * 3 and r.candidates(x, [IDLE] * 3, 0) == frozenset({0, 1, 2})


def test_dy5_approx_ttl():
    """DY5: approx, router_ttl_secs = 1: a routed prompt is matched at +0.6 s and gone at +1.6 s."""
    r = make_router("dynamo", 2, {"mode": "approx", "router_ttl_secs": "1"})
    p = seq(0, 64)
    w = r.route(req(0, p), [IDLE] * 2, 0.0)
    r.finished(req(0, p), w, 0.0)
    assert r.request_overlap(req(1, p), w, 0.6) == 4 and r.request_overlap(req(1, p), w, 1.6) == 0


def test_dy6_host_tier_events_leave_the_device_overlap():
    """DY6: CPU-tier events are not device overlap (the host credit is not modelled)."""
    r = make_router("dynamo", 2)
    p = np.asarray(seq(0, 32))
    r.kv_event(0, BlockStored((1, 2), None, p, 16, medium="CPU"), 0)
    assert r.request_overlap(req(0, p), 0, 0) == 0
    r.kv_event(0, BlockStored((1, 2), None, p, 16), 0)
    r.kv_event(0, BlockRemoved((2,)), 0)
    assert r.request_overlap(req(1, p), 0, 0) == 1


def test_dy7_namespaces():
    """DY7: a store with cache_salt S matches only requests with salt S; LoRA L only LoRA L."""
    r = make_router("dynamo", 2)
    p = seq(0, 32)
    r.kv_event(0, BlockStored((1, 2), None, np.asarray(p), 16, cache_salt="S"), 0)
    r.kv_event(1, BlockStored((3, 4), None, np.asarray(p), 16, lora_name="L"), 0)
    assert r.request_overlap(req(0, p, cache_salt="S"), 0, 0) == 2
    assert r.request_overlap(req(1, p), 0, 0) == 0
    assert r.request_overlap(req(2, p, lora="L"), 1, 0) == 2
    assert r.request_overlap(req(3, p, lora="L", cache_salt="S"), 1, 0) == 0


def test_dynamo_prefill_done_and_finished_release_load():
    r = make_router("dynamo", 2)
    a = req(0, seq(0, 80))
    r.dispatch(a, 0, 0.0)
    b = req(1, seq(1000, 112))
    r.prefill_done(a, 0, 1)
    assert r.costs(b, 1)[0] == 112 / 16 + 12
    r.finished(a, 0, 2)
    assert r.costs(b, 2) == [14.0, 14.0]


# -- docs/engines/routers.md §4 llm-d ------------------------------------------------------------------------------------
def _llmd_with_matches(matched: dict[int, int], blocks: int = 10):
    """An llmd_precise router whose pods hold the first ``matched[pod]`` GPU blocks of a request."""
    r = make_router("llmd_precise", 2, block_size=16)
    p = seq(0, 16 * blocks)
    for pod, n in matched.items():
        if n:
            r.kv_event(pod, BlockStored(tuple(range(n)), None, np.asarray(p[:16 * n]), 16), 0)
    return r, req(0, p)


def test_ld1_load_beats_prefix():
    """LD1: A 8/10 matched, queue 4, KV 0.5 -> 3.4; B 0 matched, queue 0, KV 0.2 -> 3.6 -> B."""
    r, x = _llmd_with_matches({0: 8})
    loads = [ReplicaLoad(4, 0, 0.5), ReplicaLoad(0, 0, 0.2)]
    assert r.scores(x, loads, 0) == pytest.approx([3.4, 3.6])
    assert r.candidates(x, loads, 0) == frozenset({1})


def test_ld2_prefix_wins():
    """LD2: A 3.4 vs B (queue 3, KV 0.6) 2.8 -> A."""
    r, x = _llmd_with_matches({0: 8})
    loads = [ReplicaLoad(4, 0, 0.5), ReplicaLoad(3, 0, 0.6)]
    assert r.scores(x, loads, 0) == pytest.approx([3.4, 2.8])
    assert r.candidates(x, loads, 0) == frozenset({0})


def test_ld3_approx_counts_are_not_consecutive():
    """LD3: A holds h1,h2; B holds h2 only -> walk h1 {A}, h2 {A,B}, h3 nobody: A 2/3, B 1/3."""
    r = make_router("llmd_approx", 2)
    x = req(0, seq(0, 64 * 3))
    h1, h2, _ = r.hashes(x)
    r.holders = {h1: {0}, h2: {0, 1}}
    assert r.prefix_scores(x, 0) == pytest.approx([2 / 3, 1 / 3])
    h3 = r.hashes(x)[2]
    r.holders = {h1: {0}, h3: {0, 1}}                  # nobody holds h2: the walk stops there
    assert r.prefix_scores(x, 0) == pytest.approx([1 / 3, 0.0])


def test_ld4_block_floor_and_partial_block():
    """LD4: blockSizeTokens 16 -> 64 used; 62 pseudo-tokens are one partial block, still hashed."""
    r = make_router("llmd_approx", 2, {"blockSizeTokens": "16"})
    assert r.block == 64 and len(r.hashes(req(0, seq(0, 62)))) == 1
    r.route(req(1, seq(0, 62)), [IDLE] * 2, 0)
    assert max(r.prefix_scores(req(2, seq(0, 62)), 0)) == 1.0


def test_ld5_precise_tiers():
    """LD5: A: blocks 1-2 GPU, 3 CPU -> 2.8/4 = 0.7; B: 1-4 on CPU only -> 0.8 -> B higher."""
    r = make_router("llmd_precise", 2, block_size=16)
    p = np.asarray(seq(0, 64))
    r.kv_event(0, BlockStored((1, 2, 3), None, p[:48], 16), 0)
    r.kv_event(0, BlockRemoved((3,)), 0)
    r.kv_event(0, BlockStored((3,), None, np.empty(0, dtype=np.int64), 16, medium="CPU"), 0)
    r.kv_event(1, BlockStored((1, 2, 3, 4), None, p, 16, medium="CPU"), 0)
    assert r.prefix_scores(req(0, p), 0) == pytest.approx([0.7, 0.8])


def test_ld6_ties_are_the_whole_set():
    """LD6: two identical pods -> either."""
    r = make_router("llmd_approx", 2, seed=1)
    assert r.candidates(req(0, seq(0, 100)), [IDLE] * 2, 0) == frozenset({0, 1})


# -- docs/engines/routers.md §5 production-stack --------------------------------------------------------------------------
def test_ps1_chunks_match():
    """PS1: A = 300 chars, then A+x -> chunks 1-2 (256 chars) match -> A's worker."""
    r = make_router("prefixaware", 3, seed=4)
    a = seq(0, 300)
    w = r.route(req(0, a), [IDLE] * 3, 0)
    assert r.match(req(1, a + seq(900, 50))) == (256, frozenset({w}))


def test_ps2_127_shared_characters_match_nothing():
    r = make_router("prefixaware", 3)
    r.dispatch(req(0, seq(0, 127) + [1]), 0, 0)
    assert r.candidates(req(1, seq(0, 127) + [2]), [IDLE] * 3, 0) == frozenset({0, 1, 2})


def test_ps3_two_holders():
    """PS3: A routed to w0 and w1 -> A+y random between w0 and w1; the trie never evicts."""
    r = make_router("prefixaware", 3)
    a = seq(0, 256)
    r.dispatch(req(0, a), 0, 0)
    r.dispatch(req(1, a), 1, 0)
    assert r.candidates(req(2, a + seq(5000, 10)), [IDLE] * 3, 1e9) == frozenset({0, 1})
