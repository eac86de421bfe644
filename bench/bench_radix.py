"""Benchmark: kvsim's radix engine against the real SGLang 0.5.23 radix cache on the same work.

Two workloads, each replayed sequentially (one request at a time: match, admission,
prefill allocation, every decode step, the inserts, the release) through kvsim
(``replay_radix``, the fast engine) and through SGLang's own cache driven as its
scheduler drives it (``tests/oracle/sglang_driver.py``: the real ``Req``,
``SchedulePolicy``, ``PrefillAdder``, allocator, request pool and tree):

- ``mooncake``: the Mooncake FAST'25 conversation trace (512-token hash ids expanded to
  tokens), page size 1, a capacity that forces evictions (default 1M tokens);
- ``chat``: a synthetic multi-turn chat trace (8 shared system prompts, sessions whose
  turns resend the earlier turns and replies), page size 1, 500K tokens of capacity.

The SGLang side is the tree a default server builds, ``UnifiedRadixCache`` with its Rust
core (``--sglang-trees unified,radix`` adds the classic ``RadixCache``). Both sides run
pinned to one CPU. Times cover the replay loops only (not trace loading, not interpreter
start-up). kvsim's per-request cached tokens are checked equal to SGLang's.

    .venv/bin/python bench/bench_radix.py                    # 2,000 Mooncake requests + chat
    .venv/bin/python bench/bench_radix.py --requests 500     # a prefix of each trace
    .venv/bin/python bench/bench_radix.py --requests 0       # the whole traces (slow on SGLang's side)
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvsim.io.trace.columns import Trace  # noqa: E402
from common import pin_to_one_cpu, synthetic_chat  # noqa: E402
from kvsim.engines.options import SimOptions  # noqa: E402
from kvsim.drive.sequential import replay  # noqa: E402
from kvsim.drive.requests import output_token_arrays  # noqa: E402

MOONCAKE = ROOT / "traces" / "public" / "conversation_trace.jsonl"
DRIVER = ROOT / "tests" / "oracle" / "sglang_driver.py"


def write_workload(trace: Trace, path: Path, configs: list[dict]) -> None:
    """The trace in the driver's format (prompt and output ids, no namespaces)."""
    out, out_off = output_token_arrays(trace)
    n = len(trace)
    tokens = trace.tokens
    np.savez(path, prompt_tok=tokens if tokens.dtype == np.int32 else tokens.astype(np.int64),
             prompt_off=trace.offsets, out_tok=out, out_off=out_off,
             lora=np.full(n, -1), salt=np.full(n, -1), names=json.dumps([]), configs=json.dumps(configs))


def time_kvsim(trace: Trace, options: SimOptions, runs: int):
    times, result = [], None
    for _ in range(runs):
        result = replay("radix", trace, options)
        times.append(result.elapsed_s)
    return statistics.median(times), result


def time_sglang(trace: Trace, capacity: int, trees: list[str], runs: int, python: str, tmp: Path):
    configs = [dict(tree=t, page_size=1, eviction_policy="lru", capacity=capacity, max_context_len=int(
        trace.prompt_lengths.max() + trace.output_lengths.max() + 8), overlap=True, chunked_prefill_size=4096,
        finish="length", max_new_tokens=None, eviction_policy_config=None) for t in trees for _ in range(runs)]
    npz = tmp / "bench_radix.npz"
    write_workload(trace, npz, configs)
    out = tmp / "bench_radix.json"
    subprocess.run([python, str(DRIVER), str(npz), "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    results = json.loads(out.read_text())["0"]
    per_tree = {}
    for t in trees:
        rs = [r for r in results if r["config"]["tree"] == t]
        per_tree[t] = (statistics.median(r["elapsed_s"] for r in rs), np.array(rs[0]["cached"]))
    return per_tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="mooncake,chat")
    ap.add_argument("--requests", type=int, default=2000,
                    help="replay only the first N requests of each trace (0: all)")
    ap.add_argument("--mooncake-capacity", type=int, default=1_000_000)
    ap.add_argument("--chat-capacity", type=int, default=500_000)
    ap.add_argument("--chat-sessions", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5, help="kvsim runs per workload (median)")
    ap.add_argument("--sglang-runs", type=int, default=1, help="SGLang runs per workload (median)")
    ap.add_argument("--sglang-trees", default="unified", help="unified (the default server's), radix")
    ap.add_argument("--no-sglang", action="store_true")
    ap.add_argument("--json", type=Path, help="write the measurements here")
    args = ap.parse_args()

    cpu = pin_to_one_cpu()
    python = os.environ.get("KVSIM_ORACLE_PYTHON") or str(ROOT / ".oracle-venv" / "bin" / "python")
    trees = args.sglang_trees.split(",")
    rows = []
    with tempfile.TemporaryDirectory() as tmpdir:
        for name in args.workloads.split(","):
            if name == "mooncake":
                import kvsim

                trace = kvsim.load_trace(MOONCAKE, format="mooncake")
                capacity = args.mooncake_capacity
            elif name == "chat":
                trace = synthetic_chat(0, args.chat_sessions)
                capacity = args.chat_capacity
            else:
                raise SystemExit(f"unknown workload {name!r}")
            if args.requests:
                trace = trace.head(min(args.requests, len(trace)))
            tokens = trace.num_prompt_tokens
            t_k, res = time_kvsim(trace, SimOptions(capacity_tokens=capacity), args.runs)
            row = {"workload": name, "requests": len(trace), "prompt_tokens": tokens, "capacity": capacity,
                   "kvsim_s": t_k, "kvsim_mtok_s": tokens / t_k / 1e6,
                   "hit_rate": float(res.cached_tokens.sum() / tokens),
                   "evicted_tokens": int(res.evicted_tokens.sum())}
            if not args.no_sglang:
                t0 = time.perf_counter()
                per_tree = time_sglang(trace, capacity, trees, args.sglang_runs, python, Path(tmpdir))
                row["sglang_wall_s"] = time.perf_counter() - t0
                for t, (secs, cached) in per_tree.items():
                    row[f"sglang_{t}_s"] = secs
                    row[f"sglang_{t}_mtok_s"] = tokens / secs / 1e6
                    row[f"ratio_{t}"] = secs / t_k
                    row[f"match_{t}"] = bool(np.array_equal(cached, res.cached_tokens))
            rows.append(row)
    print(f"one CPU (cpu {cpu}); kvsim median of {args.runs}, SGLang median of {args.sglang_runs}")
    head = ["workload", "requests", "prompt tokens", "kvsim s", "SGLang s", "kvsim Mtok/s", "SGLang Mtok/s",
            "ratio", "same hits"]
    print(" | ".join(head))
    for r in rows:
        for t in (trees if not args.no_sglang else [None]):
            sg = (f"{r[f'sglang_{t}_s']:.2f}", f"{r[f'sglang_{t}_mtok_s']:.2f}", f"{r[f'ratio_{t}']:.1f}x",
                  "yes" if r[f"match_{t}"] else "NO") if t else ("-", "-", "-", "-")
            label = r["workload"] if t in (None, "unified") else f"{r['workload']} ({t})"
            print(" | ".join([label, f"{r['requests']:,}", f"{r['prompt_tokens']:,}", f"{r['kvsim_s']:.3f}",
                              sg[0], f"{r['kvsim_mtok_s']:.1f}", sg[1], sg[2], sg[3]]))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
