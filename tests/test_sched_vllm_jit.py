"""The compiled scheduler loop (``kvsim.engines.vllm.scheduler_jit``) equals the readable one.

Seeded workloads that chunk, preempt under tight memory, run async and sync, cap long
prefills, keep a watermark, turn prefix caching or chunked prefill off, cap the model length,
use namespaces, prompt-logprob requests and exact sha256 keys, arrive in bursts and include
requests that never fit, replayed on the step clock and on the timed clock (the roofline's
step cost, light and heavy load) by both loops: every ``StepResult`` field, the finishing
order, the number of steps, the timeline (step starts and ends float for float, releases,
first scheduled step, prefill and decode tokens) and the free queue at the end (block for
block) are equal. The readable loop is the one the real vLLM scheduler checks
(``test_sched_vllm_oracle.py``, which runs the compiled loop wherever it applies).
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "oracle"))
from sched_workloads import SchedMix, random_workload

from kvsim.costs.calibration import Calibration
from kvsim.drive.clock import Releases, _run_compiled, run
from kvsim.drive.requests import Ragged
from kvsim.costs.roofline import DevicePeak
from kvsim.drive.step_cost import CalibratedStepCost, RooflineStepCost, step_cost
from kvsim.drive.timed import make_engine
from kvsim.engines.vllm import scheduler_jit
from kvsim.engines.vllm.scheduler import VllmSchedSettings
from kvsim.models import get_model

SHORT = dict(system_len=(8, 60), user_len=(1, 40), output_len=(1, 60))
LONG = dict(system_len=(40, 300), user_len=(10, 200), output_len=(20, 120))
BURSTY = dict(burst=(5, 40), gap=12.0)

# (seed, workload knobs, block size, memory (x the largest request's blocks), settings)
CASES = [
    (41, {}, 16, 1.0, dict(max_num_batched_tokens=256, max_num_seqs=16, async_scheduling=False)),
    (42, {}, 16, 1.0, dict(max_num_batched_tokens=256, max_num_seqs=16)),
    (43, LONG, 8, 1.2, dict(max_num_batched_tokens=128, max_num_seqs=32, long_prefill_token_threshold=32)),
    (44, dict(output_len=(20, 150), **BURSTY), 16, 1.0, dict(max_num_batched_tokens=512, max_num_seqs=64)),
    (45, dict(p_namespace=0.6, p_session=0.6, p_logprob=0.2), 16, 1.5,
     dict(max_num_batched_tokens=256, max_num_seqs=16, watermark=0.05)),
    (46, dict(p_namespace=0.5, **SHORT), 4, 1.0, dict(max_num_batched_tokens=64, max_num_seqs=8,
                                                      hash_algo="sha256", async_scheduling=False)),
    (47, BURSTY, 16, 2.0, dict(max_num_batched_tokens=4096, max_num_seqs=256, enable_chunked_prefill=False,
                               max_model_len=4096)),
    (48, dict(p_repeat=0.4), 16, 1.0, dict(max_num_batched_tokens=256, max_num_seqs=16,
                                           enable_prefix_caching=False)),
    (49, LONG, 16, 1.0, dict(max_num_batched_tokens=128, max_num_seqs=16, reserve_full_isl=False,
                             max_model_len="longest prompt + 30")),
    (50, dict(p_synth=0.5, **BURSTY), 8, 1.5, dict(max_num_batched_tokens=96, max_num_seqs=8,
                                                   long_prefill_token_threshold=32, watermark=0.1,
                                                   async_scheduling=False)),
    (51, LONG, 16, 0.7, dict(max_num_batched_tokens=256, max_num_seqs=16)),     # some never fit: rejected
    (52, dict(burst=(1, 1), gap=0.5), 1, 1.0, dict(max_num_batched_tokens=128, max_num_seqs=8)),
]
CLOCKS = {"steps": None, "timed-light": 0.05, "timed-heavy": 0.002}   # seconds per logged step
# the timed clocks' step costs: H100 (a step of these small batches reads the weights: memory
# bound), and a device with 1/200 of its FLOP/s, where prefill chunks are compute bound
COSTS = {"timed-light": RooflineStepCost(get_model("llama-3-8b"), DevicePeak("H100", 989.4e12, 66.9e12, 3.35e12)),
         "timed-heavy": RooflineStepCost(get_model("llama-3-8b"), DevicePeak("slow", 5e12, 1e12, 3.35e12))}


def workload(seed, knobs, B, factor, extra, n=150):
    w = random_workload(seed, SchedMix(n=n, **knobs))
    need = -(-w.peak_tokens() // B)
    if extra.get("max_model_len") == "longest prompt + 30":    # some replies stop at the cap
        extra = {**extra, "max_model_len": max(map(len, w.prompts)) + 30}
    return w, VllmSchedSettings(num_gpu_blocks=int(factor * int(need.max())) + 1, block_size=B, **extra)


def replay(w, settings, clock, readable, monkeypatch, cost=None, releases=None):
    """(engine, clock at the end, timeline, whether the compiled loop ran); ``clock`` scales the
    logged steps to seconds unless ``releases`` are given."""
    monkeypatch.setenv(scheduler_jit.ENV, "readable" if readable else "compiled")
    engine = make_engine(settings, w.prompts, w.outputs, w.priority, w.loras, w.salts, w.prompt_logprobs)
    ran = []
    monkeypatch.setattr(scheduler_jit, "run_replay",
                        lambda *a, _f=scheduler_jit.run_replay: ran.append(1) or _f(*a))
    scale = CLOCKS[clock]
    if scale is None:
        releases = releases or Releases.logged(w.arrival)
    else:
        releases = releases or Releases.logged(w.arrival * scale)
        cost = cost or COSTS[clock]
    steps, line = run(engine, releases, cost)
    return engine, steps, line, bool(ran)


def assert_same(slow, fast) -> None:
    """Every StepResult field, the clock, the timeline and the free queue equal (floats exactly)."""
    (a, a_steps, a_line, _), (b, b_steps, b_line, _) = slow, fast
    assert b_steps == a_steps
    for field in ("rejected", "cached_tokens", "first_token_step", "finish_step", "preemptions", "output_tokens"):
        np.testing.assert_array_equal(getattr(b.result, field), getattr(a.result, field), err_msg=field)
    assert b.result.finished == a.result.finished
    assert b_line.step_start == a_line.step_start and b_line.step_end == a_line.step_end
    for field in ("released", "first_scheduled", "prefill_tokens", "decode_tokens"):
        x, y = getattr(a_line, field), getattr(b_line, field)
        if x is None:
            assert y is None, field
        else:
            assert y.dtype == x.dtype, field
            np.testing.assert_array_equal(y, x, err_msg=field)
    assert b.scheduler.cache.free_block_ids() == a.scheduler.cache.free_block_ids()
    assert b.scheduler.cache.num_free_blocks == a.scheduler.cache.num_free_blocks


@pytest.mark.parametrize("clock", sorted(CLOCKS))
@pytest.mark.parametrize("seed, knobs, B, factor, extra", CASES, ids=[f"seed{c[0]}" for c in CASES])
def test_compiled_loop_equals_readable(seed, knobs, B, factor, extra, clock, monkeypatch):
    w, settings = workload(seed, knobs, B, factor, extra)
    slow = replay(w, settings, clock, True, monkeypatch)
    fast = replay(w, settings, clock, False, monkeypatch)
    assert not slow[3] and fast[3]             # each loop ran where it was asked to
    assert_same(slow, fast)
    # the workload exercises what it is meant to: hits (when caching), several requests at once
    r = slow[0].result
    served = ~r.rejected
    assert (r.cached_tokens[served].sum() > 0) == settings.enable_prefix_caching
    assert (r.finish_step[served] - r.first_token_step[served]).max() > 0
    if factor < 1:
        assert 0 < r.rejected.sum() < len(r.rejected)
    if clock == "timed-heavy":      # some steps are compute bound, others memory bound
        k = COSTS[clock]._constants
        busy = np.array(slow[2].step_end) - np.array(slow[2].step_start)
        bound = k[3] / k[6]         # the weights' read: the least a step with a batch takes
        assert (busy > 1.5 * bound).any() and (np.abs(busy - bound) < 0.2 * bound).any()


def _ragged(arrays) -> Ragged:
    """``arrays`` as views of one flat array, as the CLI hands a trace's prompts to an engine."""
    lengths = [len(a) for a in arrays]
    offsets = np.zeros(len(lengths) + 1, np.int64)
    offsets[1:] = np.cumsum(lengths)
    flat = np.concatenate([np.asarray(a, np.int64) for a in arrays]) if arrays else np.zeros(0, np.int64)
    return Ragged(flat, offsets)


@pytest.mark.parametrize("seed, knobs, B, factor, extra", CASES, ids=[f"seed{c[0]}" for c in CASES])
def test_flat_logs_are_keyed_in_one_call_with_the_same_replay(seed, knobs, B, factor, extra, monkeypatch):
    """Prompts and outputs given as views of flat arrays (``engine_inputs``) are keyed by one
    ``key_requests`` call: every request's keys equal those ``new_sequence`` gives it (none are
    computed without prefix caching), and the replay equals the readable one (namespaces,
    prompt logprobs, requests that never fit)."""
    from kvsim.engines.vllm.manager_jit import JitKVCacheManager

    w, settings = workload(seed, knobs, B, factor, extra)
    slow = replay(w, settings, "steps", True, monkeypatch)
    calls, keys = [], {}
    original = JitKVCacheManager.key_requests

    def key_requests(self, index, prompt_tok, prompt_off, out_tok, out_off, loras, salts):
        region, off = original(self, index, prompt_tok, prompt_off, out_tok, out_off, loras, salts)
        calls.append(len(index))
        for i, o in zip(index.tolist(), off.tolist()):
            nk = (len(w.prompts[i]) + len(w.outputs[i])) // B
            keys[i] = self.keys[o:o + nk].copy()
        return region, off
    monkeypatch.setattr(JitKVCacheManager, "key_requests", key_requests)
    flat = dataclasses.replace(w, prompts=_ragged(w.prompts), outputs=_ragged(w.outputs))
    fast = replay(flat, settings, "steps", False, monkeypatch)
    assert fast[3] and calls == ([] if settings.hash_algo != "fast" else [int((~slow[0].result.rejected).sum())])
    assert_same(slow, fast)     # (without prefix caching, with no keys computed: nothing reads them)
    if calls and settings.enable_prefix_caching:
        probe = make_engine(settings, w.prompts, w.outputs).scheduler.cache
        for i, got in keys.items():
            seq = probe.new_sequence(str(i), w.prompts[i], w.loras[i] if w.loras else None,
                                     w.salts[i] if w.salts else None, outputs=w.outputs[i])
            np.testing.assert_array_equal(got, probe.keys[seq.off:seq.off + len(got)], err_msg=str(i))


def test_the_cases_preempt_and_take_decode_runs(monkeypatch):
    """The tight cases preempt, and the readable loop takes decode runs at once (§4.4) where the
    compiled one runs step by step: the comparison covers both."""
    seed, knobs, B, factor, extra = CASES[3]
    w, settings = workload(seed, knobs, B, factor, extra)
    monkeypatch.setenv(scheduler_jit.ENV, "readable")
    engine = make_engine(settings, w.prompts, w.outputs)
    taken, original = [], engine.fast_forward
    engine.fast_forward = lambda step, horizon: taken.append(original(step, horizon)) or taken[-1]
    run(engine, Releases.logged(w.arrival))
    assert engine.result.preemptions.sum() > 0 and sum(taken) > 100


def test_a_release_at_a_decode_runs_step_start(monkeypatch):
    """A request released exactly when the third step of one of the readable loop's decode runs
    starts is taken by that step in both loops (the readable run is cut there), to the bit."""
    seed, knobs, B, factor, extra = CASES[3]
    w, settings = workload(seed, knobs, B, factor, extra, n=80)
    cost = step_cost("llama-3-8b", "H100-80GB")
    arrival = w.arrival * CLOCKS["timed-light"]

    def readable(arrival):
        monkeypatch.setenv(scheduler_jit.ENV, "readable")
        engine = make_engine(settings, w.prompts, w.outputs)
        runs, original = [], engine.fast_forward
        engine.fast_forward = lambda step, horizon: runs.append((step, original(step, horizon))) or runs[-1][1]
        steps, line = run(engine, Releases.logged(arrival), cost)
        return (engine, steps, line, None), [r for r in runs if r[1]]

    (_, _, line, _), runs = readable(arrival)
    first = next(step for step, k in runs if k >= 3 and line.step_start[step + 2] > arrival[-2])
    arrival = arrival.copy()
    arrival[-1] = line.step_start[first + 2]
    slow, runs = readable(arrival)
    assert (first, 2) in runs                  # the run now stops before the release
    fast = replay(w, settings, "timed-light", False, monkeypatch, cost, Releases.logged(arrival))
    assert fast[3]
    np.testing.assert_array_equal(fast[2].released, arrival)
    assert_same(slow, fast)


@pytest.mark.parametrize("clock", ["steps", "timed-heavy"])
def test_a_replay_in_slices_reports_progress_and_equals_one_call(clock, monkeypatch):
    """The kernel returns every ``SLICE_STEPS`` steps (the timeline grows, progress is heard) and
    resumes where it stopped: the same results as the readable loop."""
    seed, knobs, B, factor, extra = CASES[1]
    w, settings = workload(seed, knobs, B, factor, extra, n=60)
    slow = replay(w, settings, clock, True, monkeypatch)
    monkeypatch.setattr(scheduler_jit, "SLICE_STEPS", 7)
    heard = []
    monkeypatch.setenv(scheduler_jit.ENV, "compiled")
    engine = make_engine(settings, w.prompts, w.outputs)
    cost = COSTS.get(clock)
    releases = Releases.logged(w.arrival if cost is None else w.arrival * CLOCKS[clock])
    steps, line = run(engine, releases, cost, progress=heard.append)
    assert_same(slow, (engine, steps, line, None))
    assert len(heard) > slow[1] // 7 // 2 and heard == sorted(heard) and heard[-1] == len(w.prompts)


def test_step_seconds_are_the_roofline_floats_bit_for_bit():
    """The kernel's step time of a batch is ``RooflineStepCost.seconds``'s float, bit for bit."""
    cost = step_cost("llama-3-70b", "H200")
    k = np.asarray(cost._constants, np.float64)
    rng = np.random.default_rng(0)
    for _ in range(300):
        m = int(rng.integers(1, 300))
        new = rng.integers(1, 1 << int(rng.integers(1, 14)), m)
        context = rng.integers(0, 1 << int(rng.integers(1, 21)), m)
        q = np.zeros((m, scheduler_jit.NUM_FIELDS), np.int64)
        q[:, scheduler_jit.F_COMP] = context + new
        plan = np.arange(m, dtype=np.int64)[None, :]
        got = scheduler_jit._seconds(q, plan, new[None, :].astype(np.int64), 0, m, k)
        assert got == cost.seconds(new.tolist(), context.tolist())


@dataclasses.dataclass(frozen=True)
class Subclassed(VllmSchedSettings):
    """Settings that may bring their own manager or scheduler (as a KV connector's do)."""


def _readable_and_other(w, settings, monkeypatch, releases, cost=None, engine_hook=None):
    """The readable loop's results, and those of a run in which the compiled loop may apply."""
    out = []
    for readable in (True, False):
        monkeypatch.setenv(scheduler_jit.ENV, "readable" if readable else "compiled")
        engine = make_engine(settings, w.prompts, w.outputs, w.priority, w.loras, w.salts, w.prompt_logprobs)
        if engine_hook:
            engine_hook(engine)
        steps, line = run(engine, releases, cost)
        out.append((engine, steps, line, None))
    return out


@pytest.mark.parametrize("case", ["priority", "closed-loop", "calibration", "reference", "hooked", "subclass"])
def test_other_configurations_fall_back_to_the_readable_loop(case, monkeypatch):
    """Where the compiled loop does not model the configuration, the clock's compiled path
    declines (nothing changes) and it runs the readable loop: the same results as before."""
    seed, knobs, B, factor, extra = CASES[1]
    w, settings = workload(seed, dict(priorities=3, **knobs), B, factor, extra, n=80)
    releases, cost, hook = Releases.logged(w.arrival), None, None
    if case == "priority":
        settings = dataclasses.replace(settings, policy="priority")
    elif case == "closed-loop":
        releases = Releases.closed_loop(w.arrival, np.arange(len(w.arrival)) % 7)
    elif case == "calibration":
        releases = Releases.logged(w.arrival * 0.01)
        cost = CalibratedStepCost(Calibration("H100", "tiny", "bf16", fixed_s=3e-4, per_token_s=7e-8,
                                              per_context_token_s=2e-12))
    elif case == "reference":
        settings = dataclasses.replace(settings, implementation="reference")
    elif case == "hooked":
        def hook(engine):
            original = engine.fast_forward
            engine.fast_forward = lambda step, horizon: original(step, horizon)
    elif case == "subclass":    # a KV connector's settings subclass these (OffloadSchedSettings)
        settings = Subclassed(**dataclasses.asdict(settings))
    monkeypatch.setenv(scheduler_jit.ENV, "compiled")
    probe = make_engine(settings, w.prompts, w.outputs, w.priority, w.loras, w.salts, w.prompt_logprobs)
    if hook:
        hook(probe)
    assert _run_compiled(probe, releases, cost) is None
    assert not probe.has_work() and not probe.result.finished     # declining changed nothing
    slow, other = _readable_and_other(w, settings, monkeypatch, releases, cost, hook)
    assert_same(slow, other)


def test_the_oracle_configurations_run_the_compiled_loop():
    """The FCFS configurations of the real-vLLM differential test are ones the compiled loop
    runs, so that test checks it against vLLM directly (the priority ones check the readable loop)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_sched_vllm_oracle import CONFIGS, N, _settings

    fcfs = 0
    for seed, knobs, B, factor, extra in CONFIGS:
        w = random_workload(seed, SchedMix(n=N, **knobs))
        settings = _settings(w, B, factor, extra)
        engine = settings.engine(w.prompts, w.outputs, w.priority, w.loras, w.salts, w.prompt_logprobs)
        eligible = scheduler_jit.eligible(engine, w.arrival, None)
        assert eligible == (settings.policy == "fcfs")
        fcfs += eligible
    assert fcfs >= 20


def test_the_readable_switch(monkeypatch):
    """``KVSIM_VLLM_SCHEDULER=readable`` keeps every replay on the readable loop."""
    w, settings = workload(*CASES[0], n=30)
    monkeypatch.setenv(scheduler_jit.ENV, "readable")
    engine = make_engine(settings, w.prompts, w.outputs)
    assert not scheduler_jit.eligible(engine, w.arrival, None)
    monkeypatch.setenv(scheduler_jit.ENV, "compiled")
    assert scheduler_jit.eligible(engine, w.arrival, None)
