"""Benchmark: the one-pass hit-rate curve against exact replays, for time and accuracy.

For each trace and policy setting:

- ``exact``: one exact sequential replay per capacity (``replay(policy, ...)``, the
  compiled engines, hashing included) at ``--points`` log-spaced capacities from 1e4 to
  1e8 tokens plus unlimited; the time of *one* replay is the median over those;
- ``curve``: ``kvsim.sweep.curve_model`` (hashing + the stack pass + the step function)
  and its evaluation at the same capacities, ``--repeat`` times, median;
- ``ratio`` = curve / one exact replay (target: <= 2), and the curve's max and mean
  absolute error in token hit rate against the exact replays at those capacities.

Everything runs in one process pinned to one CPU, after a warm-up that loads the
compiled kernels; trace loading and interpreter start-up are not timed. Wall-clock
(``perf_counter``) and CPU (``process_time``) times are both reported: on a shared
machine the CPU-time ratio is the steadier one.

With ``--random N`` it instead measures the curve's error on N small random workloads
(the generator of ``tests/test_sweep_curves.py``: shared system prompts, follow-ups cut
anywhere, block-aligned prompts, prompt-logprob requests, salts and LoRA adapters; block
and page size 4), binned by the share of requests the capacity rejects.

    .venv/bin/python bench/bench_sweep.py
    .venv/bin/python bench/bench_sweep.py --traces conversation --settings apc:16 --points 20 --json out.json
    .venv/bin/python bench/bench_sweep.py --random 30
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from common import pin_to_one_cpu  # noqa: E402


def _pinned() -> str:
    cpu = pin_to_one_cpu()
    return "not pinned" if cpu is None else f"pinned to CPU {cpu}"


ROOT = Path(__file__).resolve().parents[1]
TRACES = {"conversation": ROOT / "traces" / "public" / "conversation_trace.jsonl",
          "synthetic": ROOT / "traces" / "public" / "synthetic_trace.jsonl"}
SETTINGS = ("apc:16", "radix:1", "radix:16")


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def options(policy: str, size: int, capacity: float):
    from kvsim.engines.options import SimOptions

    key = "block_size" if policy == "apc" else "page_size"
    return SimOptions(capacity_tokens=capacity, **{key: size})


def bench_setting(trace, policy: str, size: int, capacities: list[float], repeat: int) -> dict:
    from functools import partial

    from kvsim.drive.sequential import replay as replay_policy
    from kvsim.drive.metrics import summarize
    from kvsim.sweep import curve_model

    replay = partial(replay_policy, policy)
    kw = {"block_size": size} if policy == "apc" else {"page_size": size}
    # warm-up: compile / load every kernel on a small prefix
    small = trace.head(200)
    replay(small, options(policy, size, 1e6))
    curve_model(small, policy, **kw).hit_rate([1e6])

    exact, ex_wall, ex_cpu, usable = [], [], [], []
    for cap in capacities:
        result, w, c = timed(lambda cap=cap: replay(trace, options(policy, size, cap)))
        exact.append(summarize(result, trace)["token_hit_rate"])
        usable.append(result.capacity_tokens)
        ex_wall.append(w)
        ex_cpu.append(c)
    cv_wall, cv_cpu = [], []
    for _ in range(repeat):
        (_, rates), w, c = timed(lambda: _curve(curve_model, trace, policy, kw, usable))
        cv_wall.append(w)
        cv_cpu.append(c)
    errors = [abs(a - b) for a, b in zip(rates, exact)]
    one_wall, one_cpu = statistics.median(ex_wall), statistics.median(ex_cpu)
    return {
        "policy": policy, "size": size, "points": len(capacities),
        "exact_one_wall_s": one_wall, "exact_one_cpu_s": one_cpu,
        "exact_min_wall_s": min(ex_wall), "exact_max_wall_s": max(ex_wall),
        "curve_wall_s": statistics.median(cv_wall), "curve_cpu_s": statistics.median(cv_cpu),
        "ratio_wall": statistics.median(cv_wall) / one_wall, "ratio_cpu": statistics.median(cv_cpu) / one_cpu,
        "max_abs_error": max(errors), "mean_abs_error": sum(errors) / len(errors),
        "rows": [{"capacity": c, "usable": u, "exact": e, "curve": r}
                 for c, u, e, r in zip(capacities, usable, exact, rates)],
    }


def _curve(curve_model, trace, policy, kw, usable):
    model = curve_model(trace, policy, **kw)
    return model, model.hit_rate(usable)


def random_workload(seed: int, n: int = 300):
    """The tests' random workload (tests/test_sweep_curves.py::workload) with every feature on."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_sweep_curves import workload

    return workload(seed, n=n, aligned=True, logprobs=True, namespaces=True)


def random_accuracy(seeds: int) -> None:
    import numpy as np

    from kvsim.drive.sequential import replay
    from kvsim.drive.metrics import summarize
    from kvsim.sweep import curve_model

    caps = [16, 40, 80, 120, 160, 240, 400, 1000, 4000, math.inf]
    bins = [("none", 0.0, 0.0), ("<= 5%", 1e-12, 0.05), ("> 5%", 0.05 + 1e-12, 1.0)]
    print(f"{seeds} random workloads of 300 requests, capacities {caps[:-1]} tokens and unlimited\n")
    print("| model | requests rejected | points | max abs error | mean abs error |")
    print("|---|---|---:|---:|---:|")
    for policy, kw in (("apc", {"block_size": 4}), ("radix", {"page_size": 1, "granule": 1}),
                       ("radix", {"page_size": 4})):
        rows = []
        for seed in range(seeds):
            tr = random_workload(seed)
            model = curve_model(tr, policy, **kw)
            for cap in caps:
                opts = options(policy, kw.get("block_size", kw.get("page_size")), cap)
                r = replay(policy, tr, opts)
                s = summarize(r, tr)
                rows.append((s["rejected"] / len(tr), abs(s["token_hit_rate"] - model.hit_rate([r.capacity_tokens])[0])))
        arr = np.array(rows)
        label = f"{policy} " + ", ".join(f"{k} {v}" for k, v in kw.items())
        for name, lo, hi in bins:
            sel = (arr[:, 0] >= lo) & (arr[:, 0] <= hi)
            if sel.any():
                print(f"| {label} | {name} | {int(sel.sum())} | {arr[sel, 1].max():.4f} | {arr[sel, 1].mean():.5f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", default="conversation,synthetic")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="policy:size list, e.g. apc:16,radix:1")
    parser.add_argument("--points", type=int, default=20, help="capacities (the last one is unlimited)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--random", type=int, default=0, metavar="N",
                        help="measure the error on N random workloads instead")
    args = parser.parse_args()
    pinned = _pinned()
    if args.random:
        random_accuracy(args.random)
        return 0
    import numpy as np

    import kvsim

    caps = [float(c) for c in np.geomspace(1e4, 1e8, args.points - 1)] + [math.inf]
    results = []
    for name in args.traces.split(","):
        trace = kvsim.load_trace(TRACES[name], format="mooncake")
        for item in args.settings.split(","):
            policy, size = item.split(":")
            r = bench_setting(trace, policy, int(size), caps, args.repeat)
            r["trace"] = name
            results.append(r)
            print(f"{name:12s} {policy}:{size:<3s} one exact replay {r['exact_one_wall_s']:.2f} s "
                  f"(cpu {r['exact_one_cpu_s']:.2f}), curve for {r['points']} capacities "
                  f"{r['curve_wall_s']:.2f} s (cpu {r['curve_cpu_s']:.2f}): ratio {r['ratio_wall']:.2f} "
                  f"(cpu {r['ratio_cpu']:.2f}); |error| max {r['max_abs_error']:.4f} "
                  f"mean {r['mean_abs_error']:.5f}", flush=True)
    print(f"\n{pinned}; python {sys.version.split()[0]}; {args.points} capacities 1e4..1e8 + unlimited; "
          f"curve median of {args.repeat}\n")
    print("| trace | policy | one exact replay s (cpu) | curve, all capacities s (cpu) | ratio wall (cpu) "
          "| max abs error | mean abs error |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        label = f"apc block {r['size']}" if r["policy"] == "apc" else f"radix page {r['size']}"
        print(f"| {r['trace']} | {label} | {r['exact_one_wall_s']:.2f} ({r['exact_one_cpu_s']:.2f}) | "
              f"{r['curve_wall_s']:.2f} ({r['curve_cpu_s']:.2f}) | {r['ratio_wall']:.2f} ({r['ratio_cpu']:.2f}) | "
              f"{r['max_abs_error']:.4f} | {r['mean_abs_error']:.5f} |")
    if args.json:
        args.json.write_text(json.dumps({"pinned": pinned, "results": results}, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
