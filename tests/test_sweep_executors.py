"""Running sweep combinations: parallel equals serial, order never depends on completion, Ray."""
from __future__ import annotations

import importlib.util
import math
import sys

import numpy as np
import pandas as pd
import pytest

from kvsim.errors import ConfigError, KvsimError
from kvsim.io.trace.columns import Trace
from kvsim.sweep import run_sweep, sweep
from kvsim.sweep import executors as runner_mod
from kvsim.sweep.grid import expand_grid, parse_capacities
from kvsim.sweep.executors import (
    ProcessExecutor,
    RayExecutor,
    SerialExecutor,
    SharedTrace,
    make_executor,
    run_points,
)


def small_trace(n: int = 60, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    base = list(rng.integers(0, 100, 40))
    prompts = [base[: rng.integers(5, 40)] + list(rng.integers(0, 100, rng.integers(1, 30))) for _ in range(n)]
    return Trace.from_prompts(prompts, output_lengths=rng.integers(1, 20, n).tolist(),
                              cache_salts=[None if i % 7 else "t" for i in range(n)])


def grid(caps: str = "16,64,256,inf", blocks=(4, 8)):
    return expand_grid(["apc"], parse_capacities(caps), block_sizes=list(blocks))


def without_time(rows):
    return [{k: v for k, v in r.items() if k != "replay_seconds"} for r in rows]


def test_parallel_pool_equals_serial():
    tr = small_trace()
    points = grid()
    serial = run_points(tr, points, executor=SerialExecutor())
    forked = run_points(tr, points, executor=ProcessExecutor(2))
    assert without_time(forked) == without_time(serial)
    assert [r["config"]["block_size"] for r in serial] == [4] * 4 + [8] * 4


@pytest.mark.slow
def test_spawned_workers_memory_map_the_trace():
    """Without fork, workers load the trace once from .npy files (no per-task pickling)."""
    tr = small_trace(n=30)
    points = grid("32,inf", blocks=(4,))
    spawned = run_points(tr, points, executor=ProcessExecutor(2, start_method="spawn"))
    assert without_time(spawned) == without_time(run_points(tr, points, executor=SerialExecutor()))


def test_shared_trace_round_trip():
    tr = small_trace(n=10)
    shared = SharedTrace(tr)
    try:
        back = SharedTrace.load(shared.path)
        assert isinstance(back.tokens, np.memmap)
        for name in ("offsets", "tokens", "output_lengths", "cache_salt", "prompt_logprobs"):
            np.testing.assert_array_equal(getattr(back, name), getattr(tr, name))
        assert back.salt_names == tr.salt_names and len(back) == len(tr)
    finally:
        shared.close()
    assert not shared.path.exists()


class ReverseExecutor:
    """Finishes the combinations last-first, as a slow first replay would."""

    def run(self, trace, points, done):
        for p in reversed(points):
            done(p.index, {"capacity_tokens": p.index, "config": {}})


def test_rows_come_back_in_grid_order_whatever_the_completion_order():
    points = grid()
    seen = []
    rows = run_points(small_trace(n=5), points, executor=ReverseExecutor(),
                      progress=lambda n, total: seen.append((n, total)))
    assert [r["capacity_tokens"] for r in rows] == list(range(len(points)))
    assert seen == [(i + 1, len(points)) for i in range(len(points))]


def test_executor_reporting_twice_or_never_is_an_error():
    class Twice:
        def run(self, trace, points, done):
            done(0, {})
            done(0, {})

    class Never:
        def run(self, trace, points, done):
            pass

    with pytest.raises(RuntimeError, match="twice"):
        run_points(small_trace(n=5), grid(), executor=Twice())
    with pytest.raises(RuntimeError, match="did not report"):
        run_points(small_trace(n=5), grid(), executor=Never())


def test_worker_errors_surface_as_one_line(monkeypatch):
    def broken(trace, point):
        raise ConfigError(f"combination {point.index} is impossible")

    monkeypatch.setattr(runner_mod, "replay_point", broken)
    with pytest.raises(KvsimError, match=r"combination \d+ is impossible"):
        run_points(small_trace(n=5), grid(), executor=ProcessExecutor(2))
    with pytest.raises(KvsimError, match="is impossible"):
        run_points(small_trace(n=5), grid(), executor=SerialExecutor())


def test_make_executor_choices(monkeypatch):
    assert isinstance(make_executor("local", 1), SerialExecutor)
    assert isinstance(make_executor("local"), ProcessExecutor)
    assert make_executor("local").jobs >= 1
    with pytest.raises(ConfigError):
        make_executor("dask")
    with pytest.raises(ConfigError):
        make_executor("local", 0)
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(ConfigError, match=r"pip install 'kvsim\[ray\]'"):
        make_executor("ray")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install 'kvsim[ray]')")
def test_ray_executor_on_a_local_ray_instance():
    tr = small_trace()
    points = grid("32,inf")
    on_ray = run_points(tr, points, executor=RayExecutor(jobs=2))
    assert without_time(on_ray) == without_time(run_points(tr, points, executor=SerialExecutor()))


def test_run_sweep_frame_is_tidy():
    tr = small_trace()
    frame = run_sweep(tr, "apc", "16,64,inf", block_sizes="4,8", jobs=1)
    assert isinstance(frame, pd.DataFrame) and len(frame) == 6
    assert list(frame["block_size"]) == [4, 4, 4, 8, 8, 8]
    assert frame["page_size"].isna().all() and frame["eviction_policy"].isna().all()
    assert math.isinf(frame["capacity_tokens"].iloc[2])
    assert frame["capacity_tokens"].iloc[0] == 16
    assert {"token_hit_rate", "curve_hit_rate", "curve_abs_error", "rejected"} <= set(frame.columns)
    assert (frame["curve_abs_error"] <= 1).all()
    # the unlimited capacity admits everything and is exact
    assert frame["curve_abs_error"].iloc[2] == 0.0


def test_sweep_result_curves_and_json():
    tr = small_trace()
    res = sweep(tr, "apc", "64,inf", block_sizes="4", jobs=1, curve_points=16)
    (c,) = res.curves
    assert c.points == 2 and c.max_abs_error is not None and len(c.capacity_tokens) == len(c.hit_rate) <= 16
    doc = res.as_dict()
    assert doc["rows"][1]["capacity_tokens"] is None  # unlimited -> null in JSON
    assert doc["curves"][0]["settings"]["block_size"] == 4
    no_curve = sweep(tr, "apc", "64", block_sizes="4", jobs=1, curves=False)
    assert no_curve.curves == [] and "curve_hit_rate" not in no_curve.frame.columns


def test_length_only_traces_are_refused():
    tr = small_trace(n=3)
    tr.tokens = None
    with pytest.raises(KvsimError, match="prefix information"):
        run_sweep(tr, "apc", "inf")


def test_sweep_both_policies_curves_only_for_lru():
    tr = small_trace()
    frame = run_sweep(tr, "apc,radix", "64,inf", block_sizes="4", page_sizes="1,4",
                      eviction_policies="lru,lfu,fifo", jobs=2)
    assert len(frame) == 2 + 2 * 3 * 2
    radix = frame[frame["policy"] == "radix"]
    assert radix["block_size"].isna().all()
    lru = radix["eviction_policy"] == "lru"
    assert radix.loc[lru, "curve_hit_rate"].notna().all()
    # LFU is not LRU in 0.5.23 (hit counts grow on insert), so it gets no curve either
    assert radix.loc[~lru, "curve_hit_rate"].isna().all()


class FakeRay:
    """Just enough of Ray's API to drive RayExecutor without Ray: tasks run at ``wait``,
    last submitted first, and the trace goes through ``put`` once."""

    def __init__(self):
        self.initialized, self.init_kwargs, self.puts, self.pending = False, None, 0, {}

    def is_initialized(self):
        return self.initialized

    def init(self, **kwargs):
        self.initialized, self.init_kwargs = True, kwargs

    def shutdown(self):
        self.initialized = False

    def put(self, value):
        self.puts += 1
        return ("ref", value)

    def remote(self, **options):
        fake = self

        def wrap(fn):
            class Task:
                @staticmethod
                def remote(ref, point):
                    key = object()
                    fake.pending[key] = lambda: fn(ref[1], point)
                    return key
            return Task
        return wrap

    def wait(self, refs, num_returns=1):
        ref = refs[-1]
        self.pending[ref] = self.pending[ref]()
        return [ref], refs[:-1]

    def get(self, ref):
        return self.pending[ref]

    def cancel(self, ref):
        self.pending.pop(ref, None)


def test_ray_executor_logic_with_a_fake_ray(monkeypatch):
    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    tr = small_trace()
    points = grid("32,inf")
    rows = run_points(tr, points, executor=RayExecutor(jobs=3))
    assert without_time(rows) == without_time(run_points(tr, points, executor=SerialExecutor()))
    assert fake.puts == 1 and fake.init_kwargs["num_cpus"] == 3 and not fake.initialized
