"""Benchmark: kvsim's timed fleet replay beside Dynamo 1.6.1's own offline fleet replay.

The peer a user would reach for to ask fleet what-ifs is Dynamo's ``run_mocker_trace_replay``
(Rust: its real KV router in front of mock vLLM engines, in simulated time). Both replay the
first ``--requests`` requests of the Mooncake conversation trace (512-token hash ids) on
``--workers`` replicas of 20,000 blocks of 16 tokens, once behind round robin and once behind
Dynamo's KV router (kvsim: ``--router dynamo``):

- Dynamo: ``run_mocker_trace_replay(..., extra_engine_args={"engine": {"block_size": 16,
  "num_gpu_blocks": 20000}}, num_workers=N, router_mode=round_robin|kv_router)`` in the
  oracle venv (``make oracle``), its mocker's own step timing;
- kvsim: ``kvsim simulate TRACE --format mooncake --replay timed --model llama-3-8b --gpu
  H100-80GB --num-gpu-blocks 20000 --replicas N --router round_robin|dynamo`` (the vLLM 0.33.0
  scheduler model, steps costed by the roofline), and once more as a single replica (the row
  ``single``) beside Dynamo's fleet behind its KV router.

kvsim's timed replay also replays the same load without prefix caching (the time the cache
saves), so each of its commands is two replays against Dynamo's one.

Printed per router: the prefix-cache hit rate each reports (Dynamo's
``prefix_cache_reused_ratio``, kvsim's token hit rate), TTFT p50 / p90, and the wall time of
each whole process (start-up included), median of ``--runs``, with the ratio kvsim / Dynamo.
The two time models differ (mocker vs roofline), so the latencies are compared in kind only.

    .venv/bin/python bench/bench_dynamo_replay.py [--requests 1000] [--workers 4] [--runs 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
ORACLE = Path(os.environ.get("KVSIM_ORACLE_PYTHON") or ROOT / ".oracle-venv" / "bin" / "python")
ROUTERS = {"round_robin": "round_robin", "kv_router": "dynamo"}    # Dynamo's name -> kvsim's

DYNAMO = """
import json, sys
from dynamo._core import run_mocker_trace_replay
trace, workers, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
r = run_mocker_trace_replay([trace], extra_engine_args={"engine": {"block_size": 16, "num_gpu_blocks": 20000}},
                            num_workers=workers, router_mode=mode, trace_block_size=512)
s = r.summary
print(json.dumps({"hit": s["prefix_cache_reused_ratio"], "p50": s["median_ttft_ms"] / 1e3,
                  "p90": s["p90_ttft_ms"] / 1e3}))
"""


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvsim-dyn-") as tmp:
        trace = Path(tmp) / "trace.jsonl"
        with open(TRACE) as src, open(trace, "w") as dst:
            for _, line in zip(range(args.requests), src):
                dst.write(line)
        env = {**os.environ, "RUST_LOG": "error"}
        print(f"first {args.requests} Mooncake conversation requests, {args.workers} replicas of 20,000 x 16-token "
              f"blocks; wall time of each whole process, median of {args.runs}")
        print(f"{'router':<12} {'Dynamo hit':>10} {'kvsim hit':>9} {'Dynamo p50/p90 s':>17} {'kvsim p50/p90 s':>16} "
              f"{'Dynamo s':>8} {'kvsim s':>8} {'ratio':>6}")
        # (Dynamo's router mode, kvsim's router, kvsim's replicas): the last row is one kvsim
        # replica (no fleet) beside Dynamo's fleet, the first comparison
        rows = [(mode, router, args.workers) for mode, router in ROUTERS.items()] + [("kv_router", "single", 1)]
        for dyn_mode, router, replicas in rows:
            d_times, k_times = [], []
            fleet = ["--replicas", str(replicas), "--router", router] if replicas > 1 else []
            for _ in range(args.runs):
                dt, out = timed([str(ORACLE), "-c", DYNAMO, str(trace), str(args.workers), dyn_mode], env)
                d_times.append(dt)
                dyn = json.loads(out.strip().splitlines()[-1])
                js = Path(tmp) / "kvsim.json"
                kt, _ = timed([str(Path(sys.executable).with_name("kvsim")), "simulate", str(trace), "--format", "mooncake",
                               "--replay", "timed", "--model", "llama-3-8b", "--gpu", "H100-80GB",
                               "--num-gpu-blocks", "20000", *fleet, "--json", str(js)], env)
                k_times.append(kt)
                s = json.loads(js.read_text())["policies"]["apc"]["summary"]
            d, k = statistics.median(d_times), statistics.median(k_times)
            print(f"{router:<12} {dyn['hit']:>10.2%} {s['token_hit_rate']:>9.2%} "
                  f"{dyn['p50']:>8.3f}/{dyn['p90']:<8.3f} {s['ttft_p50_s']:>7.3f}/{s['ttft_p90_s']:<8.3f} "
                  f"{d:>8.2f} {k:>8.2f} {k / d:>5.1f}x")


if __name__ == "__main__":
    main()
