"""Benchmark: kvsim's APC engine against the real vLLM 0.33.0 KVCacheManager on the same work.

Two workloads, each replayed sequentially (one request at a time, prefill + every decode
step + free) through kvsim (``replay_apc``, the compiled engine, fast 64-bit hashes) and
through vLLM's own ``KVCacheManager`` driven as its scheduler drives it
(``tests/oracle/vllm_driver.py``, sha256 block hashes as vLLM defaults to):

- ``mooncake``: the Mooncake FAST'25 conversation trace (12,031 requests, 145M prompt
  tokens once its 512-token hash ids are expanded), block size 16, a capacity that forces
  evictions (default 1M tokens);
- ``chat``: a synthetic multi-turn chat trace (shared system prompts, sessions whose turns
  resend the earlier turns and replies), block size 16, 500K tokens of capacity.

Both sides run pinned to one CPU. Times are the replay loops only (kvsim: hashing +
engine; vLLM: Request construction, which hashes, + manager calls), not trace loading or
interpreter start-up; kvsim's JIT warm-up is measured separately and reported. kvsim's
per-request cached tokens are checked equal to vLLM's.

    .venv/bin/python bench/bench_apc.py                   # both workloads, full size
    .venv/bin/python bench/bench_apc.py --requests 2000   # a prefix of each trace
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "oracle"))

import vllm_client

from kvsim.io.trace.columns import Trace
from common import pin_to_one_cpu, synthetic_chat  # noqa: E402
from kvsim.drive.sequential import replay
from kvsim.engines.options import SimOptions

MOONCAKE = ROOT / "traces" / "public" / "conversation_trace.jsonl"


def time_kvsim(trace: Trace, options: SimOptions, runs: int):
    times, result = [], None
    for _ in range(runs):
        result = replay("apc", trace, options)
        times.append(result.elapsed_s)
    return statistics.median(times), times, result


def time_vllm(trace: Trace, num_blocks: int, runs: int, python: Path, tmp: Path):
    path = vllm_client.write_workload(trace, tmp / "workload.npz")
    job = {"workload": str(path), "block_size": 16, "num_gpu_blocks": num_blocks, "hash_algo": "sha256",
           "count_evictions": False}
    results = vllm_client.run_jobs([dict(job) for _ in range(runs)], python, timeout=7200)
    times = [float(r["elapsed"]) for r in results]
    return statistics.median(times), times, results[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="mooncake,chat")
    ap.add_argument("--requests", type=int, default=None, help="replay only the first N requests")
    ap.add_argument("--mooncake-capacity", type=float, default=1_000_000)
    ap.add_argument("--chat-capacity", type=float, default=500_000)
    ap.add_argument("--chat-sessions", type=int, default=3000)
    ap.add_argument("--runs", type=int, default=5, help="kvsim runs per workload (median)")
    ap.add_argument("--vllm-runs", type=int, default=1, help="vLLM runs per workload (median)")
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--json", type=Path, help="write the measurements here")
    args = ap.parse_args()

    cpu = pin_to_one_cpu()
    warm = Trace.from_prompts([[1, 2, 3] * 20, [1, 2, 3] * 30], output_lengths=[5, 5])
    t0 = time.perf_counter()
    replay("apc", warm, SimOptions(num_gpu_blocks=20))
    warmup = time.perf_counter() - t0
    python = None if args.no_vllm else vllm_client.oracle_python()
    if python is None and not args.no_vllm:
        print(f"vLLM oracle unavailable ({vllm_client.REASON}); timing kvsim only")

    rows = []
    for name in args.workloads.split(","):
        if name == "mooncake":
            import kvsim

            trace = kvsim.load_trace(MOONCAKE, format="mooncake", limit=args.requests)
            options = SimOptions(capacity_tokens=args.mooncake_capacity, block_size=16)
        elif name == "chat":
            trace = synthetic_chat(sessions=args.chat_sessions)
            if args.requests:
                trace = trace.head(args.requests)
            options = SimOptions(capacity_tokens=args.chat_capacity, block_size=16)
        else:
            raise SystemExit(f"unknown workload {name!r}")
        k_med, k_times, result = time_kvsim(trace, options, args.runs)
        row = {"workload": name, "requests": len(trace), "prompt_tokens": trace.num_prompt_tokens,
               "output_tokens": int(np.maximum(trace.output_lengths, 1).sum()),
               "num_gpu_blocks": result.extra["num_gpu_blocks"], "kvsim_s": k_med, "kvsim_runs": k_times,
               "hit_rate": float(result.cached_tokens.sum() / trace.num_prompt_tokens),
               "evicted_blocks": int(result.evictions.sum())}
        if python is not None:
            with tempfile.TemporaryDirectory(prefix="kvsim-bench-") as tmp:
                v_med, v_times, vres = time_vllm(trace, result.extra["num_gpu_blocks"], args.vllm_runs,
                                                 python, Path(tmp))
            row.update(vllm_s=v_med, vllm_runs=v_times,
                       same_results=bool(np.array_equal(vres["cached"], result.cached_tokens)
                                         and np.array_equal(vres["rejected"], result.rejected)))
        rows.append(row)

    print(f"\nAPC sequential replay, block size 16, one CPU (cpu {cpu}); kvsim median of {args.runs}, "
          f"vLLM 0.33.0 median of {args.vllm_runs}; kvsim JIT warm-up (first call) {warmup:.2f} s")
    head = f"{'workload':<9} {'requests':>8} {'prompt tok':>12} {'kvsim s':>8} {'vLLM s':>8} " \
           f"{'kvsim Mtok/s':>12} {'vLLM Mtok/s':>11} {'ratio':>6} {'hit':>6} {'same':>5}"
    print(head)
    print("-" * len(head))
    for r in rows:
        k_rate = r["prompt_tokens"] / r["kvsim_s"] / 1e6
        v = r.get("vllm_s")
        print(f"{r['workload']:<9} {r['requests']:>8,} {r['prompt_tokens']:>12,} {r['kvsim_s']:>8.2f} "
              + (f"{v:>8.1f} {k_rate:>12.1f} {r['prompt_tokens'] / v / 1e6:>11.2f} {v / r['kvsim_s']:>5.0f}x "
                 if v else f"{'-':>8} {k_rate:>12.1f} {'-':>11} {'-':>6} ")
              + f"{r['hit_rate']:>6.1%} {r.get('same_results', '-')!s:>5}")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu, "jit_warmup_s": warmup, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
