"""Benchmark: ``kvsim analyze`` end to end (read the log + every statistic), prompt tokens/s.

Two inputs, each run ``--repeat`` times in one process on one core; medians reported:

- ``mooncake``: the Mooncake FAST'25 conversation trace, hash-id input (12,031 requests,
  145M prompt tokens once its 512-token ids are expanded);
- ``tokens``: a pre-tokenized log (``kvsim generate mixture --format tokens``: shared system
  prompts, multi-turn chats with logged replies, RAG, tenants with salts, LoRA adapters),
  written once to a temporary folder (or ``--tokens-log PATH``).

"End to end" = ``kvsim.load_trace`` + ``kvsim.analyze.analyze`` (all sections, including
the extra passes for prompts-only, moved volatile content and isolation), without
interpreter start-up and after one warm-up run that loads the compiled kernels. The
stages are timed too: reading, the main prefix index (one pass), and the rest.

    .venv/bin/python bench/bench_analyze.py
    .venv/bin/python bench/bench_analyze.py --repeat 5 --requests 20000 --json out/bench_analyze.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from common import pin_to_one_cpu  # noqa: E402


def _pinned() -> str:
    cpu = pin_to_one_cpu()
    return "not pinned" if cpu is None else f"pinned to CPU {cpu}"


ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "traces" / "public" / "conversation_trace.jsonl"


def generate_tokens_log(path: Path, requests: int) -> None:
    from kvsim.cli import run

    code = run(["generate", "mixture", "--format", "tokens", "--requests", str(requests), "-o", str(path), "--force"])
    if code != 0:
        raise SystemExit(f"kvsim generate failed with exit code {code}")


def once(path: Path, fmt: str) -> dict[str, float]:
    import kvsim
    from kvsim.analyze import analyze
    from kvsim.analyze.reuse import build_prefix_index, namespace_roots, output_extensions

    t0 = time.perf_counter()
    trace = kvsim.load_trace(path, format=fmt)
    t1 = time.perf_counter()
    analyze(trace)
    t2 = time.perf_counter()
    build_prefix_index(trace.tokens, trace.offsets, namespace_roots(trace), *output_extensions(trace))
    t3 = time.perf_counter()
    return {"prompt_tokens": trace.num_prompt_tokens, "requests": len(trace), "read_s": t1 - t0,
            "analyze_s": t2 - t1, "end_to_end_s": t2 - t0, "index_pass_s": t3 - t2}


def bench(name: str, path: Path, fmt: str, repeat: int) -> dict[str, object]:
    once(path, fmt)  # warm-up: loads the compiled kernels, fills the OS page cache
    runs = [once(path, fmt) for _ in range(repeat)]
    med = {k: statistics.median(r[k] for r in runs) for k in ("read_s", "analyze_s", "end_to_end_s", "index_pass_s")}
    n = runs[0]["prompt_tokens"]
    return {
        "input": name, "path": str(path), "requests": runs[0]["requests"], "prompt_tokens": n, "repeat": repeat,
        **{f"median_{k}": v for k, v in med.items()},
        "end_to_end_tokens_per_s": n / med["end_to_end_s"],
        "analyze_tokens_per_s": n / med["analyze_s"],
        "index_pass_tokens_per_s": n / med["index_pass_s"],
        "runs": runs,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--requests", type=int, default=5000, help="requests in the generated pre-tokenized log")
    ap.add_argument("--tokens-log", type=Path, help="use this pre-tokenized JSONL instead of generating one")
    ap.add_argument("--only", choices=("mooncake", "tokens"))
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    pinned = _pinned()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "mooncake"):
            results.append(bench("mooncake", MOONCAKE, "mooncake", args.repeat))
        if args.only in (None, "tokens"):
            path = args.tokens_log
            if path is None:
                path = Path(tmp) / "mixture.tokens.jsonl"
                generate_tokens_log(path, args.requests)
            results.append(bench("tokens", path, "tokens", args.repeat))
    print(f"kvsim analyze benchmark ({pinned}, median of {args.repeat} runs after a warm-up)")
    print(f"{'input':10} {'requests':>9} {'prompt tok':>12} {'read s':>8} {'analyze s':>10} {'e2e s':>8} "
          f"{'e2e Mtok/s':>11} {'analyze Mtok/s':>15} {'1 pass Mtok/s':>14}")
    for r in results:
        print(f"{r['input']:10} {r['requests']:>9,} {r['prompt_tokens']:>12,} {r['median_read_s']:>8.2f} "
              f"{r['median_analyze_s']:>10.2f} {r['median_end_to_end_s']:>8.2f} "
              f"{r['end_to_end_tokens_per_s'] / 1e6:>11.2f} {r['analyze_tokens_per_s'] / 1e6:>15.2f} "
              f"{r['index_pass_tokens_per_s'] / 1e6:>14.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"pinned": pinned, "results": results}, indent=2) + "\n")
        print(f"results written to {args.json}")


if __name__ == "__main__":
    sys.exit(main())
