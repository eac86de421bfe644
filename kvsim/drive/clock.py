"""The clock shared by both engine models (docs/engines/vllm-scheduler.md §1).

Steps are numbered by scheduler steps. A request released at step t (or time t) is handed
to the engine before the step that starts then; requests released together are added in
log order; while the engine holds no work the clock jumps to the next release, after the
engine's idle pass.

Two clocks: the **step clock** (``--replay steps``: releases are step numbers, a step
lasts one tick) and the **timed clock** (``--replay timed``: releases are seconds and a
step lasts what the step-cost model says for its batch).

Releases are the logged arrivals, or, **closed-loop** (``--arrivals closed-loop``), a
session's next turn is released once the previous turn's reply has finished, plus its
think time (the logged gap between the two turns).
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from kvsim.errors import ConfigError


class SteppedEngine(Protocol):
    result: object     # a StepResult: rejected, first_token_step, finish_step, finished
    on_batch: object   # on_batch(step, requests, new tokens, context tokens, decode?) or None
    # optional: fast_forward(step, horizon) takes a run of decode-only steps at once; on the
    # timed clock it asks on_decode_run(steps, requests, context) how many to take;
    # replay_compiled(at, roofline constants or None, progress) runs the whole replay in a
    # compiled loop and returns (clock, step starts, step ends, released, first scheduled,
    # prefill tokens, decode tokens), or None where that loop does not model the engine

    def add(self, index: int) -> None:
        """Hand request ``index`` to the engine (it may reject it)."""

    def has_work(self) -> bool:
        """Whether the engine loop would run now rather than wait for input."""

    def step(self, step: int) -> bool:
        """One turn of the engine loop; True if it took a scheduler step (numbered ``step``)."""

    def idle(self) -> None:
        """The engine loop's idle pass (it runs before the clock jumps ahead)."""


@dataclass
class Releases:
    """When each request reaches the engine.

    ``at[i]`` is the logged arrival (a step number or seconds). With ``after[i] >= 0`` the
    request instead waits for request ``after[i]`` to finish, then ``gap[i]`` more.
    """

    at: np.ndarray
    after: np.ndarray | None = None
    gap: np.ndarray | None = None

    def queue(self) -> tuple[list, dict[int, list[int]], list]:
        """(the heap of ``(when, i)`` released by the log, each request's followers by the request
        they wait for, each request's gap): what a clock starts from."""
        n = len(self.at)
        at = self.at.tolist()
        after = self.after.tolist() if self.after is not None else [-1] * n
        gap = self.gap.tolist() if self.gap is not None else [0] * n
        followers: dict[int, list[int]] = {}
        pending: list = []
        for i in range(n):
            if after[i] >= 0:
                followers.setdefault(after[i], []).append(i)
            else:
                pending.append((at[i], i))
        heapq.heapify(pending)
        return pending, followers, gap

    @classmethod
    def logged(cls, at) -> Releases:
        return cls(np.asarray(at))

    @staticmethod
    def steps_from_seconds(seconds, step_seconds: float) -> np.ndarray:
        """``--arrival-from timestamp --step-seconds S``: step ``floor((t - t_first) / S)``."""
        seconds = np.asarray(seconds, np.float64)
        if step_seconds <= 0:
            raise ConfigError(f"--step-seconds must be positive, got {step_seconds}")
        if len(seconds) and not np.isfinite(seconds).all():
            raise ConfigError("--arrival-from timestamp needs a timestamp on every request")
        start = seconds.min() if len(seconds) else 0.0
        return np.floor((seconds - start) / step_seconds).astype(np.int64)

    @classmethod
    def closed_loop(cls, at, session) -> Releases:
        """Turn k+1 of a session waits for turn k; its think time is the logged gap (≥ 0)."""
        at = np.asarray(at)
        session = np.asarray(session)
        after = np.full(len(at), -1, np.int64)
        gap = np.zeros(len(at), at.dtype if at.dtype.kind == "f" else np.int64)
        last: dict[int, int] = {}
        for i, s in enumerate(session.tolist()):
            if s >= 0 and s in last:
                after[i] = last[s]
                gap[i] = max(at[i] - at[last[s]], 0)
            if s >= 0:
                last[s] = i
        return cls(at, after, gap)


@dataclass
class Timeline:
    """What the timed clock saw: when each step ran and how each request's work was spent."""

    step_start: list = field(default_factory=list)     # seconds, per step
    step_end: list = field(default_factory=list)
    released: np.ndarray | None = None                 # when each request reached the engine
    first_scheduled: np.ndarray | None = None          # start of the first step that computed for it
    prefill_tokens: np.ndarray | None = None           # tokens computed outside decode (recompute too)
    decode_tokens: np.ndarray | None = None

    def add_steps(self, now: float, seconds: list[float]) -> float:
        """Steps one after another from ``now``, lasting ``seconds``; the clock after the last."""
        for s in seconds:
            self.step_start.append(now)
            now += s
            self.step_end.append(now)
        return now

    def busy_seconds(self) -> float:
        """The steps' seconds, added in order (as ``sum`` adds them)."""
        k = min(len(self.step_start), len(self.step_end))
        return float(np.cumsum(np.subtract(self.step_end[:k], self.step_start[:k]))[-1]) if k else 0.0


def decode_run_before(cost, context: list[int], k: int, now: float, limit: float) -> list[float]:
    """The seconds of the steps of a ``k``-step decode run starting at ``now`` that start before
    ``limit`` (the first always does): a step starting at or after a release would first take
    the released request (docs/engines/vllm-scheduler.md §4.4)."""
    from kvsim.drive.step_cost import decode_run_seconds

    seconds = decode_run_seconds(cost, context, k)
    kept, t = 1, now + seconds[0]
    while kept < k and t < limit:
        t += seconds[kept]
        kept += 1
    return seconds[:kept]


def run(engine: SteppedEngine, releases: Releases, cost=None, progress=None) -> tuple[int, Timeline]:
    """Drive ``engine`` until every request is released and finished.

    With a step-cost model ``cost`` the clock is in seconds (timed replay) and steps are
    numbered 0, 1, 2, ...; without, the clock is the step number itself, jumps included.
    Returns the clock at the end (steps) or the number of steps (timed), and the timeline.
    ``progress(done)`` is called now and then with the number of requests finished or rejected.
    An engine whose own compiled loop models these releases and this clock runs the whole
    replay there, with the same results (vLLM's: docs/engines/vllm-scheduler.md §4.6).
    """
    n = len(releases.at)
    compiled = _run_compiled(engine, releases, cost, progress)
    if compiled is not None:
        if progress is not None:
            progress(n)
        return compiled
    result = engine.result
    pending, followers, gap = releases.queue()
    timed = cost is not None
    line = Timeline()
    released = np.full(n, np.nan) if timed else np.full(n, -1, np.int64)
    if timed:
        # per request while the clock runs, as lists (numpy's per-element indexing cost more
        # than the rest of a step's bookkeeping); arrays on the timeline at the end
        first, pre, dec = [math.nan] * n, [0] * n, [0] * n
        batch = []
        decode_run = []         # the steps of a fast-forwarded decode run: (requests, step seconds)

        def on_batch(step, reqs, new, context, decode, load_s=0.0, overlap=True):
            # an offload tier's load in this step: overlapped with the compute or before it
            compute = cost.seconds(new, context)
            batch.append(max(compute, load_s) if overlap else compute + load_s)
            for i, k, d in zip(reqs, new, decode):
                if first[i] != first[i]:    # NaN: its first step
                    first[i] = now
                if d:
                    dec[i] += k
                else:
                    pre[i] += k
        engine.on_batch = on_batch

        def on_decode_run(k, reqs, context):
            decode_run[:] = [reqs, decode_run_before(cost, context, k, now, pending[0][0] if pending else math.inf)]
            return len(decode_run[1])
        if hasattr(engine, "on_decode_run"):
            engine.on_decode_run = on_decode_run

    def release_followers(i: int, when) -> None:
        for j in followers.pop(i, ()):
            heapq.heappush(pending, (when + gap[j], j))

    now = 0.0 if timed else 0
    step = seen = turns = 0
    while True:
        turns += 1
        if progress is not None and turns % 512 == 0:
            progress(len(result.finished) + int(result.rejected.sum()))
        if not engine.has_work():
            engine.idle()
            if not pending:
                break
            now = max(now, pending[0][0])
        while pending and pending[0][0] <= now:
            when, i = heapq.heappop(pending)
            released[i] = when
            engine.add(i)
            if result.rejected[i]:          # never runs: its next turn follows at once
                release_followers(i, when)
        if not timed and hasattr(engine, "fast_forward"):
            taken = engine.fast_forward(now, pending[0][0] - now if pending else 1 << 62)
            if taken:
                now += taken
                step += taken
                continue
        elif timed and getattr(engine, "on_decode_run", None) is not None and engine.fast_forward(step, 1 << 62):
            reqs, seconds = decode_run
            now = line.add_steps(now, seconds)
            for i in reqs:
                dec[i] += len(seconds)
            step += len(seconds)
            continue
        if engine.step(step if timed else now):
            if timed:
                line.step_start.append(now)
                now += batch.pop() if batch else 0.0
                line.step_end.append(now)
            else:
                now += 1
            step += 1
        while seen < len(result.finished):  # closed loop: replies that just finished
            i = result.finished[seen]
            seen += 1
            if i in followers:
                release_followers(i, line.step_end[result.finish_step[i]] if timed else now)
    line.released = released
    if timed:
        line.first_scheduled = np.array(first, np.float64)
        line.prefill_tokens, line.decode_tokens = np.array(pre, np.int64), np.array(dec, np.int64)
    if progress is not None:
        progress(n)
    return (step if timed else now), line


def compiled_clock(cost) -> tuple[bool, tuple[float, ...] | None]:
    """Whether the engines' compiled loops model this clock, and what they take for it: the
    step clock (``cost`` None: no constants) or the roofline's timed clock (its constants);
    any other step cost runs the readable loops."""
    if cost is None:
        return True, None
    from kvsim.drive.step_cost import RooflineStepCost

    if type(cost) is not RooflineStepCost:
        return False, None
    return True, cost._constants


def _run_compiled(engine, releases: Releases, cost, progress=None) -> tuple[int, Timeline] | None:
    """The engine's own compiled loop (``replay_compiled``), where it has one that models these
    releases (logged, not closed-loop) and this clock (steps, or the roofline's step cost)."""
    compiled = getattr(engine, "replay_compiled", None)
    modelled, constants = compiled_clock(cost)
    if compiled is None or releases.after is not None or not modelled:
        return None
    done = compiled(releases.at, constants, progress)
    if done is None:
        return None
    clock, start, end, released, first, pre, dec = done
    return clock, Timeline(start, end, released, first, pre, dec)


def run_steps(engine: SteppedEngine, arrival_steps) -> int:
    """The step clock with logged arrivals; returns the final clock."""
    return run(engine, Releases.logged(np.asarray(arrival_steps, np.int64)))[0]
