"""Benchmark: what a fleet of 8 replicas behind ``cache_aware`` costs beside the single-replica replay.

The same log, replayed once through one engine (kvsim simulate's replay) and once through
8 replicas behind SGLang's cache-aware router (``kvsim simulate --replicas 8 --router
cache_aware``), per engine and replay mode:

- ``sequential``: the log of ``bench/common.py`` (synthetic multi-turn chats: 8 shared
  system prompts, replies resent in later turns), ``--sessions`` conversations, a capacity
  of ``--capacity`` tokens per replica; the fleet: routing every request (the gateway's
  approximate tree), then each replica's sub-log through the fast replay;
- ``steps``: SGLang's generated-shared-prefix workload (``kvsim/workloads/shared_prefix.py``,
  ``--groups`` groups of 16, SGLang's 2,048 + 128 tokens, 256 out) at ``--rate``
  requests/s on the step clock (0.05 s per step); the fleet: 8 scheduler models on the
  fleet clock. Also timed: the 8 replicas each alone on its share of the log (the same
  steps, ``tests/test_fleet_driver.py``): the fleet's cost over theirs is the routing and
  the fleet clock, where the single replica of the whole log models different work (one
  engine's queue instead of eight engines' batches) once memory is tight.

Times are CPU seconds (``time.process_time``: other jobs on a shared machine do not inflate
them), medians of ``--runs``, one CPU, after a warm-up run (compiled kernels loaded). The
bounds (two more unlimited sequential replays) are timed apart: they are the attribution,
not the routing. The ratio is fleet / single.

    .venv/bin/python bench/bench_fleet.py                        # both modes, both engines
    .venv/bin/python bench/bench_fleet.py --modes sequential --runs 5
    .venv/bin/python bench/bench_fleet.py --write-gsp gsp.jsonl   # the workload docs/fleet.md uses
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
from common import pin_to_one_cpu, synthetic_chat  # noqa: E402

from kvsim.drive.concurrent import ReplayMode, run_concurrent  # noqa: E402
from kvsim.drive.sequential import replay  # noqa: E402
from kvsim.engines.options import SimOptions  # noqa: E402
from kvsim.fleet.bounds import bounds  # noqa: E402
from kvsim.fleet.concurrent import run_fleet_concurrent  # noqa: E402
from kvsim.fleet.config import FleetSpec  # noqa: E402
from kvsim.fleet.sequential import fleet_replay  # noqa: E402
from kvsim.workloads import shared_prefix  # noqa: E402


def cpu_median(fn, runs: int):
    """(median CPU seconds of ``fn()``, its last result)."""
    times, out = [], None
    for _ in range(runs):
        c0 = time.process_time()
        out = fn()
        times.append(time.process_time() - c0)
    return statistics.median(times), out


def bench_sequential(args, fleet: FleetSpec) -> None:
    trace = synthetic_chat(0, args.sessions)
    cap = "unlimited" if args.capacity is None else f"{args.capacity:,.0f} tokens per replica"
    print(f"sequential: synthetic chats, {len(trace):,} requests, {trace.num_prompt_tokens / 1e6:.1f}M prompt tokens, "
          f"capacity {cap}")
    opts = SimOptions(capacity_tokens=args.capacity)
    for policy in args.engines.split(","):
        replay(policy, trace, opts)                                     # warm-up: kernels loaded
        fleet_replay(policy, trace.head(200), opts, fleet)
        one_s, one = cpu_median(lambda: replay(policy, trace, opts), args.runs)
        many_s, run = cpu_median(lambda: fleet_replay(policy, trace, opts, fleet), args.runs)
        bound_s, _ = cpu_median(lambda: bounds(policy, trace, opts, run.replica, run.order), 1)
        ok = ~one.rejected
        single_rate = one.cached_tokens[ok].sum() / trace.prompt_lengths[ok].sum()
        ok = ~run.result.rejected
        fleet_rate = run.result.cached_tokens[ok].sum() / trace.prompt_lengths[ok].sum()
        print(f"  {policy}: single {one_s:.3f} s, fleet {many_s:.3f} s: {many_s / one_s:.2f}x "
              f"(routing {run.routing_s:.3f} s wall); bounds {bound_s:.3f} s; hit rate {single_rate:.1%} -> "
              f"{fleet_rate:.1%}")


def bench_steps(args, fleet: FleetSpec) -> None:
    trace = shared_prefix.trace(groups=args.groups, rate=args.rate)
    cap = "unlimited" if args.steps_capacity is None else f"{args.steps_capacity:,.0f} tokens per replica"
    print(f"steps: generated-shared-prefix, {len(trace):,} requests, {trace.num_prompt_tokens / 1e6:.1f}M prompt "
          f"tokens at {args.rate} req/s, capacity {cap}")
    opts, mode = SimOptions(capacity_tokens=args.steps_capacity), ReplayMode("steps")
    for policy in args.engines.split(","):
        run_concurrent(trace.head(50), [policy], opts, mode)             # warm-up
        one_s, one = cpu_median(lambda: run_concurrent(trace, [policy], opts, mode)[policy], args.runs)
        many_s, run = cpu_median(lambda: run_fleet_concurrent(trace, [policy], opts, mode, fleet,
                                                              with_bounds=False)[policy], args.runs)
        bound_s, _ = cpu_median(lambda: bounds(policy, trace, opts, run.replica, run.line.order), 1)
        shares = [trace.select(np.flatnonzero(run.replica == r)) for r in range(fleet.replicas)]
        alone_s, _ = cpu_median(lambda: [run_concurrent(t, [policy], opts, mode) for t in shares if len(t)],
                                args.runs)
        s = run.steps
        ok = ~s.rejected
        print(f"  {policy}: single {one_s:.3f} s, fleet {many_s:.3f} s: {many_s / one_s:.2f}x; the 8 replicas "
              f"alone on their shares {alone_s:.3f} s: fleet / alone {many_s / alone_s:.2f}x; bounds {bound_s:.3f} s; "
              f"hit rate {one.steps.cached_tokens.sum() / trace.prompt_lengths.sum():.1%} -> "
              f"{s.cached_tokens[ok].sum() / trace.prompt_lengths[ok].sum():.1%}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="sequential,steps")
    ap.add_argument("--engines", default="apc,radix")
    ap.add_argument("--runs", type=int, default=3, help="runs per side (median)")
    ap.add_argument("--sessions", type=int, default=1000, help="sequential: conversations of the chat log")
    ap.add_argument("--capacity", type=float, default=None, help="sequential: KV tokens per replica (default: "
                    "unlimited, so that both sides hold the same prefixes)")
    ap.add_argument("--groups", type=int, default=64, help="steps: shared-prefix groups of 16 requests")
    ap.add_argument("--rate", type=float, default=16.0, help="steps: requests per second")
    ap.add_argument("--steps-capacity", type=float, default=None, help="steps: KV tokens per replica (default: "
                    "unlimited)")
    ap.add_argument("--write-gsp", type=Path, default=None,
                    help="write the generated-shared-prefix log (SGLang's defaults, --rate) and stop")
    args = ap.parse_args()
    if args.write_gsp is not None:
        n = shared_prefix.write(args.write_gsp, groups=args.groups, rate=args.rate)
        print(f"{n:,} requests written to {args.write_gsp}")
        return 0
    cpu = pin_to_one_cpu()
    print(f"pinned to CPU {cpu}; fleet: 8 replicas behind cache_aware; CPU-time medians of {args.runs}")
    fleet = FleetSpec(8, "cache_aware")
    if "sequential" in args.modes:
        bench_sequential(args, fleet)
    if "steps" in args.modes:
        bench_steps(args, fleet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
