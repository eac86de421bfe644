"""Benchmark: the optimal hit-rate curve against one exact replay.

For each trace and policy setting:

- ``exact``: one exact sequential replay (the compiled engines, hashing included) at
  each of ``--replays`` capacities spread over the curve's range; the time of *one*
  replay is the median;
- ``optimal``: ``kvsim.sweep.optimal.optimal_model`` (the prefix trie) and its
  evaluation at ``--points`` log-spaced capacities from 1e4 to 5e7 tokens, ``--repeat``
  times, median;
- ``ratio`` = optimal curve / one exact replay, and a check that no exact replay beat
  the optimum at the capacities both ran at.

Everything runs in one process pinned to one CPU, after a warm-up that compiles the
kernels; trace loading is not timed. Wall-clock (``perf_counter``) and CPU
(``process_time``) times are both reported; on a shared machine the CPU-time ratio is
the steadier one.

    .venv/bin/python bench/bench_optimal.py
    .venv/bin/python bench/bench_optimal.py --settings apc:16 --points 20 --json out.json
"""
from __future__ import annotations

from functools import partial

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from common import pin_to_one_cpu  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRACES = {"conversation": ROOT / "traces" / "public" / "conversation_trace.jsonl",
          "synthetic": ROOT / "traces" / "public" / "synthetic_trace.jsonl"}
SETTINGS = ("apc:16", "radix:1", "radix:16")


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", default="conversation", help="comma list of: " + ", ".join(TRACES))
    ap.add_argument("--settings", default=",".join(SETTINGS), help="policy:size, comma list")
    ap.add_argument("--points", type=int, default=20, help="capacities of the optimal curve")
    ap.add_argument("--replays", type=int, default=5, help="exact replays timed per setting")
    ap.add_argument("--repeat", type=int, default=5, help="optimal curves timed per setting")
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args(argv)

    import numpy as np

    from kvsim.io.load import load_trace
    from kvsim.drive.sequential import replay
    from kvsim.engines.options import SimOptions
    from kvsim.sweep.optimal import optimal_model

    cpu = pin_to_one_cpu()
    print(f"kvsim optimal-curve benchmark ({'not pinned' if cpu is None else f'pinned to CPU {cpu}'})")
    caps = np.geomspace(1e4, 5e7, args.points)
    rows = []
    for name in args.traces.split(","):
        trace = load_trace(TRACES[name])
        for setting in args.settings.split(","):
            policy, size = setting.split(":")
            size = int(size)
            key = "block_size" if policy == "apc" else "page_size"
            replay_policy = partial(replay, policy)

            def curve():
                model = optimal_model(trace, policy, **{key: size})
                return model, model.hit_rate(caps)

            curve()  # compile the kernels and warm the caches
            replay_policy(trace, SimOptions(capacity_tokens=1e6, **{key: size}))
            runs = [timed(curve) for _ in range(args.repeat)]
            model, rates = runs[0][0]
            picks = caps[np.linspace(0, len(caps) - 1, args.replays).round().astype(int)]
            exact = []
            for cap in picks:
                res, wall, cpu_t = timed(lambda: replay_policy(trace, SimOptions(capacity_tokens=float(cap), **{key: size})))
                ok = ~res.rejected
                exact.append((wall, cpu_t, int(res.cached_tokens[ok].sum()), model.at(float(cap)).hit_tokens))
            beaten = sum(e[2] > e[3] for e in exact)
            row = {
                "trace": name, "setting": setting, "requests": len(trace), "points": args.points,
                "optimal_wall_s": statistics.median(r[1] for r in runs),
                "optimal_cpu_s": statistics.median(r[2] for r in runs),
                "replay_wall_s": statistics.median(e[0] for e in exact),
                "replay_cpu_s": statistics.median(e[1] for e in exact),
                "replays_above_optimum": beaten,
            }
            row["ratio_wall"] = row["optimal_wall_s"] / row["replay_wall_s"]
            row["ratio_cpu"] = row["optimal_cpu_s"] / row["replay_cpu_s"]
            rows.append(row)
            print(f"{name:13s} {setting:9s} optimal curve ({args.points} capacities) "
                  f"{row['optimal_wall_s']:.3f} s wall / {row['optimal_cpu_s']:.3f} s cpu; one exact replay "
                  f"{row['replay_wall_s']:.3f} / {row['replay_cpu_s']:.3f} s; ratio {row['ratio_wall']:.2f} wall, "
                  f"{row['ratio_cpu']:.2f} cpu; replays above the optimum: {beaten}/{len(exact)}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 1 if any(r["replays_above_optimum"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
