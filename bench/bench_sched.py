"""Benchmark: kvsim's step-clock scheduler replays against the real vLLM 0.33.0 and SGLang 0.5.23 schedulers.

The first ``--requests`` (default 2,000) requests of the Mooncake FAST'25 conversation trace
(512-token hash ids expanded to tokens), released on the step clock from their logged
timestamps (``--step-seconds``, default 0.05 s per step), replayed with a server's
realistic settings for Llama-3-8B on an H100-80GB:

- vLLM: the KV blocks ``kvsim capacity`` estimates, ``max_num_batched_tokens`` 8192,
  ``max_num_seqs`` 1024 (vLLM's defaults on that GPU), async scheduling;
- SGLang: the token pool ``kvsim capacity`` estimates, ``chunked_prefill_size`` 8192,
  ``max_running_requests`` derived from the pool, the overlap scheduler, ``fcfs``.

kvsim's side is ``kvsim.sched`` (``replay_steps``); the real side is the engines' own
scheduler code driven by the differential tests' drivers (``tests/oracle/*_sched_driver.py``),
in the oracle interpreter (``$KVSIM_ORACLE_PYTHON`` or ``.oracle-venv``). Both run pinned to
one CPU; times cover the replay loops only (not trace loading, not interpreter start-up).
Each side reports its CPU time (``time.process_time``, which other jobs on a shared machine
do not inflate) and its wall time; the speed-up is the ratio of the CPU-time medians.
kvsim's vLLM model runs with the compiled block pool (``implementation="fast"``, the
default); ``--vllm-implementation reference`` times the readable one.
Per-request cached tokens, first-token and finish steps are checked equal.

    .venv/bin/python bench/bench_sched.py                     # 2,000 requests, both engines
    .venv/bin/python bench/bench_sched.py --requests 500 --engines sglang
    .venv/bin/python bench/bench_sched.py --requests 0 --kvsim-only   # the whole trace, kvsim only
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "oracle"))

import sched_client  # noqa: E402
from common import pin_to_one_cpu  # noqa: E402
from sched_scenarios import sglang_job, vllm_job  # noqa: E402

from kvsim.io.load import load_trace  # noqa: E402
from kvsim.models import apc_num_gpu_blocks, radix_max_total_tokens  # noqa: E402
from kvsim.engines.options import SimOptions  # noqa: E402
from kvsim.drive.requests import output_token_arrays  # noqa: E402
from kvsim.drive.clock import Releases  # noqa: E402
from kvsim.engines.sglang.scheduler import SglangSchedSettings  # noqa: E402
from kvsim.drive.timed import replay_steps  # noqa: E402
from kvsim.engines.vllm.scheduler import VllmSchedSettings  # noqa: E402

MOONCAKE = ROOT / "traces" / "public" / "conversation_trace.jsonl"
MODEL, GPU = "llama-3-8b", "H100-80GB"


def workload(requests: int, step_seconds: float):
    trace = load_trace(str(MOONCAKE))
    if requests:
        trace = trace.head(requests)
    out, off = output_token_arrays(trace)
    prompts = [trace.prompt(i) for i in range(len(trace))]
    outputs = [out[off[i]:off[i + 1]] for i in range(len(trace))]
    return prompts, outputs, Releases.steps_from_seconds(trace.arrival, step_seconds)


def settings(engine: str, prompts, outputs, implementation: str = "fast"):
    options = SimOptions(model=MODEL, gpu=GPU)
    if engine == "vllm":
        return VllmSchedSettings(num_gpu_blocks=apc_num_gpu_blocks(options), max_num_batched_tokens=8192,
                                 max_num_seqs=1024, async_scheduling=True, implementation=implementation)
    longest = max(len(p) + len(o) for p, o in zip(prompts, outputs))
    return SglangSchedSettings(capacity=radix_max_total_tokens(options), chunked_prefill_size=8192,
                               context_len=max(32768, longest + 16))


def time_kvsim(s, prompts, outputs, arrival, runs: int):
    """(median CPU seconds, median wall seconds, the last result)."""
    cpu, wall, result = [], [], None
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        result = replay_steps(s, prompts, outputs, Releases.logged(arrival))
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    return statistics.median(cpu), statistics.median(wall), result


def time_real(engine: str, s, prompts, outputs, arrival, runs: int, python: Path):
    with tempfile.TemporaryDirectory(prefix="kvsim-bench-sched-") as tmp:
        path = sched_client.write_workload(Path(tmp) / "w.npz", prompts, outputs, arrival)
        job = vllm_job(path, s) if engine == "vllm" else sglang_job(path, s)
        results = sched_client.run_jobs(engine, [dict(job) for _ in range(runs)], python, timeout=24 * 3600)
    return (statistics.median(float(r["cpu"]) for r in results),
            statistics.median(float(r["elapsed"]) for r in results), results[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000, help="first N requests of the trace (0: all)")
    ap.add_argument("--step-seconds", type=float, default=0.05, help="seconds of log time per step")
    ap.add_argument("--engines", default="vllm,sglang")
    ap.add_argument("--runs", type=int, default=3, help="kvsim runs (median)")
    ap.add_argument("--real-runs", type=int, default=1, help="real scheduler runs (median)")
    ap.add_argument("--kvsim-only", action="store_true", help="time kvsim alone")
    ap.add_argument("--vllm-implementation", default="fast", choices=("fast", "reference"),
                    help="kvsim's vLLM cache model")
    args = ap.parse_args()
    cpu = pin_to_one_cpu()
    prompts, outputs, arrival = workload(args.requests, args.step_seconds)
    tokens = sum(len(p) for p in prompts)
    print(f"Mooncake conversation: {len(prompts):,} requests, {tokens / 1e6:.1f}M prompt tokens, "
          f"{int(arrival.max()) + 1:,} steps of arrivals at {args.step_seconds} s; pinned to CPU {cpu}")
    for engine in args.engines.split(","):
        s = settings(engine, prompts, outputs, args.vllm_implementation)
        ours_s, ours_wall, ours = time_kvsim(s, prompts, outputs, arrival, args.runs)
        line = (f"{engine}: kvsim {ours_s:.2f} s CPU, {ours_wall:.2f} s wall ({ours.steps:,} steps, "
                f"{int(ours.cached_tokens.sum()):,} cached tokens, {int(ours.preemptions.sum())} preemptions)")
        if not args.kvsim_only:
            python, why = sched_client.oracle_python(engine)
            if python is None:
                print(f"{line}; real scheduler unavailable: {why}")
                continue
            real_s, real_wall, real = time_real(engine, s, prompts, outputs, arrival, args.real_runs, python)
            same = all(np.array_equal(a, real[k]) for a, k in (
                (ours.cached_tokens, "cached"), (ours.first_token_step, "first_token_step"),
                (ours.finish_step, "finish_step"), (ours.preemptions, "preemptions")))
            line += (f"; real {real_s:.2f} s CPU, {real_wall:.2f} s wall; {real_s / ours_s:.1f}x (CPU), "
                     f"{real_wall / ours_wall:.1f}x (wall); per-request results equal: {same}")
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
