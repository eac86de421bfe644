"""How far the radix one-pass curve is from SGLang's tree, and how dense exact replays must be.

For every trace given, at page sizes 1 and 16, over capacities where no request is
rejected (from the smallest capacity that admits every request to past saturation):

- ``one-pass``: the largest |one-pass curve - exact replay| (``kvsim.sweep.curve_model``,
  radix LRU) at ``--points`` log-spaced capacities;
- ``joined``: the report draws exact replays joined by straight lines (in log capacity)
  instead: ``--dense`` log-spaced ones, then more wherever neighbours differ by more than
  ``--step`` (``kvsim.sweep.dense``, as the report does); the largest |line - exact replay|
  at the midpoints between them.

    python scripts/radix_curve_error.py traces/*.jsonl traces/public/conversation_trace.jsonl
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def admits_all(trace, page: int) -> float:
    """The smallest capacity (tokens) at which SGLang's admission rule rejects no request."""
    from kvsim.engines.sglang.rules import CLIP_MAX_NEW_TOKENS

    L = trace.prompt_lengths
    M = np.maximum(trace.output_lengths, 1)
    ceil_l = -(-L // page) * page
    # L + min(max_new, 4096) + p < T with max_new = min(M, T - ceil_p(L) - p - 1): M itself fits
    need = np.maximum(L + np.minimum(M, CLIP_MAX_NEW_TOKENS) + page + 1, ceil_l + page + 1 + M)
    return float(-(-int(need.max()) // page) * page)


def measure(path: str, page: int, points: int, dense: int, step: float,
            max_points: int) -> tuple[float, float, float, float, int]:
    from kvsim.io.load import load_trace
    from kvsim.drive.metrics import summarize
    from kvsim.engines.options import SimOptions
    from kvsim.drive.sequential import replay
    from kvsim.sweep.curves import curve_model
    from kvsim.sweep.dense import dense_capacities

    trace = load_trace(path)
    lo = admits_all(trace, page)
    hi = float(trace.prompt_lengths.sum() + np.maximum(trace.output_lengths, 1).sum()) * 1.2

    def exact(c: float) -> float:
        s = summarize(replay("radix", trace, SimOptions(capacity_tokens=float(c), page_size=page)), trace)
        assert s["rejected"] == 0, (path, page, c)
        return s["token_hit_rate"]

    model = curve_model(trace, "radix", page_size=page)
    caps = np.unique(np.geomspace(lo, hi, points).round())
    one_pass = max(abs(exact(c) - float(model.hit_rate([c])[0])) for c in caps)
    grid, at = dense_capacities(lambda batch: [exact(c) for c in batch], lo, hi, start=dense, step=step,
                                max_points=max_points)
    mids = np.sqrt(grid[:-1] * grid[1:]).round()
    line = (at[:-1] + at[1:]) / 2          # straight in log capacity: the midpoint's value
    joined = max(abs(exact(c) - v) for c, v in zip(mids, line))
    return lo, hi, one_pass, joined, len(grid)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--points", type=int, default=16, help="capacities where the one-pass curve is checked")
    ap.add_argument("--dense", type=int, default=16, help="log-spaced exact replays to start the joined line")
    ap.add_argument("--step", type=float, default=0.01, help="refine where neighbours differ by more than this")
    ap.add_argument("--max-points", type=int, default=96, help="exact replays of the joined line at most")
    args = ap.parse_args(argv)
    print("| trace | page | capacities [tokens] | one-pass max error [points] | joined replays | "
          "joined, max error at midpoints [points] |")
    print("|---|---:|---|---:|---:|---:|")
    for path in args.traces:
        for page in (1, 16):
            lo, hi, one, joined, n = measure(path, page, args.points, args.dense, args.step, args.max_points)
            print(f"| {Path(path).name} | {page} | {lo:,.0f} – {hi:,.0f} | {100 * one:.2f} | {n} | "
                  f"{100 * joined:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
