"""N replicas on one clock behind a router (``--replay steps|timed`` with ``--replicas``).

Each replica is a stepped engine (:class:`kvsim.drive.clock.SteppedEngine`) with its own
timeline: in ``steps`` every step lasts one tick, in ``timed`` what the step-cost model
says for that replica's batch, so replicas run in parallel and drift apart. A discrete-event
loop advances them:

1. The next event is the earliest of: the next request reaching the router (its release
   time), and the next turn of a replica (its clock, when it has work or requests routed to
   it). An arrival goes first at a tie, as the single-engine clock adds the requests
   released by ``now`` before the step that starts then.
2. An arrival is routed at its release time: the router gets every replica's load
   (``engine.load()``: waiting, running, KV usage) and names a replica; the request waits
   there until that replica's next turn.
3. A replica's turn is one turn of :func:`kvsim.drive.clock.run`'s loop on its own clock:
   an idle replica jumps to its first routed request; it takes the requests routed to it by
   now, then one step (or a stretch that only decodes: ``fast_forward``, up to the next
   arrival and, with closed-loop sessions, to the end of another busy replica's step, whose
   finishing reply could release a session's next turn; in ``timed``, the steps of the
   stretch that start before those).
4. After the turn the router hears what happened on that replica: ``prefill_done`` at a
   request's first token, ``finished`` at its end (a rejected request at once), and, for
   routers fed by engine events, the replica's KV events.

Where every replica is one vLLM's compiled loop models, the releases are logged, the clock is
steps or the roofline and the router needs no raw KV events, the same turns run compiled
(:func:`_run_compiled`: each replica alone up to the next arrival, its turns' events then
delivered in this loop's order), with the same results (``tests/test_fleet_jit.py``).

With one replica the turns are exactly those of :func:`kvsim.drive.clock.run`, so the
results are the single engine's, request for request (``tests/test_fleet_driver.py``).
The router's clock is in seconds: the timed clock itself, or ``step x --step-seconds``
(one second per step when it is not given) on the step clock.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvsim.drive.clock import Releases, Timeline, compiled_clock, decode_run_before
from kvsim.engines.base import StepResult
from kvsim.fleet.base import IDLE, ReplicaLoad, Router
from kvsim.fleet.config import RouteRequests
from kvsim.fleet.events import from_engine


@dataclass
class FleetTimeline:
    """What the fleet clock saw: per request its replica and release, per replica its timeline."""

    replica: np.ndarray                      # int64 (n,): -1 never routed
    released: np.ndarray                     # when each request reached the router (ticks or seconds)
    order: list[int]                         # requests in the order replicas took them
    lines: list[Timeline]                    # per replica: step starts and ends (timed)
    steps: list[int]                         # per replica: steps taken
    clocks: list[float]                      # per replica: its clock at the end
    peak_waiting: list[int] = field(default_factory=list)
    peak_running: list[int] = field(default_factory=list)
    first_scheduled: np.ndarray | None = None    # timed: start of the first step that computed for it
    prefill_tokens: np.ndarray | None = None
    decode_tokens: np.ndarray | None = None


def _load(engine) -> ReplicaLoad:
    load = getattr(engine, "load", None)
    return IDLE if load is None else ReplicaLoad(*load())


def run_fleet(engines: Sequence, router: Router, requests: RouteRequests, releases: Releases, cost=None,
              step_seconds: float | None = None, drains: Sequence[Callable[[], list]] | None = None,
              progress: Callable[[int], None] | None = None) -> tuple[StepResult, FleetTimeline]:
    """Drive ``engines`` behind ``router`` until every request is released and finished.

    ``cost``: the step-cost model (timed clock, seconds), else the step clock. ``drains``:
    per replica, the engine's KV-event drain (routers with ``needs_events``). Returns the
    fleet's step results (one :class:`StepResult` shared by the replicas, by request index;
    step numbers are each replica's own) and the timeline.
    """
    compiled = _run_compiled(engines, router, requests, releases, cost, step_seconds, drains, progress)
    if compiled is not None:
        return compiled
    N, n = len(engines), len(releases.at)
    result = StepResult.empty(engines[0].result.engine, n)
    for e in engines:
        e.result = result               # every replica writes its requests' rows
    timed = cost is not None
    unit = 1.0 if step_seconds is None else float(step_seconds)
    pending, followers, gap = releases.queue()
    local: list[list] = [[] for _ in range(N)]      # per replica: routed, not yet taken (when, i)
    clock: list = [0.0 if timed else 0] * N
    steps = [0] * N
    lines = [Timeline() for _ in range(N)]
    replica = np.full(n, -1, np.int64)
    released = np.full(n, np.nan) if timed else np.full(n, -1, np.int64)
    order: list[int] = []
    line = FleetTimeline(replica, released, order, lines, steps, clock, [0] * N, [0] * N)
    live: dict[int, object] = {}                    # routed requests not finished: RouteRequest
    wants_first = type(router).prefill_done is not Router.prefill_done
    first_due: list[set[int]] = [set() for _ in range(N)]
    ff = [getattr(e, "fast_forward", None) for e in engines]
    seen = 0
    now_of = [0.0] * N                              # step start, for on_batch (timed)

    if timed:
        line.first_scheduled = np.full(n, np.nan)
        line.prefill_tokens = np.zeros(n, np.int64)
        line.decode_tokens = np.zeros(n, np.int64)
        batches: list[list[float]] = [[] for _ in range(N)]

        def batch_hook(r: int):
            batch, first, pre, dec = batches[r], line.first_scheduled, line.prefill_tokens, line.decode_tokens

            def on_batch(step, reqs, new, context, decode):
                batch.append(cost.seconds(new, context))
                t = now_of[r]
                for i, k, d in zip(reqs, new, decode):
                    if first[i] != first[i]:        # NaN: its first scheduled step
                        first[i] = t
                    if d:
                        dec[i] += k
                    else:
                        pre[i] += k
            return on_batch
        for r, e in enumerate(engines):
            e.on_batch = batch_hook(r)
        decode_run: list = []       # the steps of a fast-forwarded decode run: (requests, step seconds)

        def run_hook(r: int):
            mine = local[r]

            def on_decode_run(k, reqs, context):
                # keep the steps that start before the next arrival at the router or at this replica
                # and, with closed-loop sessions, before another busy replica's next step (whose
                # finishing reply could release a session's next turn)
                limit = min(pending[0][0] if pending else math.inf, mine[0][0] if mine else math.inf)
                if followers:
                    limit = min([limit] + [clock[q] for q in range(N) if q != r and engines[q].has_work()])
                decode_run[:] = [reqs, decode_run_before(cost, context, k, now_of[r], limit)]
                return len(decode_run[1])
            return on_decode_run
        for r, e in enumerate(engines):
            if hasattr(e, "on_decode_run"):
                e.on_decode_run = run_hook(r)

    def seconds(t) -> float:
        return float(t) if timed else float(t) * unit

    def step_end(r: int, step: int) -> float:
        """Router seconds at the end of replica ``r``'s step ``step``."""
        return lines[r].step_end[step] if timed else (step + 1) * unit

    def release_followers(i: int, when) -> None:
        for j in followers.pop(i, ()):
            heapq.heappush(pending, (when + gap[j], j))

    def route_due(until) -> None:
        """Route every request released by ``until`` (their replicas' clocks are all at or past it)."""
        while pending and pending[0][0] <= until:
            when, i = heapq.heappop(pending)
            t = seconds(when)
            req = requests.request(i, t)
            r = router.route(req, [_load(e) for e in engines], t)
            replica[i] = r
            live[i] = req
            heapq.heappush(local[r], (when, i))

    def after_turn(r: int) -> None:
        nonlocal seen
        fin = result.finished
        while seen < len(fin):          # replies that just finished (on replica r)
            i = fin[seen]
            seen += 1
            t = step_end(r, int(result.finish_step[i]))
            req = live.pop(i)
            if wants_first and i in first_due[r]:
                first_due[r].discard(i)
                router.prefill_done(req, r, step_end(r, int(result.first_token_step[i])))
            router.finished(req, r, t)
            if i in followers:
                release_followers(i, lines[r].step_end[result.finish_step[i]] if timed else clock[r])
        if wants_first and first_due[r]:
            out = [i for i in first_due[r] if result.first_token_step[i] >= 0]
            for i in out:
                first_due[r].discard(i)
                router.prefill_done(live[i], r, step_end(r, int(result.first_token_step[i])))
        if drains is not None:
            t = seconds(clock[r])
            for ev in drains[r]():
                router.kv_event(r, from_engine(ev), t)
        w, run_, _ = _load(engines[r])
        if w > line.peak_waiting[r]:
            line.peak_waiting[r] = w
        if run_ > line.peak_running[r]:
            line.peak_running[r] = run_

    turns = 0
    while True:
        turns += 1
        if progress is not None and turns % 512 == 0:
            progress(len(result.finished) + int(result.rejected.sum()))
        best_r, best_t = -1, math.inf
        for r in range(N):
            if engines[r].has_work():
                t = clock[r]
            elif local[r]:
                t = max(clock[r], local[r][0][0])
            else:
                continue
            if t < best_t:
                best_r, best_t = r, t
        if pending and pending[0][0] <= best_t:
            route_due(pending[0][0])
            continue
        if best_r < 0:
            break
        r, e, mine = best_r, engines[best_r], local[best_r]
        # one turn of kvsim.drive.clock.run, on replica r's clock
        if not e.has_work():
            e.idle()
            clock[r] = max(clock[r], mine[0][0])
        now = clock[r]
        now_of[r] = now
        while True:
            route_due(now)              # (a rejected request's next turn may be due at once)
            if not (mine and mine[0][0] <= now):
                break
            when, i = heapq.heappop(mine)
            released[i] = when
            order.append(i)
            e.add(i)
            if result.rejected[i]:      # never runs: the router hears it finished
                router.finished(live.pop(i), r, seconds(when))
                release_followers(i, when)
            elif wants_first:
                first_due[r].add(i)
        if not timed and ff[r] is not None:
            horizon = min(pending[0][0] if pending else 1 << 62, mine[0][0] if mine else 1 << 62) - now
            if followers:               # another busy replica may end a turn, releasing its next one
                others = [clock[q] + 1 for q in range(N) if q != r and engines[q].has_work()]
                if others:
                    horizon = min(horizon, min(others) - now)
            taken = ff[r](now, horizon)
            if taken:
                clock[r] += taken
                steps[r] += taken
                after_turn(r)
                continue
        elif timed and getattr(e, "on_decode_run", None) is not None and ff[r](steps[r], 1 << 62):
            reqs, secs = decode_run
            clock[r] = lines[r].add_steps(now, secs)
            steps[r] += len(secs)
            line.decode_tokens[reqs] += len(secs)
            after_turn(r)
            continue
        if e.step(steps[r] if timed else now):
            if timed:
                lines[r].step_start.append(now)
                clock[r] = now + (batches[r].pop() if batches[r] else 0.0)
                lines[r].step_end.append(clock[r])
            else:
                clock[r] = now + 1
            steps[r] += 1
        after_turn(r)
    for e in engines:
        e.idle()
    if progress is not None:
        progress(n)
    return result, line


def _run_compiled(engines: Sequence, router: Router, requests: RouteRequests, releases: Releases, cost=None,
                  step_seconds: float | None = None, drains=None,
                  progress: Callable[[int], None] | None = None) -> tuple[StepResult, FleetTimeline] | None:
    """:func:`run_fleet` with every replica's scheduler in its engine's compiled loop, where the
    engines offer one for these releases (logged) and this clock (steps, or the roofline) and
    the router needs no KV events (or reads the replicas' devices); None otherwise.

    Replicas meet only at the router, which acts only at arrivals: before routing the requests
    released at ``T``, each replica takes, on its own, every turn that starts before ``T``
    (``FleetReplica.advance``, the readable turns one step at a time: a decode run's steps
    change nothing the router hears or reads). Their events reach the router in the readable
    loop's order of turns, (turn start, replica), before the routing, which reads the
    replicas' loads and pools as they stand then.
    """
    make = getattr(type(engines[0]), "fleet_compiled", None)
    modelled, constants = compiled_clock(cost)
    if make is None or drains is not None or releases.after is not None or not modelled:
        return None
    reps = make(engines, releases.at, constants)
    if reps is None:
        return None
    from kvsim.engines.vllm.scheduler_jit import (E_FIRST, E_TAKE, R_CACHED, R_FINISH, R_FIRST, R_OUTPUT,
                                                  R_PREEMPT, S_PEAK_R, S_PEAK_W, S_STEP)

    N, n = len(engines), len(releases.at)
    timed = cost is not None
    unit = 1.0 if step_seconds is None else float(step_seconds)
    result = StepResult.empty(engines[0].result.engine, n)
    for e in engines:
        e.result = result
    pending, _, _ = releases.queue()
    at = releases.at.tolist()
    _, _, _, rejected, _, res, released, first, pre, dec = reps[0].shared
    replica = np.full(n, -1, np.int64)
    order: list[int] = []
    finished: list[int] = []
    live: dict[int, object] = {}                    # routed requests not finished: RouteRequest
    wants_first = type(router).prefill_done is not Router.prefill_done
    first_due: list[set[int]] = [set() for _ in range(N)]
    ends = [rep.end for rep in reps]

    def seconds(t) -> float:
        return float(t) if timed else float(t) * unit

    def step_end(r: int, step) -> float:
        """Router seconds at the end of replica ``r``'s step ``step``."""
        return float(ends[r][step]) if timed else (int(step) + 1) * unit

    def first_tokens(r: int, firsts: list[int]) -> None:
        """The end of a turn: its first tokens, in the order the readable loop finds them (its set's)."""
        due = first_due[r]
        if due:
            new = set(firsts)
            for i in [i for i in due if i in new]:
                due.discard(i)
                router.prefill_done(live[i], r, step_end(r, res[R_FIRST, i]))

    def deliver(horizon: float) -> None:
        """Every replica's turns that start before ``horizon``; their events to the router."""
        logs = [(r, *rep.advance(horizon)) for r, rep in enumerate(reps) if rep.busy_before(horizon)]
        logs = [(r, log, t) for r, log, t in logs if len(log)]
        if not logs:
            return
        rows = np.concatenate([log for _, log, _ in logs])
        who = np.concatenate([np.full(len(log), r, np.int64) for r, log, _ in logs])
        if len(logs) > 1:               # turns in (start, replica) order; a replica's own in its order
            ranks = np.lexsort((who, np.concatenate([t for _, _, t in logs])))
            rows, who = rows[ranks], who[ranks]
        ends[:] = [rep.end for rep in reps]         # (the timelines may have grown)
        turn_of, firsts = (-1, -1), []
        for (kind, i, turn), r in zip(rows.tolist(), who.tolist()):
            if (r, turn) != turn_of:
                if firsts:
                    first_tokens(turn_of[0], firsts)
                turn_of, firsts = (r, turn), []
            if kind == E_TAKE:
                order.append(i)
                if rejected[i]:         # never runs: the router hears it finished
                    router.finished(live.pop(i), r, seconds(at[i]))
                elif wants_first:
                    first_due[r].add(i)
            elif kind == E_FIRST:
                if wants_first:
                    firsts.append(i)
            else:                       # E_FINISH
                finished.append(i)
                req = live.pop(i)
                if wants_first and i in first_due[r]:
                    first_due[r].discard(i)
                    router.prefill_done(req, r, step_end(r, res[R_FIRST, i]))
                router.finished(req, r, step_end(r, res[R_FINISH, i]))
        if firsts:
            first_tokens(turn_of[0], firsts)

    routed = 0
    while pending:
        now = pending[0][0]
        deliver(float(now))
        while pending and pending[0][0] <= now:     # an arrival is routed before a turn starting then
            when, i = heapq.heappop(pending)
            t = seconds(when)
            req = requests.request(i, t)
            r = router.route(req, [ReplicaLoad(*rep.load()) for rep in reps], t)
            replica[i] = r
            live[i] = req
            reps[r].route(i)
            routed += 1
            if progress is not None and routed % 512 == 0:
                progress(len(finished) + int(rejected[replica >= 0].sum()))
    deliver(math.inf)

    result.rejected[:] = rejected
    for column, row in (("cached_tokens", R_CACHED), ("first_token_step", R_FIRST), ("finish_step", R_FINISH),
                        ("output_tokens", R_OUTPUT), ("preemptions", R_PREEMPT)):
        getattr(result, column)[:] = res[row]
    result.finished = finished
    steps = [int(rep.sc[S_STEP]) for rep in reps]
    if timed:
        lines = [Timeline(rep.start[:k].tolist(), rep.end[:k].tolist()) for rep, k in zip(reps, steps)]
        clocks: list = [float(rep.clock[0]) for rep in reps]
    else:
        lines = [Timeline() for _ in reps]
        clocks = [int(rep.clock[0]) for rep in reps]
        released = np.where(np.isnan(released), -1, released).astype(np.int64)
    line = FleetTimeline(replica, released, order, lines, steps, clocks,
                         [int(rep.sc[S_PEAK_W]) for rep in reps], [int(rep.sc[S_PEAK_R]) for rep in reps])
    if timed:
        line.first_scheduled, line.prefill_tokens, line.decode_tokens = first, pre, dec
    if progress is not None:
        progress(n)
    return result, line
