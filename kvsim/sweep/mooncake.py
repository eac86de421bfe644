"""Mooncake FAST'25 Fig. 9 (theoretical hit rate vs cache capacity) on the released traces.

Definition used (the paper does not spell one out; this is the natural reading of "LRU
over the trace's blocks"): a cache of C tokens holds C/512 of the trace's 512-token
blocks under LRU; a request hits its leading blocks that are cached (prefix-contiguous,
no recompute cap), token-weighted with the partial last block at its real length; every
request counts (no warm-up); after the lookup all the request's blocks are touched, tail
first, which is the leaf-first LRU of a prefix trie (the Mooncake team's own simulator,
``traces/README.md §4``). The published values were read off the plot (about +-0.02).

    python -m kvsim.sweep.mooncake traces/public/conversation_trace.jsonl traces/public/synthetic_trace.jsonl
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from kvsim.io.trace.columns import Trace
from kvsim.sweep.curves import block_lru_curve

#: Fig. 9 capacities (tokens) and the values read off the plot (traces/README.md §5)
FIG9_CAPACITIES = (1e4, 1e5, 1e6, 1e7, 5e7)
FIG9_PUBLISHED = {
    "conversation": (0.045, 0.07, 0.085, 0.33, 0.40),
    "synthetic": (0.00, 0.01, 0.15, 0.59, 0.66),
}
#: how precisely values can be read off the plot
READ_TOLERANCE = 0.02


def trace_name(path: str | Path) -> str:
    """'conversation' or 'synthetic' from a file name such as conversation_trace.jsonl."""
    stem = Path(path).name.lower()
    for name in FIG9_PUBLISHED:
        if stem.startswith(name):
            return name
    raise ValueError(f"{path}: not one of the Fig. 9 traces ({', '.join(FIG9_PUBLISHED)})")


def fig9_table(trace: Trace, name: str, block_size: int = 512, with_variants: bool = True) -> pd.DataFrame:
    """kvsim's Fig. 9 values next to the published ones, one row per capacity.

    Columns: ``kvsim`` (the definition above), ``diff`` and ``within`` (|diff| <= 0.02); with
    ``with_variants`` also the variants that explain gaps: ``warmup_50`` (first half of the
    requests only warms the cache, as the Mooncake simulator), ``forward`` (plain block LRU,
    a request's blocks touched first to last), ``block_weighted`` (hit blocks / blocks) and
    ``apc_512`` (exact vLLM APC replay with 512-token blocks: no partial-block hits, last
    token recomputed, outputs cached, over-long requests rejected and not counted).
    """
    caps = np.array(FIG9_CAPACITIES)
    main = block_lru_curve(trace, block_size)
    frame = pd.DataFrame({"capacity_tokens": caps.astype(np.int64), "published": FIG9_PUBLISHED[name],
                          "kvsim": main.hit_rate(caps)})
    frame["diff"] = frame["kvsim"] - frame["published"]
    frame["within"] = frame["diff"].abs() <= READ_TOLERANCE + 1e-9
    if with_variants:
        frame["warmup_50"] = block_lru_curve(trace, block_size, warmup=0.5).hit_rate(caps)
        frame["forward"] = block_lru_curve(trace, block_size, order="forward").hit_rate(caps)
        frame["block_weighted"] = _block_weighted(trace, block_size, caps)
        frame["apc_512"] = [_apc_exact(trace, block_size, c) for c in caps]
    frame.attrs["unlimited"] = float(main.hit_rate([math.inf])[0])
    return frame


def _apc_exact(trace: Trace, block_size: int, capacity: float) -> float:
    """Token hit rate of the exact APC replay (admitted requests), as ``kvsim sweep -p apc`` shows it."""
    from kvsim.drive.sequential import replay
    from kvsim.drive.metrics import summarize
    from kvsim.engines.options import SimOptions

    result = replay("apc", trace, SimOptions(capacity_tokens=capacity, block_size=block_size))
    return float(summarize(result, trace)["token_hit_rate"])


def _block_weighted(trace: Trace, block_size: int, caps: np.ndarray) -> np.ndarray:
    """Hit blocks / blocks: the same stack with every block weighing 1."""
    import time

    from kvsim.sweep.chains import prompt_block_keys
    from kvsim.sweep.curves import _finish

    keys, key_off, _ = prompt_block_keys(trace.require_tokens(), trace.offsets, block_size)
    nb = np.diff(key_off)
    zeros = np.zeros(len(trace), np.int64)
    inputs = {"keys": keys, "key_off": key_off, "cap": nb, "phi": zeros, "foot": zeros, "unit_w": 1,
              "last_w": np.ones(len(trace), np.int64)}
    model = _finish("block-lru", {}, block_size, inputs, nb, np.ones(len(trace), bool), "exact",
                    time.perf_counter())
    return model.hit_rate(caps)


def markdown(tables: dict[str, pd.DataFrame]) -> str:
    """The comparison as a Markdown table (one row per trace and capacity)."""
    variants = [c for c in ("warmup_50", "forward", "block_weighted", "apc_512")
                if any(c in t.columns for t in tables.values())]
    head = ["trace", "tokens", "published", "kvsim", "diff", "within ±0.02", *variants]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, t in tables.items():
        for row in t.to_dict(orient="records"):
            cells = [name, f"{row['capacity_tokens']:.0e}".replace("e+0", "e"), f"{row['published']:.3f}",
                     f"{row['kvsim']:.3f}", f"{row['diff']:+.3f}", "yes" if row["within"] else "no"]
            cells += [f"{row[v]:.3f}" for v in variants]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append(f"| {name} | unlimited | | {t.attrs['unlimited']:.3f} | | |" + " |" * len(variants))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvsim.sweep.mooncake", description=__doc__.split("\n\n")[0])
    parser.add_argument("traces", nargs="+", help="conversation_trace.jsonl and/or synthetic_trace.jsonl")
    parser.add_argument("--no-variants", action="store_true", help="only the main definition")
    args = parser.parse_args(argv)
    import kvsim

    tables = {}
    for path in args.traces:
        name = trace_name(path)
        tables[name] = fig9_table(kvsim.load_trace(path, format="mooncake"), name,
                                  with_variants=not args.no_variants)
    print(markdown(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
