"""vLLM 0.33.0's scheduler loop, compiled: a whole step or timed replay in one numba kernel.

The readable model (:mod:`kvsim.engines.vllm.scheduler`, driven by :func:`kvsim.drive.clock.run`)
stays the reference; this is the same loop, statement for statement, on arrays: the clock
(releases, idle jumps, one step at a time), ``schedule()`` (running requests, preemption,
waiting requests, chunked prefill), ``_update_after_schedule``, the async batch queue and
``update_from_output``, calling the compiled manager's kernels (:mod:`.manager_jit`) where the
readable scheduler calls :class:`~kvsim.engines.vllm.manager_jit.JitKVCacheManager`. Section
numbers (§) refer to ``docs/engines/vllm-scheduler.md``.

What it differs in: it runs every step one by one (the readable loop takes decode-only
stretches at once, §4.4: the same pool operations and step times by contract), and it keys
every request's blocks before the first step, prompt and logged outputs (the readable
manager keys them at arrival; the fake model samples exactly the logged outputs, so the keys
are the same; exact sha256 digests are numbered in another order, which only their equality
reads), holding them in the manager's arenas for the whole replay. :func:`replay` takes an engine whose configuration it covers and returns None
for any other, which the clock then runs readably: the FCFS policy, exactly
:class:`~kvsim.engines.vllm.scheduler.VllmSchedSettings` over the compiled manager, logged
(open-loop) releases, the step clock or the roofline step cost. ``KVSIM_VLLM_SCHEDULER=readable``
runs everything readably (tests, benchmarks). ``tests/test_sched_vllm_jit.py`` checks both
loops equal: every per-request result, the timeline float for float, the free queue block
for block.
"""
from __future__ import annotations

import os

import numpy as np

from kvsim.engines.vllm import rules
from kvsim.engines.vllm.manager_jit import JitKVCacheManager, allocate, cache_full, free, lookup
from kvsim.kernels.jit import njit

#: set to ``readable`` to run every replay through the readable scheduler
ENV = "KVSIM_VLLM_SCHEDULER"

WAITING, RUNNING, PREEMPTED, FINISHED = range(4)      # as kvsim.engines.vllm.scheduler
# columns of the per-request state ``q`` (VllmRequest's counters, JitSequence's pool scalars)
(F_L, F_M, F_OFF, F_READ, F_STATUS, F_COMP, F_NTOK, F_NOUT, F_PH, F_INFL, F_STALE, F_NPRE, F_CHUNK,
 F_OPEN, F_PCACHED, F_NBLK, F_NCACHED, F_ALLOC, NUM_FIELDS) = range(19)
# slots of the settings ``cfg``
(C_B, C_SEQS, C_TOKENS, C_THRESHOLD, C_ASYNC, C_CHUNKED, C_FULL_ISL, C_MML, C_CACHING, C_WATERMARK,
 C_TO_HEAD, C_TIMED, NUM_CFG) = range(13)
# slots of the loop's scalars ``sc``, kept between the slices of a replay: the waiting ring, the
# running count, finished_since_schedule, finished, steps, next release, the batch queue, and
# for a fleet's replica: releases routed to it, turns, events logged, peak waiting and running
(S_WHEAD, S_WLEN, S_NRUN, S_FSS, S_NFIN, S_STEP, S_NEXT, S_QLEN, S_Q0, S_Q1, S_NREL, S_TURN, S_NEV, S_PEAK_W,
 S_PEAK_R, NUM_SCALARS) = range(16)
# kinds of the events a fleet's replica logs per turn (what the router hears, kvsim.fleet.clock)
E_TAKE, E_FIRST, E_FINISH = range(3)
#: steps a kernel call runs before it returns (a progress report; the timeline's room grows)
SLICE_STEPS = 1 << 14
# rows of the per-request results ``res`` (StepResult's columns)
R_CACHED, R_FIRST, R_FINISH, R_OUTPUT, R_PREEMPT = range(5)

#: every function here: compiled without reference counting (numba would otherwise count a
#: reference to each array every call passes: more than a step's own work). They allocate
#: nothing; the loop's state lives in arrays the caller passes.
_step = njit(cache=True, _nrt=False)


@_step
def _log(log, tlog, sc, kind, r, now):
    """A fleet's replica logs an event of this turn (a single replay passes no log)."""
    if len(log) > 0:
        e = sc[S_NEV]
        log[e, 0], log[e, 1], log[e, 2], tlog[e] = kind, r, sc[S_TURN], now
        sc[S_NEV] = e + 1


# -- the queues -----------------------------------------------------------------------------------

@_step
def _wpush(wq, sc, r, front):
    """The waiting deque (a ring): ``append``, or ``appendleft`` with ``front``."""
    cap = len(wq)
    if front:
        sc[S_WHEAD] = (sc[S_WHEAD] - 1) % cap
        wq[sc[S_WHEAD]] = r
    else:
        wq[(sc[S_WHEAD] + sc[S_WLEN]) % cap] = r
    sc[S_WLEN] += 1


@_step
def _wpop(wq, sc):
    """``popleft``."""
    r = wq[sc[S_WHEAD]]
    sc[S_WHEAD] = (sc[S_WHEAD] + 1) % len(wq)
    sc[S_WLEN] -= 1
    return r


@_step
def _drop_finished(q, running, wq, sc):
    """Finished requests leave the running list and the waiting queue; the others keep their order."""
    k = 0
    for j in range(sc[S_NRUN]):
        if q[running[j], F_STATUS] != FINISHED:
            running[k] = running[j]
            k += 1
    sc[S_NRUN] = k
    cap, head, k = len(wq), sc[S_WHEAD], 0
    for j in range(sc[S_WLEN]):
        r = wq[(head + j) % cap]
        if q[r, F_STATUS] != FINISHED:
            wq[(head + k) % cap] = r
            k += 1
    sc[S_WLEN] = k


@_step
def _seconds(q, preq, pn, s, count, k):
    """``RooflineStepCost.seconds`` of plan ``s``'s batch: the same float operations in the same
    order (the pair sum holds integers and halves far below 2**52: exact in any order)."""
    new, ctx, pairs = 0, 0, 0.0
    for j in range(count):
        n = pn[s, j]
        c = q[preq[s, j], F_COMP] - n
        new += n
        ctx += c
        pairs += n * c + n * (n + 1) / 2
    flops = k[0] * new + k[1] * pairs + k[2] * count
    nbytes = k[3] + k[4] * (ctx + 2 * new)
    return max(flops / k[5], nbytes / k[6])


# -- schedule() (§3) and update_from_output() (§4.1, §4.2) ----------------------------------------

@_step
def _schedule(pool, tbl, keys, q, cfg, hits, running, wq, skipped, preq, pn, pdec, psamp, sc, s):
    """One ``schedule()`` into plan ``s``: its requests in scheduling order (``preq``), their new
    tokens (``pn``), decode or not (``pdec``), sampling or not (``psamp``); returns how many."""
    qnext, qprev, key, dnext, dprev, tkeys, theads, ref, st = pool
    B, max_seqs, mml = cfg[C_B], cfg[C_SEQS], cfg[C_MML]
    caching, to_head, lag = cfg[C_CACHING] != 0, cfg[C_TO_HEAD] != 0, cfg[C_ASYNC]
    no_hits = hits[:0]
    count, budget, preempted = 0, cfg[C_TOKENS], False
    # the long-prefill cap applies only when another request could use the budget (§3.2)
    threshold = cfg[C_THRESHOLD] if sc[S_NRUN] + sc[S_WLEN] > 1 else 0

    # schedule() (a): running requests, in order (§3.2)
    i = 0
    while i < sc[S_NRUN] and budget > 0:
        r = running[i]
        computed, placeholders = q[r, F_COMP], q[r, F_PH]
        # async: the in-flight step already reaches max_tokens, no extra step (§4.2)
        if placeholders > 0 and computed + 2 - placeholders >= q[r, F_L] + q[r, F_M]:
            i += 1
            continue
        m = q[r, F_NTOK] + placeholders - computed
        if 0 < threshold < m:
            m = threshold
        if m > budget:
            m = budget
        if m > mml - computed - 1:
            m = mml - computed - 1
        if m <= 0:
            i += 1
            continue
        ok = True
        slots, ntok = min(computed + m, mml), q[r, F_NTOK]
        # allocate_slots; its shortcut first: the blocks hold the new tokens, none fills
        held = q[r, F_ALLOC] != 0 and q[r, F_NBLK] * B >= slots and (
            not caching or min(slots, ntok) // B <= q[r, F_NCACHED])
        while not held:
            nb, nc = allocate(qnext, qprev, key, dnext, dprev, tkeys, theads, ref, st, tbl, q[r, F_OFF],
                              keys, q[r, F_OFF], q[r, F_NBLK], q[r, F_NCACHED], q[r, F_ALLOC] != 0, ntok // B,
                              slots, min(computed + m, ntok), no_hits, -1, 0, caching, B)
            if nb >= 0:
                q[r, F_NBLK], q[r, F_NCACHED], q[r, F_ALLOC] = nb, nc, 1
                break
            # the blocks do not fit: FCFS preempts the last running request (§3.4):
            # its blocks freed, recomputed from scratch later, back to the queue's front
            victim = running[sc[S_NRUN] - 1]
            sc[S_NRUN] -= 1
            if q[victim, F_ALLOC] != 0:
                free(qnext, qprev, key, dnext, dprev, tkeys, theads, ref, st, tbl, q[victim, F_OFF],
                     q[victim, F_NBLK], caching, to_head)
                q[victim, F_NBLK] = q[victim, F_NCACHED] = q[victim, F_ALLOC] = 0
            q[victim, F_STATUS] = PREEMPTED
            q[victim, F_COMP] = 0
            q[victim, F_STALE] = q[victim, F_INFL]
            q[victim, F_PH] = 0
            q[victim, F_NPRE] += 1
            _wpush(wq, sc, victim, True)
            preempted = True
            if victim == r:     # it preempted itself: FCFS schedules no more running requests
                ok = False
                break
        if not ok:
            break
        preq[s, count], pn[s, count], pdec[s, count] = r, m, q[r, F_CHUNK] == 0
        count += 1
        budget -= m
        i += 1

    # schedule() (b): waiting requests, only in a step that preempted nobody (§3.3)
    if not preempted:
        nskip = 0
        while budget > 0 and sc[S_WLEN] > 0 and sc[S_NRUN] < max_seqs:
            r = wq[sc[S_WHEAD]]
            if q[r, F_STALE] > 0:
                # async: its pre-preemption output is still in flight; it keeps its
                # place but lets the requests behind it go first (§4.3)
                skipped[nskip] = _wpop(wq, sc)
                nskip += 1
                continue
            ntok, h = q[r, F_NTOK], 0
            if q[r, F_READ] != 0:   # get_computed_blocks: at most num_tokens - 1 tokens (§3.3)
                h = lookup(tkeys, theads, keys, q[r, F_OFF], rules.lookup_cap_blocks_jit(ntok, B), hits)
            num_hits = h * B
            if q[r, F_NPRE] <= 0:
                q[r, F_PCACHED] = num_hits    # the first prefill's stats (§3.6)
            # waiting_chunk: capped at the threshold, then the budget; unchunked, stop (§3.3)
            m = ntok - num_hits
            if 0 < threshold < m:
                m = threshold
            if cfg[C_CHUNKED] == 0 and m > budget:
                break
            m = min(m, budget)
            # allocate_slots with the full-sequence gate and, when others run, the watermark
            gate = min(ntok, mml) if cfg[C_FULL_ISL] != 0 else -1
            reserve = cfg[C_WATERMARK] if sc[S_NRUN] > 0 else 0
            nb, nc = allocate(qnext, qprev, key, dnext, dprev, tkeys, theads, ref, st, tbl, q[r, F_OFF], keys,
                              q[r, F_OFF], q[r, F_NBLK], q[r, F_NCACHED], q[r, F_ALLOC] != 0, ntok // B,
                              min(num_hits + m, mml), min(num_hits + m, ntok), hits[:h], gate, reserve,
                              caching, B)
            if nb < 0:
                break       # head-of-line blocking: nobody behind it is tried (§3.3)
            q[r, F_NBLK], q[r, F_NCACHED], q[r, F_ALLOC] = nb, nc, 1
            _wpop(wq, sc)
            running[sc[S_NRUN]] = r
            sc[S_NRUN] += 1
            q[r, F_STATUS] = RUNNING
            q[r, F_COMP] = num_hits
            preq[s, count], pn[s, count], pdec[s, count] = r, m, False
            count += 1
            budget -= m
        for j in range(nskip - 1, -1, -1):
            _wpush(wq, sc, skipped[j], True)

    # _update_after_schedule (+ AsyncScheduler's placeholders): a request whose
    # scheduled tokens reach what it knows samples the token after them (§2)
    for j in range(count):
        r, m = preq[s, j], pn[s, j]
        q[r, F_COMP] += m
        q[r, F_INFL] += m
        chunk = q[r, F_COMP] < q[r, F_NTOK] + q[r, F_PH]
        q[r, F_CHUNK] = 1 if chunk else 0
        psamp[s, j] = not chunk
        if not chunk:
            q[r, F_PH] += lag
    sc[S_FSS] = 0
    return count


@_step
def _update_from_output(pool, tbl, keys, q, cfg, res, finished, running, wq, preq, pn, psamp, pcount, pstep, sc, s,
                        log, tlog, now):
    """Plan ``s``'s output: tokens appended, blocks cached (async), requests finished and freed."""
    qnext, qprev, key, dnext, dprev, tkeys, theads, ref, st = pool
    B, mml, caching, to_head = cfg[C_B], cfg[C_MML], cfg[C_CACHING] != 0, cfg[C_TO_HEAD] != 0
    stopped = False
    for j in range(pcount[s]):
        r, m = preq[s, j], pn[s, j]
        q[r, F_INFL] -= m
        stale = q[r, F_STALE] > 0
        if stale:
            q[r, F_STALE] -= m
        status_before = q[r, F_STATUS]
        if status_before == FINISHED or not psamp[s, j]:
            continue                    # mid-prefill: no output, no event
        had_placeholders = q[r, F_PH] > 0
        q[r, F_NTOK] += 1               # the sampled token (its block's key is known already)
        q[r, F_NOUT] += 1
        done = q[r, F_NOUT] >= q[r, F_M] or q[r, F_NTOK] >= mml
        if had_placeholders and not stale:
            q[r, F_PH] -= 1
            if status_before == RUNNING:
                # async: blocks whose tokens are now all known get cached (§4.2)
                upto = q[r, F_COMP] - q[r, F_INFL]
                if min(upto, q[r, F_NTOK]) // B > q[r, F_NCACHED]:
                    q[r, F_NCACHED] = cache_full(key, dnext, dprev, tkeys, theads, st, tbl, q[r, F_OFF], keys,
                                                 q[r, F_OFF], q[r, F_NCACHED], q[r, F_NTOK] // B, upto, B)
        if q[r, F_OPEN] != 0:           # the request's first output
            q[r, F_OPEN] = 0
            res[R_CACHED, r] = q[r, F_PCACHED]
            res[R_FIRST, r] = pstep[s]
            _log(log, tlog, sc, E_FIRST, r, now)
        if done:
            q[r, F_STATUS] = FINISHED
            sc[S_FSS] = 1
            if q[r, F_ALLOC] != 0:
                free(qnext, qprev, key, dnext, dprev, tkeys, theads, ref, st, tbl, q[r, F_OFF], q[r, F_NBLK],
                     caching, to_head)
                q[r, F_NBLK] = q[r, F_NCACHED] = q[r, F_ALLOC] = 0
            res[R_FINISH, r] = pstep[s]
            res[R_OUTPUT, r] = q[r, F_NOUT]
            res[R_PREEMPT, r] = q[r, F_NPRE]
            finished[sc[S_NFIN]] = r
            sc[S_NFIN] += 1
            _log(log, tlog, sc, E_FINISH, r, now)
            stopped = True
    if stopped:
        _drop_finished(q, running, wq, sc)


# -- the clock and the engine loop (kvsim.drive.clock.run, VllmEngine.step) ----------------------

@_step
def run_replay(pool, tbl, keys, q, cfg, k, at, order, rejected, hits, res, finished, released, first, pre, dec,
               running, wq, skipped, preq, pn, pdec, psamp, pcount, pstep, sc, clock, start, end, until, horizon,
               log, tlog):
    """Release, schedule and process outputs until every request released so far is finished,
    or the next turn would start at or after ``horizon`` (True), or until ``until`` steps are
    taken (False: call again to go on).

    ``at[order[:sc[S_NREL]]]`` are the releases in (time, log) order (a fleet's replica gets
    more between calls: those routed to it); with ``cfg[C_TIMED]`` the clock is in seconds,
    each step lasts ``_seconds`` of its batch (``k``: the roofline's constants) and ``start`` /
    ``end`` get its times, else the clock is the step number (jumps included). The batch queue
    (async, §4.2) holds two plans, ``sc[S_Q0]`` the oldest; a plan is its requests, their new
    tokens, decode or not, sampling or not (``_schedule``), its size (``pcount``) and its step
    (``pstep``). A turn is a release pass and at most one step, as in :func:`kvsim.drive.clock.run`;
    with a ``log`` (a fleet's replica) each turn logs its events: requests taken, first tokens
    and finishes, with the turn's number and start; and the peak waiting and running after it."""
    lag, timed = cfg[C_ASYNC], cfg[C_TIMED] != 0
    n = sc[S_NREL]
    now, step, p, qlen = clock[0], sc[S_STEP], sc[S_NEXT], sc[S_QLEN]
    over = False                        # every request released and finished, or the horizon reached
    while step < until:
        # -- the clock (kvsim.drive.clock.run): an idle engine jumps to the next release
        t = now
        if sc[S_NRUN] == 0 and sc[S_WLEN] == 0 and sc[S_FSS] == 0 and qlen == 0:
            if p == n:
                over = True
                break
            t = max(now, at[order[p]])
        if t >= horizon:                # a fleet's arrival is routed first (kvsim.fleet.clock)
            over = True
            break
        now = t
        while p < n and at[order[p]] <= now:
            i = order[p]
            p += 1
            released[i] = at[i]
            _log(log, tlog, sc, E_TAKE, i, now)
            if not rejected[i]:
                _wpush(wq, sc, i, False)

        # -- VllmEngine.step: schedule, then (sync, or with two plans queued) the oldest output
        took, seconds, process = False, 0.0, -1
        if sc[S_NRUN] > 0 or sc[S_WLEN] > 0 or sc[S_FSS] != 0:
            s = 0 if qlen == 0 else 1 - sc[S_Q0]
            count = _schedule(pool, tbl, keys, q, cfg, hits, running, wq, skipped, preq, pn, pdec, psamp, sc, s)
            pcount[s], pstep[s] = count, step if timed else np.int64(now)
            if count > 0 and timed:     # the clock's on_batch
                seconds = _seconds(q, preq, pn, s, count, k)
                for j in range(count):
                    r = preq[s, j]
                    if first[r] != first[r]:    # NaN: its first step
                        first[r] = now
                    if pdec[s, j]:
                        dec[r] += pn[s, j]
                    else:
                        pre[r] += pn[s, j]
            took = True
            if lag == 0:
                process = s
            else:
                sc[S_Q0 + qlen] = s
                qlen += 1
                if qlen == 2 or not (count > 0 or sc[S_NRUN] > 0 or sc[S_WLEN] > 0):
                    process = -2
        elif qlen > 0:
            process = -2
        if process == -2:               # the oldest plan of the queue
            process = sc[S_Q0]
            sc[S_Q0] = sc[S_Q1]
            qlen -= 1

        if process >= 0:
            _update_from_output(pool, tbl, keys, q, cfg, res, finished, running, wq, preq, pn, psamp, pcount, pstep,
                                sc, process, log, tlog, now)

        if took:
            if timed:
                start[step] = now
                now += seconds
                end[step] = now
            else:
                now += 1
            step += 1
        # the fleet clock reads the replica's load after each turn (its peaks)
        sc[S_TURN] += 1
        if sc[S_WLEN] > sc[S_PEAK_W]:
            sc[S_PEAK_W] = sc[S_WLEN]
        if sc[S_NRUN] > sc[S_PEAK_R]:
            sc[S_PEAK_R] = sc[S_NRUN]
    clock[0], sc[S_STEP], sc[S_NEXT], sc[S_QLEN] = now, step, p, qlen
    return over


# -- the entry point ------------------------------------------------------------------------------

def eligible(engine, at: np.ndarray, constants) -> bool:
    """Whether :func:`run_replay` models this engine exactly: a fresh, unhooked
    :class:`~kvsim.engines.vllm.scheduler.VllmEngine` of exactly ``VllmSchedSettings`` with
    the FCFS policy over the compiled manager, every request sampling at least one token,
    releases in step numbers (``constants`` None) or finite seconds (the roofline's constants)."""
    from kvsim.engines.vllm.scheduler import VllmEngine, VllmSchedSettings, VllmScheduler

    if os.environ.get(ENV, "compiled") == "readable":
        return False
    if type(engine) is not VllmEngine or type(engine.settings) is not VllmSchedSettings \
            or type(engine.scheduler) is not VllmScheduler or type(engine.scheduler.cache) is not JitKVCacheManager:
        return False
    if engine.settings.policy != "fcfs" or engine.has_work() or engine.result.finished or engine.result.rejected.any():
        return False
    # a caller that hooks the engine (a batch callback, a replaced method) wants the readable loop
    if engine.on_batch is not None or engine.on_decode_run is not None \
            or any(name in vars(engine) for name in ("step", "schedule", "fast_forward", "add")):
        return False
    at = np.asarray(at)
    if at.ndim != 1 or len(at) != len(engine.prompts) or any(len(o) == 0 for o in engine.outputs):
        return False
    if constants is None:
        return at.dtype.kind in "iu"
    return at.dtype.kind == "f" and bool(np.isfinite(at).all()) and len(constants) == 7


def _key_requests(engine, cache: JitKVCacheManager, index: np.ndarray, q: np.ndarray) -> list:
    """Key requests ``index``, prompt and logged outputs (the keys the readable manager gives
    them), into ``cache``'s arenas: their offsets and whether they read the cache go to ``q``;
    returns the arena regions to release after the replay. Prompts and outputs given as views
    of flat arrays (:class:`kvsim.drive.requests.Ragged`) are keyed in one call."""
    prompts, outputs = engine.prompts, engine.outputs
    loras, salts, logprobs = engine.loras, engine.salts, engine.prompt_logprobs
    reads = np.full(len(q), cache.enable_caching)
    if logprobs is not None:
        reads &= ~np.asarray(logprobs, bool)
    if cache.hasher.algo == "fast" and hasattr(prompts, "flat") and hasattr(outputs, "flat"):
        region, off = cache.key_requests(index, prompts.flat, prompts.offsets, outputs.flat, outputs.offsets,
                                         loras, salts)
        q[index, F_OFF], q[index, F_READ] = off, reads[index]
        return [region]
    seqs = []
    for i in index.tolist():
        seq = cache.new_sequence(str(i), prompts[i], None if loras is None else loras[i],
                                 None if salts is None else salts[i], outputs=outputs[i],
                                 skip_reading_prefix_cache=logprobs is not None and bool(logprobs[i]))
        if seq.exact is not None:       # exact digests: the outputs' blocks hashed now
            cache.append_many(seq, np.asarray(outputs[i]))
        q[i, F_READ] = int(reads[i])
        seqs.append((i, seq))
    for i, seq in seqs:                 # (the arenas may have moved while they filled)
        q[i, F_OFF] = seq.off
    return [seq for _, seq in seqs]


def replay(engine, at, constants=None, progress=None):
    """Run ``engine``'s whole replay compiled, releases ``at`` (step numbers, or seconds with the
    roofline ``constants``): (the clock at the end, steps, step starts, step ends, released,
    first scheduled, prefill tokens, decode tokens), the engine's result filled in; None when
    :func:`eligible` says no (nothing changed then). ``progress(done)`` hears the requests
    finished or rejected after each slice of :data:`SLICE_STEPS` steps."""
    if not eligible(engine, at, constants):
        return None
    s, cache, result = engine.settings, engine.scheduler.cache, engine.result
    B, n = s.block_size, len(engine.prompts)
    at = np.asarray(at)
    L = np.array([len(p) for p in engine.prompts], np.int64)
    M = np.array([len(o) for o in engine.outputs], np.int64)
    rejected = ~rules.fits_ever(L, M, B, s.num_gpu_blocks)       # never scheduled (§1)
    q = np.zeros((n, NUM_FIELDS), np.int64)
    q[:, F_L], q[:, F_M], q[:, F_NTOK], q[:, F_OPEN] = L, M, L, 1
    seqs = _key_requests(engine, cache, np.flatnonzero(~rejected), q)
    cfg = np.zeros(NUM_CFG, np.int64)
    cfg[C_B], cfg[C_SEQS], cfg[C_TOKENS] = B, s.max_num_seqs, s.max_num_batched_tokens
    cfg[C_THRESHOLD], cfg[C_ASYNC] = s.long_prefill_token_threshold, int(s.async_scheduling)
    cfg[C_CHUNKED], cfg[C_FULL_ISL] = int(s.enable_chunked_prefill), int(s.reserve_full_isl)
    cfg[C_MML], cfg[C_CACHING] = engine.scheduler.max_model_len, int(cache.enable_caching)
    cfg[C_WATERMARK], cfg[C_TO_HEAD] = cache.watermark_blocks, int(cache.unhashed_to_head)
    cfg[C_TIMED] = int(constants is not None)
    k = np.asarray(constants if constants is not None else [0.0] * 7, np.float64)
    order = np.argsort(at, kind="stable")        # the release heap's (time, log order)
    most = int(((L + M - 1) // B).max()) + 1 if n else 1
    res = np.full((5, n), -1, np.int64)
    res[R_OUTPUT] = res[R_PREEMPT] = 0
    finished = np.zeros(n, np.int64)
    released, first = np.full(n, np.nan), np.full(n, np.nan)
    pre, dec = np.zeros(n, np.int64), np.zeros(n, np.int64)
    P = max(1, min(s.max_num_seqs, n))
    loop = (np.zeros(max(n, 1), np.int64), np.zeros(max(n, 1), np.int64), np.zeros(max(n, 1), np.int64),
            np.zeros((2, P), np.int64), np.zeros((2, P), np.int64), np.zeros((2, P), np.bool_),
            np.zeros((2, P), np.bool_), np.zeros(2, np.int64), np.zeros(2, np.int64), np.zeros(NUM_SCALARS, np.int64),
            np.zeros(1))
    timed = constants is not None
    start, end = np.zeros(SLICE_STEPS if timed else 0), np.zeros(SLICE_STEPS if timed else 0)
    args = (cache.pool.arrays, cache.tbl, cache.keys, q, cfg, k, at.astype(np.float64), order, rejected,
            np.zeros(most, np.int32), res, finished, released, first, pre, dec, *loop)
    sc, clock = loop[-2], loop[-1]
    sc[S_NREL] = n
    skipped = int(rejected.sum())
    no_log = (np.zeros((0, 3), np.int64), np.zeros(0))
    while not run_replay(*args, start, end, sc[S_STEP] + SLICE_STEPS, np.inf, *no_log):
        if progress is not None:
            progress(int(sc[S_NFIN]) + skipped)
        if timed and len(start) < sc[S_STEP] + SLICE_STEPS:     # room for the next slice
            start, end = (np.concatenate([a, np.zeros(len(a))]) for a in (start, end))
    for seq in seqs:
        seq.num_blocks = seq.num_cached = 0
        seq.allocated = False
        cache.release(seq)
    result.rejected[:] = rejected
    result.cached_tokens[:], result.first_token_step[:], result.finish_step[:] = res[R_CACHED], res[R_FIRST], \
        res[R_FINISH]
    result.output_tokens[:], result.preemptions[:] = res[R_OUTPUT], res[R_PREEMPT]
    result.finished = finished[:sc[S_NFIN]].tolist()
    steps = int(sc[S_STEP])
    if not timed:
        return int(clock[0]), [], [], released.astype(np.int64), None, None, None
    return steps, start[:steps].tolist(), end[:steps].tolist(), released, first, pre, dec


# -- a fleet's replicas (kvsim.fleet.clock) -------------------------------------------------------

class FleetReplica:
    """One replica of a fleet on :func:`run_replay`, re-entered between the router's decisions.

    The loop's state (the per-request ``q`` and results, shared by the fleet's replicas since a
    request runs on one; the running list, the waiting ring, the batch queue's plans, the clock
    and the scalars, this replica's own) lives in arrays kept here between calls. :meth:`route`
    hands it a request the router sent it (keyed at once, in its own pool's arenas);
    :meth:`advance` takes every turn that starts before a time and returns the turns' events;
    :meth:`load` is what the router polls.
    """

    def __init__(self, engine, shared: tuple, timed: bool) -> None:
        self.engine = engine
        self.cache = cache = engine.scheduler.cache
        s, n = engine.settings, len(engine.prompts)
        q, k, at, rejected, hits, res, released, first, pre, dec = shared
        self.q, self.rejected, self.shared = q, rejected, shared
        cfg = np.zeros(NUM_CFG, np.int64)
        cfg[C_B], cfg[C_SEQS], cfg[C_TOKENS] = s.block_size, s.max_num_seqs, s.max_num_batched_tokens
        cfg[C_THRESHOLD], cfg[C_ASYNC] = s.long_prefill_token_threshold, int(s.async_scheduling)
        cfg[C_CHUNKED], cfg[C_FULL_ISL] = int(s.enable_chunked_prefill), int(s.reserve_full_isl)
        cfg[C_MML], cfg[C_CACHING] = engine.scheduler.max_model_len, int(cache.enable_caching)
        cfg[C_WATERMARK], cfg[C_TO_HEAD] = cache.watermark_blocks, int(cache.unhashed_to_head)
        cfg[C_TIMED] = int(timed)
        P = max(1, min(s.max_num_seqs, n))
        self.order = np.zeros(max(n, 1), np.int64)      # the requests routed here, in routing order
        self.sc = np.zeros(NUM_SCALARS, np.int64)
        self.clock = np.zeros(1)
        self._head = (q, cfg, k, at, self.order, rejected, hits, res, np.zeros(max(n, 1), np.int64), released,
                      first, pre, dec, np.zeros(max(n, 1), np.int64), np.zeros(max(n, 1), np.int64),
                      np.zeros(max(n, 1), np.int64), np.zeros((2, P), np.int64), np.zeros((2, P), np.int64),
                      np.zeros((2, P), np.bool_), np.zeros((2, P), np.bool_), np.zeros(2, np.int64),
                      np.zeros(2, np.int64), self.sc, self.clock)
        self.timed = timed
        self.start, self.end = np.zeros(1024 if timed else 0), np.zeros(1024 if timed else 0)
        self.log, self.tlog = np.zeros((64, 3), np.int64), np.zeros(64)
        self.live: dict[int, object] = {}               # routed, not finished: the request's sequence

    def route(self, i: int) -> None:
        """Request ``i`` reaches this replica (released at ``at[i]``, after those routed before):
        keyed in its pool's arenas (copied from the fleet's :class:`LogKeys` where it has them)."""
        e, cache, q = self.engine, self.cache, self.q
        if not self.rejected[i]:
            tbl, log = cache.tbl, cache.log
            skip = e.prompt_logprobs is not None and bool(e.prompt_logprobs[i])
            if log is not None:
                o = log.off[i]
                seq = cache.place_keys(log.keys[o:o + log.count[i]], (q[i, F_L] + q[i, F_M]) // log.block_size + 2)
            else:
                seq = cache.new_sequence(str(i), e.prompts[i], None if e.loras is None else e.loras[i],
                                         None if e.salts is None else e.salts[i], outputs=e.outputs[i],
                                         skip_reading_prefix_cache=skip)
                if seq.exact is not None:   # exact digests: the outputs' blocks hashed now
                    cache.append_many(seq, np.asarray(e.outputs[i]))
            q[i, F_READ] = int(cache.enable_caching and not skip)
            self.live[i] = seq
            if cache.tbl is tbl:
                q[i, F_OFF] = seq.off
            else:                           # the arenas were compacted: every region moved
                for j, other in self.live.items():
                    q[j, F_OFF] = other.off
        sc = self.sc
        self.order[sc[S_NREL]] = i
        sc[S_NREL] += 1

    def busy_before(self, horizon: float) -> bool:
        """Whether a turn of this replica starts before ``horizon``."""
        sc = self.sc
        if sc[S_NRUN] or sc[S_WLEN] or sc[S_FSS] or sc[S_QLEN]:
            return self.clock[0] < horizon
        return sc[S_NEXT] < sc[S_NREL] and max(self.clock[0], self._head[3][self.order[sc[S_NEXT]]]) < horizon

    def advance(self, horizon: float) -> tuple[np.ndarray, np.ndarray]:
        """Every turn that starts before ``horizon``: the turns' events (kind, request, turn) and
        their turns' starts, in the order they happened; finished requests' regions released."""
        sc = self.sc
        need = 3 * (int(sc[S_NREL]) - int(sc[S_NFIN])) + 3     # at most: taken, first token, finished
        if len(self.log) < need:
            room = max(need, 2 * len(self.log))
            self.log, self.tlog = np.zeros((room, 3), np.int64), np.zeros(room)
        sc[S_NEV] = 0
        cache = self.cache
        while True:
            until = len(self.start) if self.timed else 1 << 62
            if run_replay(cache.pool.arrays, cache.tbl, cache.keys, *self._head, self.start, self.end, until,
                          float(horizon), self.log, self.tlog):
                break
            self.start, self.end = (np.concatenate([a, np.zeros(len(a))]) for a in (self.start, self.end))
        m = int(sc[S_NEV])
        log = self.log[:m]
        for i in log[log[:, 0] == E_FINISH, 1].tolist():
            seq = self.live.pop(i)
            seq.num_blocks = seq.num_cached = 0
            seq.allocated = False
            cache.release(seq)
        return log, self.tlog[:m]

    def load(self) -> tuple[int, int, float]:
        """``VllmEngine.load``: waiting and running requests, and the KV usage."""
        usable = self.engine.settings.num_gpu_blocks - 1
        usage = 1.0 - self.cache.num_free_blocks / usable if usable > 0 else 0.0
        return int(self.sc[S_WLEN]), int(self.sc[S_NRUN]), usage


def fleet(engines, at, constants=None) -> list[FleetReplica] | None:
    """``engines``, a fleet's replicas, on the compiled loop (releases ``at`` in steps, or in
    seconds with the roofline ``constants``); None unless :func:`eligible` says yes for every
    one and they share their settings and requests (nothing changed then)."""
    first_engine = engines[0]
    if not all(eligible(e, at, constants) for e in engines):
        return None
    inputs = ("prompts", "outputs", "loras", "salts", "prompt_logprobs")
    if any(e.settings != first_engine.settings or any(getattr(e, a) is not getattr(first_engine, a) for a in inputs)
           for e in engines):
        return None
    s, n = first_engine.settings, len(first_engine.prompts)
    L = np.array([len(p) for p in first_engine.prompts], np.int64)
    M = np.array([len(o) for o in first_engine.outputs], np.int64)
    rejected = ~rules.fits_ever(L, M, s.block_size, s.num_gpu_blocks)       # never scheduled (§1)
    q = np.zeros((n, NUM_FIELDS), np.int64)
    q[:, F_L], q[:, F_M], q[:, F_NTOK], q[:, F_OPEN] = L, M, L, 1
    k = np.asarray(constants if constants is not None else [0.0] * 7, np.float64)
    most = int(((L + M - 1) // s.block_size).max()) + 1 if n else 1
    res = np.full((5, n), -1, np.int64)
    res[R_OUTPUT] = res[R_PREEMPT] = 0
    shared = (q, k, np.asarray(at).astype(np.float64), rejected, np.zeros(most, np.int32), res, np.full(n, np.nan),
              np.full(n, np.nan), np.zeros(n, np.int64), np.zeros(n, np.int64))
    log = fleet_log_keys(first_engine)
    if log is not None:
        for e in engines:
            e.scheduler.cache.log = log
    return [FleetReplica(e, shared, constants is not None) for e in engines]


def fleet_log_keys(engine):
    """Every request of ``engine``'s log keyed once, for whichever replica it is routed to and
    for the router (which routes those that never fit too, and keys prompts without prefix
    caching too): a :class:`~kvsim.engines.vllm.manager_jit.LogKeys`, kept on the log's prompts
    per block size, so that a fleet's replays share it (the replay without prefix caching
    forked after it too); None where the pool does not key a flat log in one call."""
    cache, prompts, outputs = engine.scheduler.cache, engine.prompts, engine.outputs
    if cache.hasher.algo != "fast" or not hasattr(prompts, "flat") or not hasattr(outputs, "flat"):
        return None
    key = (cache.block_size, id(outputs), id(engine.loras), id(engine.salts))
    log = prompts.keyed.get(key)
    if log is None:
        log = prompts.keyed[key] = cache.log_keys(np.arange(len(prompts)), prompts.flat, prompts.offsets, outputs.flat,
                                                  outputs.offsets, engine.loras, engine.salts)
    return log
