"""Fleets in the drivers: one replica is today's engine, the attribution is ordered, replicas run in
parallel, event routers read the replicas' real caches, and a cache-aware router wins where it should."""
from __future__ import annotations

import numpy as np
import pytest

from kvsim.drive.concurrent import ReplayMode, run_concurrent
from kvsim.drive.sequential import replay
from kvsim.engines.options import SimOptions
from kvsim.fleet.bounds import bounds
from kvsim.fleet.concurrent import run_fleet_concurrent
from kvsim.fleet.config import FleetSpec
from kvsim.fleet.keys import chain_keys, root_key
from kvsim.fleet.routers import ROUTERS
from kvsim.fleet.sequential import fleet_replay
from kvsim.io.trace.columns import Trace
from kvsim.workloads.shared_prefix import trace as gsp_trace

ROUTER_CASES = [(name, ()) for name in ROUTERS] + [("dynamo", (("mode", "approx"),))]
COLUMNS = ("cached_tokens", "rejected", "read_cache", "evictions", "evicted_tokens")
STEP_COLUMNS = ("cached_tokens", "first_token_step", "finish_step", "preemptions", "rejected", "output_tokens")
TIMED = dict(model="llama-3-8b", gpu="H100-80GB")


def workload(seed: int, n: int = 120, vocab: int = 400) -> Trace:
    """Requests sharing a few prefixes (some cut short), sessions, timestamps and arrival steps."""
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, vocab, rng.integers(8, 160)) for _ in range(6)]
    prompts = []
    for _ in range(n):
        p = prefixes[rng.integers(0, len(prefixes))]
        prompts.append(np.concatenate([p[:rng.integers(1, len(p) + 1)], rng.integers(0, vocab, rng.integers(1, 40))]))
    outputs = [rng.integers(0, vocab, rng.integers(1, 24)) for _ in range(n)]
    at = np.sort(rng.uniform(0, 12, n))
    return Trace.from_prompts(prompts, outputs=outputs, arrival=at, arrival_step=(at * 5).astype(int),
                              sessions=[f"s{rng.integers(0, 12)}" for _ in range(n)])


@pytest.fixture(scope="module")
def trace() -> Trace:
    return workload(7)


def same_steps(a, b) -> bool:
    return all(np.array_equal(getattr(a, k), getattr(b, k)) for k in STEP_COLUMNS) and \
        a.finished == b.finished and a.steps == b.steps


@pytest.mark.parametrize("policy", ["apc", "radix"])
@pytest.mark.parametrize("router,options", ROUTER_CASES)
def test_one_replica_is_the_single_engine_replay_sequential(trace, policy, router, options):
    """--replicas 1 under any router: the sequential replay, request for request."""
    opts = SimOptions(capacity_tokens=1500)
    single = replay(policy, trace, opts)
    fleet = fleet_replay(policy, trace, opts, FleetSpec(1, router, options)).result
    assert single.evictions.sum() > 0                       # the capacity bites
    for k in COLUMNS:
        assert np.array_equal(getattr(fleet, k), getattr(single, k)), k
    assert fleet.config == single.config and fleet.peak_used_tokens == single.peak_used_tokens


@pytest.mark.parametrize("policy", ["apc", "radix"])
@pytest.mark.parametrize("router,options", ROUTER_CASES)
def test_one_replica_is_the_single_engine_replay_steps(trace, policy, router, options):
    """--replicas 1 --replay steps under any router: the scheduler's replay, step for step."""
    opts, mode = SimOptions(capacity_tokens=1500), ReplayMode("steps")
    single = run_concurrent(trace, [policy], opts, mode)[policy]
    fleet = run_fleet_concurrent(trace, [policy], opts, mode, FleetSpec(1, router, options))[policy]
    assert same_steps(fleet.steps, single.steps)
    assert np.array_equal(fleet.released, single.released)


@pytest.mark.parametrize("policy", ["apc", "radix"])
@pytest.mark.parametrize("router", ["cache_aware", "dynamo"])
@pytest.mark.parametrize("arrivals", ["logged", "closed-loop"])
def test_one_replica_is_the_single_engine_replay_timed(trace, policy, router, arrivals):
    """--replicas 1 --replay timed: the same steps, the same latencies, with and without the cache."""
    opts, mode = SimOptions(capacity_tokens=1500, **TIMED), ReplayMode("timed", arrivals=arrivals)
    single = run_concurrent(trace, [policy], opts, mode)[policy]
    fleet = run_fleet_concurrent(trace, [policy], opts, mode, FleetSpec(1, router))[policy]
    assert same_steps(fleet.steps, single.steps)
    for a, b in ((fleet.timed, single.timed), (fleet.uncached, single.uncached)):
        for k in ("ttft", "e2e", "queueing"):
            assert np.allclose(getattr(a, k), getattr(b, k), equal_nan=True), k
        assert a.busy_s == pytest.approx(b.busy_s) and a.makespan_s == pytest.approx(b.makespan_s)


def test_closed_loop_steps_with_one_replica(trace):
    opts, mode = SimOptions(capacity_tokens=1500), ReplayMode("steps", arrivals="closed-loop")
    single = run_concurrent(trace, ["apc"], opts, mode)["apc"]
    fleet = run_fleet_concurrent(trace, ["apc"], opts, mode, FleetSpec(1, "least_load"))["apc"]
    assert same_steps(fleet.steps, single.steps)


@pytest.mark.parametrize("seed", range(8))
def test_fleet_bound_over_routed_bound_over_delivered(seed):
    """On random fleets, per request: one shared unlimited cache >= one per replica >= delivered."""
    rng = np.random.default_rng(100 + seed)
    t = workload(seed, n=90, vocab=60)
    for policy in ("apc", "radix"):
        opts = SimOptions(capacity_tokens=int(rng.choice([300, 800, 2500])), block_size=int(rng.choice([4, 16])),
                          page_size=int(rng.choice([1, 4])))
        fleet = FleetSpec(int(rng.integers(2, 6)), str(rng.choice(["round_robin", "cache_aware", "dynamo",
                                                                      "llmd_precise", "random", "prefixaware"])),
                          seed=seed)
        seq = fleet_replay(policy, t, opts, fleet)
        b = bounds(policy, t, opts, seq.replica, seq.order)
        ok = ~seq.result.rejected
        assert (b.fleet >= b.routed).all() and (b.routed[ok] >= seq.result.cached_tokens[ok]).all()
        run = run_fleet_concurrent(t, [policy], opts, ReplayMode("steps"), fleet)[policy]
        ok = ~run.steps.rejected
        assert (run.bounds.fleet >= run.bounds.routed).all()
        assert (run.bounds.routed[ok] >= run.steps.cached_tokens[ok]).all()
        f = run.fleet_summary(t)
        assert f["fleet_bound_hit_rate"] >= f["routed_bound_hit_rate"] >= f["token_hit_rate"]


@pytest.mark.parametrize("seed", range(6))
def test_bounds_equal_the_shares_replayed_one_by_one(seed):
    """The fleet's bounds on vLLM's engine come from the log keyed once and an unlimited cache
    as a set of keys (``run_unlimited``); they equal each share replayed on its own through the
    compiled sequential engine on an unlimited pool (``bounds._cached``): namespaces, prompt-
    logprob requests, exact hashes, block sizes, the 0.11 profile, orders that are not the log's."""
    from kvsim.drive.requests import workload as flat_workload
    from kvsim.fleet.bounds import _cached, _unlimited_replayer, unlimited

    rng = np.random.default_rng(300 + seed)
    base = workload(seed, n=150, vocab=int(rng.choice([30, 400])))
    n = len(base)
    prompts = [base.prompt(i) for i in range(n)]
    outputs = [rng.integers(0, 400, rng.integers(1, 40)) for _ in range(n)]
    t = Trace.from_prompts(prompts, outputs=outputs,
                           loras=[None if rng.random() < 0.6 else f"l{rng.integers(2)}" for _ in range(n)],
                           cache_salts=[None if rng.random() < 0.7 else f"s{rng.integers(2)}" for _ in range(n)],
                           prompt_logprobs=list(rng.random(n) < 0.15))
    opts = unlimited(SimOptions(block_size=int(rng.choice([1, 4, 16])), hash_algo=str(rng.choice(["fast", "sha256"])),
                                engine_version=str(rng.choice(["0.33", "0.11"]))))
    work = flat_workload(t)
    fast = _unlimited_replayer("apc", work, opts)
    assert fast is not None and _unlimited_replayer("radix", work, opts) is None
    order = rng.permutation(n)
    replica = rng.integers(0, 3, n)
    hits = 0
    for share in [order, np.arange(n), *(order[replica[order] == r] for r in range(3)), order[:0]]:
        expected = _cached("apc", t, work, share, opts)
        assert np.array_equal(fast(share), expected)
        hits += int(expected.sum() > 0)
    assert hits >= 4                          # the shares share prefixes: the cache is used


@pytest.mark.parametrize("seed", range(4))
def test_bounds_take_the_fleets_keys_where_they_are_the_same(seed, monkeypatch):
    """A fleet's replay keys the log once (``LogKeys``); its bounds take their keys from it (each
    request's kept blocks, the first of its log keys) instead of hashing the log again: the same
    keyed workload as hashing it (namespaces, prompt logprobs, requests of a block or less, block
    sizes), and a log of another block size, another hash or other namespace keys is not used."""
    from kvsim.drive.requests import workload as flat_workload
    from kvsim.engines.vllm.manager_jit import JitKVCacheManager
    from kvsim.engines.vllm.hashing import fast_namespace_arrays
    from kvsim.engines.vllm.sequential import APCFast, keyed_from_log
    from kvsim.engines.vllm.settings import APCSettings
    from kvsim.engines.vllm import rules

    rng = np.random.default_rng(700 + seed)
    base = workload(seed, n=120, vocab=50)
    n = len(base)
    prompts = [base.prompt(i)[:int(rng.integers(0, 3))] if rng.random() < 0.1 else base.prompt(i) for i in range(n)]
    t = Trace.from_prompts(prompts, outputs=[rng.integers(0, 400, rng.integers(1, 40)) for _ in range(n)],
                           loras=[None if rng.random() < 0.6 else f"l{rng.integers(2)}" for _ in range(n)],
                           cache_salts=[None if rng.random() < 0.7 else f"s{rng.integers(2)}" for _ in range(n)],
                           prompt_logprobs=list(rng.random(n) < 0.15))
    work = flat_workload(t)
    B = int(rng.choice([1, 4, 16]))
    log = JitKVCacheManager(64, B).log_keys(np.arange(n), work.prompt_tokens, work.prompt_offsets, work.output_tokens,
                                            work.output_offsets, t.names("lora"), t.names("cache_salt"))
    engine = APCFast(APCSettings(block_size=B))
    hashed = engine.workload(work)
    L, M = hashed.prompt_len, hashed.output_len
    every, first = fast_namespace_arrays(*engine._lora_salt(work.lora, work.cache_salt))
    taken = keyed_from_log(L, M, rules.reads_cache(work.prompt_logprobs), every, first, B, log)
    for name in ("prompt_len", "output_len", "read", "keys", "key_off"):
        np.testing.assert_array_equal(getattr(taken, name), getattr(hashed, name), err_msg=name)
    assert len(hashed.keys) > 0 and (every != 0).any() and (first != 0).any()
    # not the same keys: hashed instead
    assert keyed_from_log(L, M, hashed.read, every, first, B + 1, log) is None
    assert keyed_from_log(L, M, hashed.read, every ^ np.uint64(1), first, B, log) is None
    # through the bounds: the log's keys are taken (no hashing) and the bounds are the same
    from kvsim.fleet.bounds import _unlimited_replayer, unlimited

    opts = unlimited(SimOptions(block_size=B))
    order, replica = rng.permutation(n), rng.integers(0, 3, n)
    expected = bounds("apc", t, opts, replica, order)
    monkeypatch.setattr(APCFast, "workload", lambda *a: pytest.fail("hashed the log again"))
    assert _unlimited_replayer("apc", work, opts, log) is not None
    got = bounds("apc", t, opts, replica, order, log)
    assert np.array_equal(got.fleet, expected.fleet) and np.array_equal(got.routed, expected.routed)
    assert expected.fleet.sum() > 0


@pytest.mark.parametrize("router", ["dynamo", "round_robin"])
def test_a_fleet_command_keys_its_log_once_for_its_bounds(router, monkeypatch):
    """``run_fleet_concurrent`` (the CLI's fleet): the bounds take the keys the replay computed
    (the log is not hashed again) and equal the bounds hashed on their own."""
    from kvsim.engines.vllm.sequential import APCFast

    t = workload(3, n=80, vocab=60)
    opts = SimOptions(capacity_tokens=2000, **TIMED)
    run = run_fleet_concurrent(t, ["apc"], opts, ReplayMode("timed"), FleetSpec(3, router))["apc"]
    expected = bounds("apc", t, opts, run.line.replica, np.asarray(run.line.order, np.int64))
    monkeypatch.setattr(APCFast, "workload", lambda *a: pytest.fail("hashed the log again"))
    again = run_fleet_concurrent(t, ["apc"], opts, ReplayMode("timed"), FleetSpec(3, router))["apc"]
    assert np.array_equal(again.bounds.fleet, expected.fleet) and np.array_equal(again.bounds.routed, expected.routed)
    assert expected.fleet.sum() > 0


def test_replicas_run_in_parallel_in_timed():
    """Two equal requests at once on two replicas: each is served as if alone (its own timeline)."""
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 1000, 3000), rng.integers(0, 1000, 3000)]
    t = Trace.from_prompts(prompts, output_lengths=[50, 50], arrival=[0.0, 0.0])
    opts, mode = SimOptions(**TIMED), ReplayMode("timed")
    alone = run_concurrent(t.select([0]), ["apc"], opts, mode)["apc"].timed
    both = run_concurrent(t, ["apc"], opts, mode)["apc"].timed
    fleet = run_fleet_concurrent(t, ["apc"], opts, mode, FleetSpec(2, "round_robin"))["apc"]
    assert list(fleet.replica) == [0, 1]
    assert fleet.timed.ttft[0] == pytest.approx(alone.ttft[0])
    assert fleet.timed.ttft[1] == pytest.approx(alone.ttft[0], rel=0.01)    # its own replica, not a queue
    assert fleet.timed.makespan_s < both.makespan_s
    assert fleet.timed.busy_s == pytest.approx(2 * alone.busy_s, rel=0.01)


def radix_pages(tree, page: int) -> set[int]:
    """Router keys of every page in a radix tree: the chain of page blocks from each namespace root."""
    out: set[int] = set()
    stack = [(c, root_key(c.ns if c.ns is not None else (None, None)), ) for c in tree.root.children.values()]
    while stack:
        node, parent = stack.pop()
        keys = chain_keys(node.key, page, parent)
        out.update(keys)
        stack.extend((c, keys[-1]) for c in node.children.values())
    return out


@pytest.mark.parametrize("policy", ["apc", "radix"])
def test_event_routers_hold_what_the_replicas_cache(policy, trace):
    """Dynamo fed by the replicas' BlockStored / BlockRemoved holds exactly the blocks they cache."""
    opts = SimOptions(capacity_tokens=1200, page_size=2)
    run = fleet_replay(policy, trace, opts, FleetSpec(3, "dynamo"))
    assert run.result.evictions.sum() > 0
    for r, server in enumerate(run.servers):
        held = set(run.router.device[r])
        if policy == "apc":
            emap = run.router.engine_keys[r]
            cached = {emap[b.block_hash] for b in server.cache.pool.blocks if b.block_hash is not None}
        else:
            cached = radix_pages(server.cache.tree, 2)
        assert held == cached and held


def test_events_in_steps_mode_match_the_caches(trace):
    """Under load too (the scheduler's readable manager and tree), llm-d precise sees the real caches."""
    for policy in ("apc", "radix"):
        run = run_fleet_concurrent(trace, [policy], SimOptions(capacity_tokens=1200), ReplayMode("steps"),
                                   FleetSpec(2, "llmd_precise"))[policy]
        held = [set(run.router.tiers[r]) for r in range(2)]
        assert all(held) and held[0] != held[1]


def test_generated_shared_prefix_cache_aware_beats_round_robin():
    """SGLang's generated-shared-prefix workload (scaled down), 8 replicas, steps, tight memory:
    cache_aware delivers >= 1.5x round_robin's hit rate, on both engines."""
    t = gsp_trace(groups=16, prompts_per_group=8, system_prompt_len=512, question_len=32, output_len=32, rate=20.0)
    opts, mode = SimOptions(capacity_tokens=1600), ReplayMode("steps")
    for policy in ("apc", "radix"):
        rate = {}
        for router in ("round_robin", "cache_aware"):
            run = run_fleet_concurrent(t, [policy], opts, mode, FleetSpec(8, router))[policy]
            rate[router] = run.fleet_summary(t)["token_hit_rate"]
        assert rate["cache_aware"] >= 1.5 * rate["round_robin"], (policy, rate)


@pytest.mark.parametrize("policy", ["apc", "radix"])
@pytest.mark.parametrize("mode", ["steps", "timed"])
def test_each_replica_runs_as_it_would_alone(trace, policy, mode):
    """In a fleet, each replica's requests are served step for step as that replica alone would
    serve its share of the log: the fleet clock adds routing, not a different engine."""
    opts = SimOptions(capacity_tokens=1500, **(TIMED if mode == "timed" else {}))
    replay_mode = ReplayMode(mode)
    fleet = run_fleet_concurrent(trace, [policy], opts, replay_mode, FleetSpec(3, "cache_aware"))[policy]
    for r in range(3):
        idx = np.flatnonzero(fleet.replica == r)
        alone = run_concurrent(trace.select(idx), [policy], opts, replay_mode)[policy]
        for k in ("cached_tokens", "first_token_step", "finish_step", "preemptions"):
            assert np.array_equal(getattr(fleet.steps, k)[idx], getattr(alone.steps, k)), (r, k)
        if mode == "timed":
            assert np.allclose(fleet.timed.ttft[idx], alone.timed.ttft, equal_nan=True)


@pytest.mark.parametrize("policy", ["apc", "radix"])
@pytest.mark.parametrize("router", ["round_robin", "least_load", "cache_aware", "dynamo"])
@pytest.mark.parametrize("arrivals", ["logged", "closed-loop"])
def test_timed_decode_runs_in_a_fleet_equal_step_by_step(policy, router, arrivals, monkeypatch):
    """The timed fleet takes decode-only stretches in bulk, cut before the next arrival (and, closed
    loop, before another busy replica's next step): the same routes, steps and seconds as one step
    at a time. (The readable fleet's shortcut: vLLM's compiled fleet, which takes every step,
    is checked against the readable one in ``test_fleet_jit.py``.)"""
    from kvsim.engines.sglang.scheduler import SglangEngine
    from kvsim.engines.vllm.scheduler import VllmEngine

    monkeypatch.setenv("KVSIM_VLLM_SCHEDULER", "readable")

    Engine = VllmEngine if policy == "apc" else SglangEngine

    rng = np.random.default_rng(11)
    base = workload(11, n=160)
    outputs = [rng.integers(0, 400, rng.integers(20, 160)) for _ in range(len(base))]
    t = Trace.from_prompts([base.prompt(i) for i in range(len(base))], outputs=outputs,
                           arrival=np.sort(rng.uniform(0, 3, len(base))),
                           sessions=[f"s{rng.integers(0, 30)}" for _ in range(len(base))])
    opts, mode = SimOptions(capacity_tokens=2500, **TIMED), ReplayMode("timed", arrivals=arrivals)
    original, taken = Engine.fast_forward, []

    def counted(self, step, horizon):
        taken.append(original(self, step, horizon))
        return taken[-1]
    monkeypatch.setattr(Engine, "fast_forward", counted)
    bulk = run_fleet_concurrent(t, [policy], opts, mode, FleetSpec(3, router))[policy]
    assert sum(taken) > 200                    # the shortcut really ran
    monkeypatch.setattr(Engine, "fast_forward", lambda self, step, horizon: 0)
    slow = run_fleet_concurrent(t, [policy], opts, mode, FleetSpec(3, router))[policy]
    assert same_steps(bulk.steps, slow.steps)
    assert np.array_equal(bulk.replica, slow.replica) and np.array_equal(bulk.released, slow.released)
    for a, b in ((bulk.timed, slow.timed), (bulk.uncached, slow.uncached)):
        for k in ("ttft", "e2e", "queueing", "prefill_tokens", "decode_tokens"):
            assert np.array_equal(getattr(a, k), getattr(b, k), equal_nan=True), k
        assert a.busy_s == b.busy_s and a.makespan_s == b.makespan_s


def namespaced(seed: int, n: int = 150) -> Trace:
    """Shared prefixes under LoRA adapters and cache salts (some requests without), long replies,
    prompt-logprob requests: namespaces, evictions and preemptions for an event-fed router."""
    rng = np.random.default_rng(seed)
    base = workload(seed, n=n, vocab=80)
    pick = lambda *names: [names[i] for i in rng.integers(0, len(names), n)]   # noqa: E731
    return Trace.from_prompts([base.prompt(i) for i in range(n)],
                              outputs=[rng.integers(0, 80, rng.integers(4, 90)) for _ in range(n)],
                              arrival=np.sort(rng.uniform(0, 0.3, n)), arrival_step=np.sort(rng.integers(0, 60, n)),
                              loras=pick(None, None, "a", "b"), cache_salts=pick(None, None, "", "t1"),
                              prompt_logprobs=list(rng.random(n) < 0.1))


@pytest.mark.parametrize("mode", ["steps", "timed"])
@pytest.mark.parametrize("seed", range(3))
def test_dynamo_reading_the_pools_equals_being_fed_their_events(mode, seed, monkeypatch):
    """Dynamo's event-fed index read straight from the replicas' compiled pools: the same routes,
    steps and latencies as the router fed their BlockStored / BlockRemoved."""
    t = namespaced(seed)
    opts = SimOptions(capacity_tokens=900, **(TIMED if mode == "timed" else {}))
    fleet = FleetSpec(3, "dynamo")
    read = run_fleet_concurrent(t, ["apc"], opts, ReplayMode(mode), fleet)["apc"]
    assert read.router.devices is not None
    monkeypatch.setattr("kvsim.engines.vllm.events.reads_devices", lambda settings: False)
    fed = run_fleet_concurrent(t, ["apc"], opts, ReplayMode(mode), fleet)["apc"]
    assert fed.router.devices is None and fed.steps.preemptions.sum() > 0
    assert same_steps(read.steps, fed.steps)
    assert np.array_equal(read.replica, fed.replica) and len(set(read.replica.tolist())) == 3
    if mode == "timed":
        for k in ("ttft", "e2e", "queueing"):
            assert np.array_equal(getattr(read.timed, k), getattr(fed.timed, k), equal_nan=True), k


def test_dynamo_fed_events_under_load_holds_exactly_the_pools_keys(monkeypatch):
    """Why the pools can be read instead: at every routing decision of a loaded fleet, the index
    built from each replica's events holds exactly the hashes cached in that replica's pool."""
    from kvsim.fleet.routers.dynamo import DynamoRouter

    monkeypatch.setattr("kvsim.engines.vllm.events.reads_devices", lambda settings: False)
    checks = []
    route = DynamoRouter.route

    def checked_route(self, req, loads, now):
        for r, engine in enumerate(engines):
            pool = engine.scheduler.cache.pool
            cached = {b.block_hash for b in pool.blocks if b.block_hash is not None}
            emap = self.engine_keys[r]
            assert set(emap) == cached and set(self.device[r]) == {emap[h] for h in cached}
            checks.append(len(cached))
        return route(self, req, loads, now)
    monkeypatch.setattr(DynamoRouter, "route", checked_route)
    import kvsim.fleet.concurrent as fc
    engines = []
    make = fc.make_engine
    monkeypatch.setattr(fc, "make_engine", lambda *a, **k: engines.append(make(*a, **k)) or engines[-1])
    run = run_fleet_concurrent(namespaced(5), ["apc"], SimOptions(capacity_tokens=900), ReplayMode("steps"),
                               FleetSpec(3, "dynamo"), with_bounds=False)["apc"]
    assert run.steps.preemptions.sum() > 0 and sum(checks) > 1000


@pytest.mark.parametrize("router,options,fed", [("dynamo", (), False), ("dynamo", (), True),
                                                 ("dynamo", (("mode", "approx"),), False)])
def test_dynamo_booked_blocks_are_a_prefix(monkeypatch, router, options, fed):
    """Why Dynamo's cost counts a request's booked blocks by bisection: at every decision of a
    loaded fleet (namespaces, preemption) the count equals Dynamo's block-by-block count."""
    import kvsim.fleet.routers.dynamo as dynamo

    if fed:
        monkeypatch.setattr("kvsim.engines.vllm.events.reads_devices", lambda settings: False)
    counts = []
    bisected = dynamo.booked_prefix

    def checked(active, keys):
        n = bisected(active, keys)
        assert n == sum(k in active for k in keys)
        counts.append((n, len(keys)))
        return n
    monkeypatch.setattr(dynamo, "booked_prefix", checked)
    for mode in ("steps", "timed"):
        run_fleet_concurrent(namespaced(7), ["apc"], SimOptions(capacity_tokens=900, **TIMED), ReplayMode(mode),
                             FleetSpec(3, router, options), with_bounds=False)
    assert len(counts) > 500
    assert sum(0 < n < k for n, k in counts) > 50      # partly booked prompts, not only all or nothing
