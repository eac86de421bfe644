"""A fleet of vLLM replicas on the compiled loop (``scheduler_jit.FleetReplica``) equals the readable fleet.

Seeded fleets of 2-4 replicas (tight memory that preempts, namespaces, prompt-logprob requests,
bursts, requests that never fit, sync and async, chunked and not) behind every router kvsim
has, on the step clock and the timed clock (the roofline): per request its replica, cached
tokens, first-token and finish steps, outputs, preemptions and rejections; the finishing
order; each replica's timeline float for float, steps and clock; the fleet's ``order`` and
peaks; and the router's state at the end (its seeded RNG's included) are equal. Routers fed
by raw KV events, closed-loop releases and other step costs fall back to the readable fleet.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "oracle"))
from sched_workloads import SchedMix, random_workload

from kvsim.costs.roofline import DevicePeak
from kvsim.drive.clock import Releases
from kvsim.drive.concurrent import ReplayMode
from kvsim.drive.step_cost import RooflineStepCost
from kvsim.drive.timed import make_engine
from kvsim.engines.options import SimOptions
from kvsim.engines.vllm import events, scheduler_jit
from kvsim.engines.vllm.scheduler import VllmSchedSettings
from kvsim.fleet.base import RouteRequest
from kvsim.fleet.clock import run_fleet
from kvsim.fleet.concurrent import fleet_frame, run_fleet_concurrent
from kvsim.fleet.config import FleetSpec
from kvsim.fleet.routers import ROUTERS, make_router
from kvsim.drive.requests import Ragged
from kvsim.models import get_model

BURSTY = dict(burst=(5, 40), gap=12.0)
LONG = dict(system_len=(40, 300), user_len=(10, 200), output_len=(20, 120))
# (seed, replicas, workload knobs, block size, memory (x the largest request's blocks), settings)
CASES = [
    (61, 2, {}, 16, 1.0, dict(max_num_batched_tokens=256, max_num_seqs=16, async_scheduling=False)),
    (62, 3, dict(p_namespace=0.6, p_session=0.6, p_logprob=0.2), 16, 1.2,
     dict(max_num_batched_tokens=256, max_num_seqs=16, watermark=0.05)),
    (63, 4, dict(output_len=(20, 150), **BURSTY), 8, 1.0, dict(max_num_batched_tokens=128, max_num_seqs=32,
                                                              long_prefill_token_threshold=32)),
    (64, 3, LONG, 16, 0.7, dict(max_num_batched_tokens=256, max_num_seqs=16)),      # some never fit
    (65, 2, BURSTY, 16, 2.0, dict(max_num_batched_tokens=4096, max_num_seqs=256, enable_chunked_prefill=False,
                                      max_model_len=4096)),
    (66, 3, dict(p_namespace=0.5), 4, 1.0, dict(max_num_batched_tokens=64, max_num_seqs=8, hash_algo="sha256",
                                                async_scheduling=False)),
]
ROUTER_CASES = [(name, {}) for name in ROUTERS] + [("dynamo", {"mode": "approx"}),
                                                   ("cache_aware", {"version": "0.3.2"})]
COST = RooflineStepCost(get_model("llama-3-8b"), DevicePeak("H100", 989.4e12, 66.9e12, 3.35e12))
CLOCKS = {"steps": None, "timed": 0.05}         # seconds per logged step
STEP_FIELDS = ("rejected", "cached_tokens", "first_token_step", "finish_step", "preemptions", "output_tokens")


class Requests:
    """The workload's requests as a router sees them (sessions by a fixed rule)."""

    def __init__(self, w) -> None:
        self.w = w

    def request(self, i: int, now: float) -> RouteRequest:
        w = self.w
        return RouteRequest(i, str(i), np.asarray(w.prompts[i], np.int64), now, f"s{i % 7}", w.loras[i],
                            w.salts[i] or None)


def workload(seed, knobs, B, factor, extra, n=160):
    w = random_workload(seed, SchedMix(n=n, **knobs))
    need = -(-w.peak_tokens() // B)
    return w, VllmSchedSettings(num_gpu_blocks=int(factor * int(need.max())) + 1, block_size=B, **extra)


def _ragged(arrays) -> Ragged:
    """``arrays`` as views of one flat array, as the CLI hands a trace's prompts to the engines."""
    offsets = np.zeros(len(arrays) + 1, np.int64)
    offsets[1:] = np.cumsum([len(a) for a in arrays])
    return Ragged(np.concatenate([np.asarray(a, np.int64) for a in arrays]), offsets)


def fleet(w, settings, replicas, router_name, options, clock, readable, monkeypatch, seed=0, flat=False):
    """(result, fleet timeline, router, whether the compiled fleet ran); ``flat``: the engines
    get the prompts and outputs as views of flat arrays (``Ragged``), as from the CLI."""
    monkeypatch.setenv(scheduler_jit.ENV, "readable" if readable else "compiled")
    router = make_router(router_name, replicas, options, block_size=settings.block_size, seed=seed)
    reads = router.needs_events and hasattr(router, "read_devices") and events.reads_devices(settings)
    if router.needs_events and not reads:      # engines that publish KV events (the readable manager)
        settings = events.scheduler_settings(settings)
    prompts, outputs = (_ragged(w.prompts), _ragged(w.outputs)) if flat else (w.prompts, w.outputs)
    engines = [make_engine(settings, prompts, outputs, None, w.loras, w.salts, w.prompt_logprobs)
               for _ in range(replicas)]
    drains = None
    if reads:
        router.read_devices(events.device_blocks(engines))
    elif router.needs_events:
        drains = [events.record(e) for e in engines]
    ran = []
    monkeypatch.setattr(scheduler_jit, "fleet", lambda *a, _f=scheduler_jit.fleet: ran.append(_f(*a)) or ran[-1])
    scale = CLOCKS[clock]
    releases = Releases.logged(w.arrival if scale is None else w.arrival * scale)
    result, line = run_fleet(engines, router, Requests(w), releases, None if scale is None else COST, None, drains)
    return result, line, router, any(r is not None for r in ran)


def plain(v, seen: dict):
    """``v`` as plain values: objects by their attributes, a shared object by its first visit's number."""
    if isinstance(v, (int, float, str, bytes, bool, type(None), frozenset, np.generic)):
        return v
    if id(v) in seen:
        return ("seen", seen[id(v)])
    seen[id(v)] = len(seen)
    if isinstance(v, np.ndarray):
        return ("array", v.dtype.str, v.tolist())
    if isinstance(v, dict):
        return ("dict", [(plain(k, seen), plain(x, seen)) for k, x in v.items()])
    if isinstance(v, (list, tuple)):
        return (type(v).__name__, [plain(x, seen) for x in v])
    if isinstance(v, set):
        return ("set", sorted(v, key=repr))
    if hasattr(v, "getstate"):              # a seeded RNG: where its draws stand
        return ("rng", v.getstate())
    fields = vars(v) if hasattr(v, "__dict__") else {k: getattr(v, k) for k in type(v).__slots__ if hasattr(v, k)}
    return (type(v).__name__, [(k, plain(x, seen)) for k, x in fields.items()])


def router_state(router):
    """What a router holds, without the replicas' devices it reads (their pools)."""
    return plain({k: v for k, v in vars(router).items() if k not in ("devices", "_memo")}, {})


def assert_same(slow, fast) -> None:
    (a, a_line, a_router, _), (b, b_line, b_router, _) = slow, fast
    for name in STEP_FIELDS:
        np.testing.assert_array_equal(getattr(b, name), getattr(a, name), err_msg=name)
    assert b.finished == a.finished
    np.testing.assert_array_equal(b_line.replica, a_line.replica)
    assert b_line.released.dtype == a_line.released.dtype
    np.testing.assert_array_equal(b_line.released, a_line.released)
    assert b_line.order == a_line.order
    assert b_line.steps == a_line.steps and b_line.clocks == a_line.clocks
    assert [type(c) for c in b_line.clocks] == [type(c) for c in a_line.clocks]
    assert b_line.peak_waiting == a_line.peak_waiting and b_line.peak_running == a_line.peak_running
    for x, y in zip(a_line.lines, b_line.lines):
        assert y.step_start == x.step_start and y.step_end == x.step_end
    for name in ("first_scheduled", "prefill_tokens", "decode_tokens"):
        x, y = getattr(a_line, name), getattr(b_line, name)
        assert (x is None) == (y is None), name
        if x is not None:
            np.testing.assert_array_equal(y, x, err_msg=name)
    assert router_state(b_router) == router_state(a_router)


@pytest.mark.parametrize("clock", sorted(CLOCKS))
@pytest.mark.parametrize("router,options", ROUTER_CASES, ids=[f"{n}-{'-'.join(o.values()) or 'default'}"
                                                             for n, o in ROUTER_CASES])
@pytest.mark.parametrize("seed, replicas, knobs, B, factor, extra", CASES, ids=[f"seed{c[0]}" for c in CASES])
def test_compiled_fleet_equals_readable(seed, replicas, knobs, B, factor, extra, router, options, clock,
                                        monkeypatch):
    w, settings = workload(seed, knobs, B, factor, extra)
    slow = fleet(w, settings, replicas, router, options, clock, True, monkeypatch, seed)
    fast = fleet(w, settings, replicas, router, options, clock, False, monkeypatch, seed)
    assert not slow[3]
    # every router runs compiled, but those fed raw KV events (llm-d precise, Dynamo's events
    # over exact sha256 keys): those fall back to the readable fleet, with the same results
    fed = ROUTERS[router](replicas, options).needs_events and not (
        router == "dynamo" and events.reads_devices(settings))
    assert fast[3] == (not fed)
    assert_same(slow, fast)
    r = slow[0]
    served = ~r.rejected
    assert len(set(slow[1].replica[served].tolist())) > 1           # the router spreads the load
    assert (r.finish_step[served] - r.first_token_step[served]).max() > 0
    if factor < 1:
        assert 0 < r.rejected.sum() < len(r.rejected)


@pytest.mark.parametrize("router,options", [("dynamo", {}), ("dynamo", {"mode": "approx"}), ("cache_aware", {}),
                                            ("round_robin", {})], ids=["dynamo", "dynamo-approx", "cache_aware", "rr"])
@pytest.mark.parametrize("seed, replicas, knobs, B, factor, extra", CASES, ids=[f"seed{c[0]}" for c in CASES])
def test_a_flat_log_is_keyed_once_for_the_fleet(seed, replicas, knobs, B, factor, extra, router, options,
                                                monkeypatch):
    """Prompts and outputs as views of flat arrays: the compiled fleet keys every request once
    (``LogKeys``), copies a routed request's keys into its replica's pool and gives the router
    a prompt's keys as views; the fleet equals the readable one, and each view equals the
    prompt's keys hashed (fast keys with prefix caching; sha256 keys are hashed per request)."""
    from kvsim.engines.vllm.manager_jit import JitKVCacheManager

    w, settings = workload(seed, knobs, B, factor, extra)
    logs = []
    monkeypatch.setattr(JitKVCacheManager, "log_keys",
                        lambda *a, _f=JitKVCacheManager.log_keys: logs.append((a[0], _f(*a))) or logs[-1][1])
    slow = fleet(w, settings, replicas, router, options, "timed", True, monkeypatch, seed)
    fast = fleet(w, settings, replicas, router, options, "timed", False, monkeypatch, seed, flat=True)
    fed = router == "dynamo" and not options and not events.reads_devices(settings)     # (readable, as above)
    assert fast[3] == (not fed) and len(logs) == (settings.hash_algo == "fast")
    assert_same(slow, fast)
    for cache, log in logs:
        for i in range(w.n):
            keys = cache.prompt_keys(np.asarray(w.prompts[i]), w.loras[i], w.salts[i] or None, index=i)
            assert keys.base is log.keys
            cache.log = None
            np.testing.assert_array_equal(keys, cache.prompt_keys(np.asarray(w.prompts[i]), w.loras[i],
                                                                  w.salts[i] or None, index=i))
            cache.log = log


def test_the_cases_preempt_and_queue(monkeypatch):
    """The tight cases preempt and queue requests on several replicas: the comparison covers them."""
    preempted = waited = 0
    for seed, replicas, knobs, B, factor, extra in CASES:
        w, settings = workload(seed, knobs, B, factor, extra)
        result, line, _, ran = fleet(w, settings, replicas, "round_robin", {}, "timed", False, monkeypatch)
        assert ran
        preempted += int(result.preemptions.sum() > 0)
        waited += int(max(line.peak_waiting) > 0)
    assert preempted >= 3 and waited == len(CASES)


@pytest.mark.parametrize("why", ["closed-loop", "step cost", "readable", "priority"])
def test_ineligible_fleets_run_readably_with_the_same_results(why, monkeypatch):
    """Closed-loop releases, a step cost other than the roofline, ``KVSIM_VLLM_SCHEDULER=readable``
    and the priority policy: the readable fleet runs (the compiled one is never built)."""
    seed, replicas, knobs, B, factor, extra = CASES[1]
    w, settings = workload(seed, knobs, B, factor, extra)
    if why == "priority":
        settings = dataclasses.replace(settings, policy="priority")
    built = []
    monkeypatch.setattr(scheduler_jit, "FleetReplica", lambda *a, _c=scheduler_jit.FleetReplica: built.append(1)
                        or _c(*a))
    opts = SimOptions(capacity_tokens=1500, model="llama-3-8b", gpu="H100-80GB")
    from kvsim.io.trace.columns import Trace

    t = Trace.from_prompts(w.prompts, outputs=w.outputs, arrival=w.arrival * 0.05, arrival_step=w.arrival,
                           sessions=[f"s{i % 9}" for i in range(w.n)])
    mode = ReplayMode("timed", arrivals="closed-loop" if why == "closed-loop" else "logged")
    if why == "step cost":
        from kvsim.drive import step_cost

        class Other(RooflineStepCost):
            pass
        monkeypatch.setattr(step_cost, "step_cost", lambda *a, **k: Other(get_model("llama-3-8b"), COST.device))
    if why == "readable":
        monkeypatch.setenv(scheduler_jit.ENV, "readable")
    if why != "priority":
        run = run_fleet_concurrent(t, ["apc"], opts, mode, FleetSpec(3, "dynamo"), with_bounds=False)["apc"]
        assert not built and run.steps.finished
        return
    monkeypatch.setenv(scheduler_jit.ENV, "compiled")
    engines = [make_engine(settings, w.prompts, w.outputs, w.priority) for _ in range(3)]
    assert scheduler_jit.fleet(engines, w.arrival, None) is None and not built


@pytest.mark.parametrize("mode", ["steps", "timed"])
@pytest.mark.parametrize("router", ["dynamo", "cache_aware", "llmd_approx", "prefixaware", "round_robin"])
def test_concurrent_fleet_runs_compiled_with_the_same_rows(router, mode, monkeypatch):
    """``kvsim simulate --replicas 3`` end to end (the timed clock's run without prefix caching
    too): the compiled fleet's per-request rows and fleet summary are the readable fleet's."""
    from test_fleet_driver import namespaced

    t = namespaced(3)
    opts = SimOptions(capacity_tokens=900, **(dict(model="llama-3-8b", gpu="H100-80GB") if mode == "timed" else {}))
    runs = []
    for readable in (True, False):
        monkeypatch.setenv(scheduler_jit.ENV, "readable" if readable else "compiled")
        built = []
        monkeypatch.setattr(scheduler_jit, "fleet", lambda *a, _f=scheduler_jit.fleet: built.append(_f(*a))
                            or built[-1])
        run = run_fleet_concurrent(t, ["apc"], opts, ReplayMode(mode), FleetSpec(3, router))["apc"]
        assert any(b is not None for b in built) != readable
        runs.append(run)
    slow, fast = runs
    assert slow.steps.preemptions.sum() > 0
    assert fleet_frame(fast, t).equals(fleet_frame(slow, t))
    assert fast.fleet_summary(t) == slow.fleet_summary(t)
    assert fast.line.order == slow.line.order
    if mode == "timed":
        for k in ("ttft", "e2e", "queueing"):
            np.testing.assert_array_equal(getattr(fast.uncached, k), getattr(slow.uncached, k))



def _flat_log_engine(trace, **kw):
    """A compiled vLLM engine of ``trace`` for timed replay, on its flat inputs (``engine_inputs``)."""
    from kvsim.drive.concurrent import ReplayMode, engine_inputs, scheduler_settings
    from kvsim.drive.timed import make_engine
    from kvsim.engines.options import SimOptions

    settings, _ = scheduler_settings("apc", SimOptions(capacity_tokens=6_000, model="llama-3-8b", gpu="H100-80GB"),
                                     ReplayMode("timed"), trace)
    inputs = engine_inputs(trace)
    return inputs, [make_engine(settings, **inputs) for _ in range(kw.get("engines", 1))]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_log_keyed_on_two_threads_has_the_same_keys(seed, monkeypatch):
    """Above ``PARALLEL_KEYING_TOKENS`` a log is keyed in two halves, the first on a thread."""
    from kvsim.engines.vllm import manager_jit
    from kvsim.workloads.shared_prefix import trace as shared_prefix

    trace = shared_prefix(groups=5, prompts_per_group=3, system_prompt_len=300, question_len=40, output_len=9,
                          rate=4.0, seed=seed)
    inputs, (engine,) = _flat_log_engine(trace)
    cache, p, o = engine.scheduler.cache, inputs["prompts"], inputs["outputs"]
    index = np.arange(len(p))
    monkeypatch.setattr(manager_jit, "_cores", lambda: 2)
    logs = []
    for threshold in (1 << 62, 0):          # one call / two halves
        monkeypatch.setattr(manager_jit, "PARALLEL_KEYING_TOKENS", threshold)
        logs.append(cache.log_keys(index, p.flat, p.offsets, o.flat, o.offsets, inputs["loras"], inputs["salts"]))
    assert logs[0].keys.size > 0 and (logs[0].keys != 0).all()
    for field in ("keys", "off", "count", "prompt", "every", "first"):
        np.testing.assert_array_equal(getattr(logs[0], field), getattr(logs[1], field))


def test_a_fleet_prepared_before_its_fork_shares_the_logs_keys():
    """``prepare_fleet`` keys the log once, kept on its prompts: a fleet built after (the replay
    without prefix caching, forked after it) takes those keys, not its own."""
    from kvsim.engines.vllm import scheduler_jit
    from kvsim.workloads.shared_prefix import trace as shared_prefix

    trace = shared_prefix(groups=4, prompts_per_group=3, system_prompt_len=200, question_len=30, output_len=5,
                          rate=4.0, seed=5)
    inputs, engines = _flat_log_engine(trace, engines=3)
    engines[0].prepare_fleet()
    (prepared,) = inputs["prompts"].keyed.values()
    reps = scheduler_jit.fleet(engines[1:], np.arange(len(trace)))       # (releases in steps)
    assert reps is not None
    assert all(e.scheduler.cache.log is prepared for e in engines[1:])
