"""Exact replays of every sweep combination: in this process, a local process pool, or Ray.

The trace goes to local workers once, not once per task: forked workers inherit it
(copy-on-write); spawned ones (where fork is unavailable) memory-map it from ``.npy``
files written once to a temporary folder. Ray gets it once through its object store
(``ray.put``). Results come back keyed by combination index, so the output order never
depends on which replay finishes first.
"""
from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from kvsim.errors import ConfigError, KvsimError
from kvsim.io.trace.columns import Trace
from kvsim.sweep.grid import SweepPoint

EXECUTORS = ("local", "ray")

#: called once per finished combination with its index and summary row
Done = Callable[[int, dict[str, Any]], None]


def replay_point(trace: Trace, point: SweepPoint) -> dict[str, Any]:
    """Run one combination's exact replay and summarize it (the unit of work of every executor)."""
    from kvsim.drive.sequential import replay
    from kvsim.drive.metrics import summarize

    result = replay(point.policy, trace, point.options())
    if point.warmup is not None:  # kvsim.warmup: figures leave the window out
        from kvsim.warmup import measured_mask

        result.measured = measured_mask(len(trace), point.warmup)
    summary = summarize(result, trace)
    summary.pop("policy", None)
    if point.concurrent is not None:   # the scheduler model under load, at the same capacity
        from kvsim.drive.views import concurrent_columns

        mode, cost = point.concurrent
        summary.update(concurrent_columns(trace, point.options(), point.policy, mode, cost, result.measured))
    return {**summary, "config": dict(result.config)}


def _guarded(trace: Trace, point: SweepPoint) -> tuple[bool, Any]:
    # Errors travel as text: user errors (KvsimError) keep their one-line message.
    try:
        return True, replay_point(trace, point)
    except KvsimError as e:
        return False, str(e)


class Executor(Protocol):
    """Runs replays and reports each one as it finishes, in any order."""

    def run(self, trace: Trace, points: list[SweepPoint], done: Done) -> None: ...


class SerialExecutor:
    """Every replay in this process, one after the other."""

    def run(self, trace: Trace, points: list[SweepPoint], done: Done) -> None:
        for p in points:
            ok, value = _guarded(trace, p)
            if not ok:
                raise KvsimError(value)
            done(p.index, value)


# -- local process pool ------------------------------------------------------------------

class SharedTrace:
    """A trace written once as ``.npy`` files (arrays) plus a small pickle (everything else)."""

    def __init__(self, trace: Trace) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="kvsim-sweep-"))
        small: dict[str, Any] = {}
        for f in fields(Trace):
            value = getattr(trace, f.name)
            if isinstance(value, np.ndarray) and value.dtype != object:
                np.save(self.path / f"{f.name}.npy", value, allow_pickle=False)
            else:
                small[f.name] = value
        with open(self.path / "rest.pkl", "wb") as fh:
            pickle.dump(small, fh, protocol=pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def load(path: str | Path) -> Trace:
        """Rebuild the trace; arrays are memory-mapped copy-on-write, so workers share the pages."""
        path = Path(path)
        with open(path / "rest.pkl", "rb") as fh:
            kwargs = pickle.load(fh)
        for f in fields(Trace):
            npy = path / f"{f.name}.npy"
            if npy.exists():
                kwargs[f.name] = np.load(npy, mmap_mode="c", allow_pickle=False)
        return Trace(**kwargs)

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


_WORKER_TRACE: Trace | None = None


def _init_worker(path: str) -> None:
    global _WORKER_TRACE
    _WORKER_TRACE = SharedTrace.load(path)


def _inherit_trace(trace: Trace) -> None:
    global _WORKER_TRACE
    _WORKER_TRACE = trace


def default_start_method() -> str:
    """fork on Linux (workers inherit the trace and start at once), spawn elsewhere."""
    import multiprocessing
    import sys

    return "fork" if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods() \
        else "spawn"


def _worker_replay(point: SweepPoint) -> tuple[bool, Any]:
    assert _WORKER_TRACE is not None, "worker started without a trace"
    return _guarded(_WORKER_TRACE, point)


class ProcessExecutor:
    """A pool of ``jobs`` worker processes on this machine.

    With ``fork`` (the default on Linux) every worker is started at the first submit, before
    any result (and so before the progress bar's thread) exists.
    """

    def __init__(self, jobs: int | None = None, start_method: str | None = None) -> None:
        self.jobs = max(1, int(jobs or os.cpu_count() or 1))
        self.start_method = start_method or default_start_method()

    def run(self, trace: Trace, points: list[SweepPoint], done: Done) -> None:
        import multiprocessing

        jobs = min(self.jobs, len(points))
        if jobs <= 1:
            SerialExecutor().run(trace, points, done)
            return
        ctx = multiprocessing.get_context(self.start_method)
        if self.start_method == "fork":
            shared, init, initargs = None, _inherit_trace, (trace,)
        else:
            shared = SharedTrace(trace)
            init, initargs = _init_worker, (str(shared.path),)
        try:
            with ProcessPoolExecutor(jobs, mp_context=ctx, initializer=init, initargs=initargs) as pool:
                pending = {pool.submit(_worker_replay, p): p.index for p in points}
                try:
                    while pending:
                        finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                        for fut in finished:
                            index = pending.pop(fut)
                            ok, value = fut.result()
                            if not ok:
                                raise KvsimError(value)
                            done(index, value)
                except BaseException:
                    for fut in pending:
                        fut.cancel()
                    raise
        finally:
            if shared is not None:
                shared.close()


# -- Ray ---------------------------------------------------------------------------------

def _ray_replay(trace: Trace, point: SweepPoint) -> tuple[bool, Any]:
    return _guarded(trace, point)


class RayExecutor:
    """Replays as Ray tasks: on the cluster at ``RAY_ADDRESS`` if set, else a local Ray instance.

    The trace is put in Ray's object store once and shared by every task.
    """

    def __init__(self, jobs: int | None = None, init_kwargs: dict[str, Any] | None = None) -> None:
        self.jobs = jobs
        self.init_kwargs = dict(init_kwargs or {})

    def run(self, trace: Trace, points: list[SweepPoint], done: Done) -> None:
        ray = import_ray()
        started = False
        if not ray.is_initialized():
            kwargs = dict(self.init_kwargs)
            if self.jobs and "address" not in kwargs and not os.environ.get("RAY_ADDRESS"):
                kwargs.setdefault("num_cpus", int(self.jobs))
            kwargs.setdefault("include_dashboard", False)
            kwargs.setdefault("log_to_driver", False)
            ray.init(**kwargs)
            started = True
        try:
            trace_ref = ray.put(trace)
            task = ray.remote(num_cpus=1)(_ray_replay)
            pending = {task.remote(trace_ref, p): p.index for p in points}
            while pending:
                finished, _ = ray.wait(list(pending), num_returns=1)
                for ref in finished:
                    index = pending.pop(ref)
                    ok, value = ray.get(ref)
                    if not ok:
                        for other in pending:
                            ray.cancel(other)
                        raise KvsimError(value)
                    done(index, value)
        finally:
            if started:
                ray.shutdown()


def import_ray():
    """The ray module, or a clear error saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError("--executor ray needs Ray, which is not installed: pip install 'kvsim[ray]'") from None
    return ray


def make_executor(name: str | Executor = "local", jobs: int | None = None) -> Executor:
    """'local' (process pool; in-process when jobs is 1) or 'ray', or an executor object as is."""
    if not isinstance(name, str):
        return name
    if name == "local":
        if jobs is not None and int(jobs) < 1:
            raise ConfigError(f"--jobs must be at least 1, got {jobs}")
        return SerialExecutor() if jobs == 1 else ProcessExecutor(jobs)
    if name == "ray":
        import_ray()
        return RayExecutor(jobs)
    raise ConfigError(f"unknown executor {name!r}; choose from {', '.join(EXECUTORS)}")


def run_points(trace: Trace, points: list[SweepPoint], executor: str | Executor = "local",
               jobs: int | None = None, progress: bool | Callable[[int, int], Any] = False) -> list[dict[str, Any]]:
    """Replay every combination; the rows come back in ``points`` order, whatever the completion order."""
    trace.require_tokens("a sweep")
    runner = make_executor(executor, jobs)
    rows: dict[int, dict[str, Any]] = {}
    total = len(points)
    with _progress(progress, total) as advance:
        def done(index: int, row: dict[str, Any]) -> None:
            if index in rows:
                raise RuntimeError(f"combination {index} reported twice")
            rows[index] = row
            advance(len(rows))

        runner.run(trace, points, done)
    missing = [p.index for p in points if p.index not in rows]
    if missing:
        raise RuntimeError(f"the executor did not report combinations {missing}")
    return [rows[p.index] for p in points]


class _progress:
    """A rich progress bar over combinations (stderr), a user callback, or nothing.

    The bar starts at the first finished combination, so no display thread runs while
    the pool forks its workers.
    """

    def __init__(self, progress: bool | Callable[[int, int], Any], total: int) -> None:
        self.progress, self.total, self.bar, self.task = progress, total, None, None

    def __enter__(self) -> Callable[[int], None]:
        if callable(self.progress):
            return lambda n: self.progress(n, self.total)
        if not self.progress:
            return lambda n: None
        return self._advance

    def _advance(self, n: int) -> None:
        if self.bar is None:
            from kvsim.progress import bars

            self.bar = bars("count")
            self.task = self.bar.__enter__().task("replaying combinations", self.total)
        self.task(n)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
