"""The timed replays beside the main one (kvsim.drive.side): the same results from a forked
child as in turn, errors raised in the parent, a child that dies replaced, none left behind."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from kvsim.drive import side
from kvsim.drive.concurrent import ReplayMode, run_concurrent
from kvsim.engines.options import SimOptions
from kvsim.fleet.concurrent import run_fleet_concurrent
from kvsim.fleet.config import FleetSpec
from kvsim.workloads.shared_prefix import trace as shared_prefix

forks = pytest.mark.skipif(not side.can_fork(), reason="needs Linux and two cores (CI has both)")
TIMED_FIELDS = ("ttft", "e2e", "queueing", "prefill_tokens", "decode_tokens", "released")


@pytest.fixture
def in_turn(monkeypatch):
    """Run side replays in this process, one after the other."""
    monkeypatch.setenv(side.ENV, "0")


def test_switched_off_runs_here(in_turn):
    assert not side.can_fork()
    s = side.Side(lambda here: (here, os.getpid()))
    assert s.result() == (True, os.getpid())


@forks
def test_side_work_runs_here_while_the_running_children_hold_every_other_core():
    me = os.getpid()
    held = [side.Side(lambda here: os.getpid()) for _ in range(len(os.sched_getaffinity(0)) - 1)]
    assert side.Side(lambda here: (here, os.getpid())).result() == (True, me)
    assert all(h.result() != me for h in held)
    assert side.Side(lambda here: os.getpid()).result() != me      # reaped: the cores are free again


@forks
def test_forked_child_computes_and_sends_back():
    s = side.Side(lambda here: (here, os.getpid(), np.arange(5)))
    here, pid, values = s.result()
    assert here is False and pid != os.getpid()
    assert np.array_equal(values, np.arange(5))


@forks
def test_an_error_in_the_child_is_raised_here():
    def fail(here):
        raise ValueError(f"bad input (here={here})")

    with pytest.raises(ValueError, match=r"bad input \(here=False\)"):
        side.Side(fail).result()


@forks
def test_a_child_that_dies_is_replaced_by_running_here():
    def dies_in_child(here):
        if not here:
            os._exit(3)       # killed before sending anything (out of memory, a signal)
        return "computed here"

    assert side.Side(dies_in_child).result() == "computed here"


@forks
def test_cancel_stops_and_reaps_the_child():
    s = side.Side(lambda here: time.sleep(60))
    pid = s._pid
    s.cancel()
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)   # already reaped: no such child
    s.cancel()                        # a second cancel signals nobody
    with pytest.raises(RuntimeError, match="after cancel"):
        s.result()


@forks
def test_a_with_block_that_fails_stops_the_child():
    """The caller failed before taking the result (its main replay raised): the child is
    stopped and reaped at the end of the block; a result taken inside it stays good."""
    with pytest.raises(KeyError):
        with side.Side(lambda here: time.sleep(60)) as s:
            pid = s._pid
            raise KeyError("the main replay failed")
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)   # already reaped: no such child
    with side.Side(lambda here: here) as s:
        assert s.result() is False


def _timed_equal(a, b) -> None:
    for k in TIMED_FIELDS:
        assert np.array_equal(getattr(a, k), getattr(b, k), equal_nan=True), k
    assert (a.busy_s, a.makespan_s, a.output_tokens) == (b.busy_s, b.makespan_s, b.output_tokens)
    for k in ("cached_tokens", "first_token_step", "finish_step", "preemptions"):
        assert np.array_equal(getattr(a.steps, k), getattr(b.steps, k)), k


def _load():
    return shared_prefix(groups=12, prompts_per_group=4, system_prompt_len=800, question_len=64, output_len=16,
                         rate=4.0, seed=3)


@forks
@pytest.mark.parametrize("policy,tier", [("apc", None), ("radix", None), ("apc", "native"), ("radix", "hicache")])
def test_single_replica_same_results_forked_or_in_turn(monkeypatch, policy, tier):
    trace = _load()
    extra = {} if tier is None else {"offload": tier, "offload_size": 40_000}
    opts, mode = SimOptions(capacity_tokens=6_000, model="llama-3-8b", gpu="H100-80GB", extra=extra), ReplayMode("timed")
    forked = run_concurrent(trace, [policy], opts, mode)[policy]
    monkeypatch.setenv(side.ENV, "0")
    in_turn = run_concurrent(trace, [policy], opts, mode)[policy]
    assert forked.uncached.prefill_tokens.sum() > in_turn.timed.prefill_tokens.sum()   # the cache saved work
    _timed_equal(forked.timed, in_turn.timed)
    _timed_equal(forked.uncached, in_turn.uncached)
    if tier is not None:
        _timed_equal(forked.untiered, in_turn.untiered)


@forks
@pytest.mark.parametrize("router", ["round_robin", "dynamo"])
def test_fleet_same_results_forked_or_in_turn(monkeypatch, router):
    trace = _load()
    opts, mode = SimOptions(capacity_tokens=4_000, model="llama-3-8b", gpu="H100-80GB"), ReplayMode("timed")
    forked = run_fleet_concurrent(trace, ["apc"], opts, mode, FleetSpec(3, router))["apc"]
    monkeypatch.setenv(side.ENV, "0")
    in_turn = run_fleet_concurrent(trace, ["apc"], opts, mode, FleetSpec(3, router))["apc"]
    _timed_equal(forked.timed, in_turn.timed)
    _timed_equal(forked.uncached, in_turn.uncached)
    # the bounds: the replicas' unlimited replays beside the fleet's
    assert forked.bounds.routed.sum() > 0
    assert np.array_equal(forked.bounds.fleet, in_turn.bounds.fleet)
    assert np.array_equal(forked.bounds.routed, in_turn.bounds.routed)


@forks
def test_the_child_prints_nothing(capfd):
    def noisy(here):
        print("from the replay")
        import warnings
        warnings.warn("a warning in the replay")
        return 1

    assert side.Side(noisy).result() == 1
    out, err = capfd.readouterr()
    assert out == "" and err == ""


@forks
def test_a_stuck_child_is_stopped_and_its_work_done_here(monkeypatch):
    monkeypatch.setattr(side, "STALL_S", 0.5)

    def stuck_in_child(here):
        if not here:
            time.sleep(3600)   # as if waiting for a lock a vanished thread held at the fork
        return "computed here"

    s = side.Side(stuck_in_child)
    pid = s._pid
    t0 = time.perf_counter()
    assert s.result() == "computed here"
    assert time.perf_counter() - t0 < 30
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)   # stopped and reaped


@forks
def test_a_busy_child_is_not_taken_for_stuck(monkeypatch):
    monkeypatch.setattr(side, "STALL_S", 1.0)

    def busy(here):
        end = time.perf_counter() + 2.0
        n = 0
        while time.perf_counter() < end:
            n += 1
        return here

    assert side.Side(busy).result() is False    # the child's own result, after twice the stall time


class _NeedsTwoArgs(Exception):
    def __init__(self, path, what):
        super().__init__(f"{path}: {what}")     # its args cannot rebuild it


@forks
def test_an_error_that_does_not_unpickle_is_raised_here():
    def fail(here):
        raise _NeedsTwoArgs("log.jsonl", f"bad line (here={here})")

    with pytest.raises(_NeedsTwoArgs, match=r"log.jsonl: bad line \(here=True\)"):
        side.Side(fail).result()
