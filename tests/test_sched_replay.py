"""The step clock and the step replays' agreement with the sequential replays.

A step replay whose requests arrive far apart serves them one at a time, so it must equal
the sequential replay (``kvsim.replay``) request for request: the same rules, reached
through the scheduler. The clock itself: a request arriving at step t is scheduled in
step t, an idle engine jumps to the next arrival, simultaneous arrivals keep log order.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "oracle"))
from sched_workloads import SchedMix, random_workload, with_stop_token

from kvsim.errors import ConfigError
from kvsim.io.trace.columns import Trace
from kvsim.drive.sequential import replay
from kvsim.engines.options import SimOptions
from kvsim.engines.sglang.scheduler import SglangSchedSettings
from kvsim.engines.vllm.scheduler import VllmSchedSettings
from tests.steps import replay_sglang_steps, replay_vllm_steps

FAR = 100_000   # steps between arrivals: every request finishes long before the next arrives


def far_apart(seed: int, stop: bool = False, n: int = 150):
    w = random_workload(seed, SchedMix(n=n, output_len=(1, 40)))
    if stop:
        w = with_stop_token(w)
    trace = Trace.from_prompts(w.prompts, outputs=w.outputs, output_lengths=[len(o) for o in w.outputs])
    return w, trace, np.arange(n, dtype=np.int64) * FAR


@pytest.mark.parametrize("budget", [64, 4096])
@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_vllm_steps_equal_sequential_when_arrivals_are_far_apart(asynchronous, budget):
    """Cached tokens and rejections equal the sequential APC replay, chunked or not."""
    w, trace, arrival = far_apart(1)
    blocks = int((-(-w.peak_tokens() // 16)).max()) + 1
    seq = replay("apc", trace, SimOptions(num_gpu_blocks=blocks, block_size=16), implementation="reference")
    steps = replay_vllm_steps(w.prompts, w.outputs, arrival, VllmSchedSettings(
        num_gpu_blocks=blocks, max_num_batched_tokens=budget, max_num_seqs=64, async_scheduling=asynchronous))
    np.testing.assert_array_equal(steps.rejected, seq.rejected)
    np.testing.assert_array_equal(steps.cached_tokens, seq.cached_tokens)
    assert seq.cached_tokens.sum() > 0 and steps.preemptions.sum() == 0


@pytest.mark.parametrize("page, overlap, stop", [(1, True, False), (1, False, False), (16, True, False),
                                                 (1, True, True), (16, False, True)])
def test_sglang_steps_equal_sequential_when_arrivals_are_far_apart(page, overlap, stop):
    """Cached tokens and rejections equal the sequential radix replay (tree, overlap, finish)."""
    w, trace, arrival = far_apart(2, stop)
    cap = int(w.peak_tokens().max()) + 64
    cap -= cap % page
    extra = {"overlap": overlap, "chunked_prefill_size": 128, "finish": "stop" if stop else "length"}
    seq = replay("radix", trace, SimOptions(max_total_tokens=cap, page_size=page, extra=extra), implementation="reference")
    steps = replay_sglang_steps(w.prompts, w.outputs, arrival, SglangSchedSettings(
        capacity=cap, page_size=page, overlap=overlap, chunked_prefill_size=128,
        finish="stop" if stop else "length"))
    np.testing.assert_array_equal(steps.rejected, seq.rejected)
    np.testing.assert_array_equal(steps.cached_tokens, seq.cached_tokens)
    assert seq.cached_tokens.sum() > 0


def one_request_each(arrival):
    prompts = [list(range(k * 100, k * 100 + 20)) for k in range(len(arrival))]
    outputs = [[1, 2, 3]] * len(arrival)
    return prompts, outputs, np.asarray(arrival, np.int64)


ENGINES = {
    "vllm-sync": lambda p, o, a, **k: replay_vllm_steps(p, o, a, VllmSchedSettings(
        num_gpu_blocks=64, async_scheduling=False, **k)),
    "vllm-async": lambda p, o, a, **k: replay_vllm_steps(p, o, a, VllmSchedSettings(
        num_gpu_blocks=64, async_scheduling=True, **k)),
    "sglang-normal": lambda p, o, a, **k: replay_sglang_steps(p, o, a, SglangSchedSettings(
        capacity=1024, overlap=False, **k)),
    "sglang-overlap": lambda p, o, a, **k: replay_sglang_steps(p, o, a, SglangSchedSettings(
        capacity=1024, overlap=True, **k)),
}


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_arrival_step_is_the_step_that_schedules_it(engine):
    """An idle engine jumps to the arrival: a short prompt's first token is in step t."""
    r = ENGINES[engine](*one_request_each([7, 500]))
    assert r.first_token_step.tolist() == [7, 500]
    assert (r.finish_step > r.first_token_step).all()


@pytest.mark.parametrize("engine", ["vllm-sync", "sglang-normal"])
def test_simultaneous_arrivals_keep_log_order(engine):
    """One running slot: requests arriving together run in log order."""
    cap = {"max_num_seqs": 1} if engine.startswith("vllm") else {"max_running_requests": 1}
    r = ENGINES[engine](*one_request_each([3, 3, 3]), **cap)
    assert r.first_token_step[0] < r.first_token_step[1] < r.first_token_step[2]


def test_request_that_never_fits_is_rejected_at_arrival():
    """Sequential mode's rule: a request larger than the whole cache never enters the queue."""
    prompts = [list(range(40)), list(range(1000, 2000)), list(range(40))]
    r = replay_vllm_steps(prompts, [[1, 2]] * 3, np.array([0, 0, 0]), VllmSchedSettings(num_gpu_blocks=8))
    assert r.rejected.tolist() == [False, True, False]
    assert r.first_token_step[1] == -1 and r.cached_tokens[2] == 32
    r = replay_sglang_steps(prompts, [[1, 2]] * 3, np.array([0, 0, 0]), SglangSchedSettings(capacity=128))
    assert r.rejected.tolist() == [False, True, False]


@pytest.mark.parametrize("bad", [dict(policy="sjf"), dict(max_num_seqs=0), dict(watermark=1.5),
                                 dict(max_num_batched_tokens=8, max_num_seqs=16),
                                 dict(enable_chunked_prefill=False, max_model_len=4096)])
def test_vllm_settings_errors(bad):
    with pytest.raises(ConfigError):
        VllmSchedSettings(num_gpu_blocks=10, **bad)


@pytest.mark.parametrize("bad", [dict(schedule_policy="priority"), dict(capacity=100, page_size=16),
                                 dict(finish="eos"), dict(max_running_requests=0)])
def test_sglang_settings_errors(bad):
    with pytest.raises(ConfigError):
        SglangSchedSettings(**{"capacity": 1024, **bad})


class DequeAllocator:
    """SGLang's allocators as written (``allocator.py``): free pages in a deque, handed out from
    the front; the token allocator appends freed pages, the paged one prepends them."""

    def __init__(self, capacity: int, p: int) -> None:
        from collections import deque

        self.p, self.free = p, deque(range(1, capacity // p + 1))

    def alloc_pages(self, n: int) -> np.ndarray:
        return np.array([self.free.popleft() for _ in range(n)], np.int64)

    def free_slots(self, slots: np.ndarray) -> None:
        pages = (slots[::self.p] // self.p).tolist()
        if self.p == 1:
            self.free.extend(pages)
        else:
            self.free.extendleft(reversed(pages))


def test_page_allocator_hands_out_pages_in_sglangs_order():
    """The numpy ring gives the pages SGLang's deque allocators give, in the same order."""
    from kvsim.engines.sglang.allocator import PageAllocator

    rng = np.random.default_rng(0)
    for p in (1, 4):
        ref, ring = DequeAllocator(64 * p, p), PageAllocator(64 * p, p)
        held = []
        for _ in range(400):
            if held and (rng.random() < 0.5 or len(ref.free) < 8):
                pages = held.pop(int(rng.integers(len(held))))
                slots = (pages[:, None] * p + np.arange(p)).reshape(-1)
                ref.free_slots(slots)
                ring.free_slots(slots)
            else:
                n = int(rng.integers(1, 8))
                a, b = ref.alloc_pages(n), ring.alloc_pages(n)
                np.testing.assert_array_equal(a, b)
                held.append(a)
            assert len(ref.free) * p == ring.available()


BULK_CASES = {
    "vllm-sync": VllmSchedSettings(num_gpu_blocks=60, max_num_batched_tokens=256, max_num_seqs=16,
                                   async_scheduling=False),
    "vllm-async-tight": VllmSchedSettings(num_gpu_blocks=40, max_num_batched_tokens=512, max_num_seqs=64),
    "vllm-B1": VllmSchedSettings(num_gpu_blocks=700, block_size=1, max_num_batched_tokens=128, max_num_seqs=8),
    "sglang-overlap": SglangSchedSettings(capacity=900, max_running_requests=16, chunked_prefill_size=256),
    "sglang-normal-p4": SglangSchedSettings(capacity=1200, page_size=4, overlap=False, chunked_prefill_size=128),
}


@pytest.mark.parametrize("name", sorted(BULK_CASES))
def test_decode_steps_in_bulk_equal_step_by_step(name, monkeypatch):
    """The bulk-decode shortcut changes nothing: same results, steps, pool and tree as one step at a time."""
    from kvsim.drive.clock import Releases, run
    from kvsim.drive.timed import make_engine

    w = random_workload(5, SchedMix(n=120, output_len=(20, 120), burst=(2, 12), gap=20.0))
    settings = BULK_CASES[name]

    def replay(bulk: bool):
        engine = make_engine(settings, w.prompts, w.outputs)
        taken = []
        if bulk:
            original = engine.fast_forward
            engine.fast_forward = lambda step, horizon: taken.append(original(step, horizon)) or taken[-1]
        else:
            engine.fast_forward = lambda step, horizon: 0
        steps, _ = run(engine, Releases.logged(w.arrival))
        return engine, steps, sum(taken)

    (slow, slow_steps, _), (fast, fast_steps, bulk_steps) = replay(False), replay(True)
    assert bulk_steps > 100                    # the shortcut really ran
    assert fast_steps == slow_steps
    assert_same_engine_state(name, slow, fast)


def assert_same_engine_state(name: str, slow, fast) -> None:
    """The same per-request results, and the same free queue (vLLM) or tree (SGLang)."""
    for field in ("cached_tokens", "first_token_step", "finish_step", "preemptions", "output_tokens"):
        np.testing.assert_array_equal(getattr(fast.result, field), getattr(slow.result, field))
    if name.startswith("vllm"):
        caches = [e.scheduler.cache for e in (slow, fast)]
        assert caches[0].free_block_ids() == caches[1].free_block_ids()
    else:
        assert fast.cache.tree.paths() == slow.cache.tree.paths()
        assert fast.cache.available_size == slow.cache.available_size


@pytest.mark.parametrize("name", sorted(BULK_CASES))
@pytest.mark.parametrize("load", [0.2, 5.0], ids=["light", "heavy"])
def test_timed_decode_runs_equal_step_by_step(name, load):
    """On the timed clock the bulk-decode shortcut keeps only the steps that start before the next
    release: the same results and the same timeline, second for second, as one step at a time."""
    from kvsim.drive.clock import Releases, run
    from kvsim.drive.step_cost import step_cost
    from kvsim.drive.timed import make_engine

    w = random_workload(7, SchedMix(n=150, output_len=(20, 150), burst=(1, 8), gap=20.0))
    cost = step_cost("llama-3-8b", "H100-80GB")
    arrivals = np.asarray(w.arrival, np.float64) * 0.01 / load        # seconds: bursts between decode runs

    def replay(bulk: bool, arrivals):
        engine = make_engine(BULK_CASES[name], w.prompts, w.outputs)
        taken = []              # (first step, steps) of each bulk run
        original = engine.fast_forward
        engine.fast_forward = (lambda step, horizon: taken.append((step, original(step, horizon))) or taken[-1][1]) \
            if bulk else (lambda step, horizon: 0)
        steps, line = run(engine, Releases.logged(arrivals), cost)
        return engine, steps, line, [t for t in taken if t[1]]

    _, _, line, runs = replay(True, arrivals)
    # the last request released exactly when the third step of a long bulk run starts: that
    # step must first take it (the timeline up to then is the same, so the time is exact)
    first, _ = next(t for t in runs if t[1] >= 3 and line.step_start[t[0] + 2] < arrivals[-1])
    arrivals = arrivals.copy()
    arrivals[-1] = line.step_start[first + 2]
    (slow, slow_steps, slow_line, _), (fast, fast_steps, fast_line, runs) = replay(False, arrivals), \
        replay(True, arrivals)
    assert sum(k for _, k in runs) > 100       # the shortcut really ran
    assert fast_steps == slow_steps
    assert_same_engine_state(name, slow, fast)
    assert fast_line.step_start == slow_line.step_start and fast_line.step_end == slow_line.step_end
    for field in ("released", "first_scheduled", "prefill_tokens", "decode_tokens"):
        np.testing.assert_array_equal(getattr(fast_line, field), getattr(slow_line, field))


@pytest.mark.parametrize("calibrated", [False, True], ids=["roofline", "calibration"])
def test_decode_run_seconds_equal_each_step_bit_for_bit(calibrated):
    """A decode run's step times, computed at once, are the floats ``seconds`` gives step by step."""
    from kvsim.drive.step_cost import CalibratedStepCost, decode_run_seconds, step_cost
    from kvsim.costs.calibration import Calibration

    if calibrated:
        cost = CalibratedStepCost(Calibration(device="H100", model="tiny", dtype="bfloat16", fixed_s=3.1e-4,
                                              per_token_s=7.3e-8, per_context_token_s=1.9e-12))
    else:
        cost = step_cost("llama-3-70b", "H200")
    rng = np.random.default_rng(3)
    for _ in range(200):
        context = rng.integers(0, 1 << int(rng.integers(4, 30)), int(rng.integers(1, 300))).tolist()
        k = int(rng.integers(1, 60))
        each = [cost.seconds([1] * len(context), [c + j for c in context]) for j in range(k)]
        assert decode_run_seconds(cost, context, k) == each
