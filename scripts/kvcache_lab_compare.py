"""kvsim's block LRU and offline optimum beside kvcache-lab's published curves.

kvcache-lab (the Mooncake team's KV-cache hit-rate simulator) publishes FIFO, LRU and
"optimal" curves for the whole kv-cache-tester corpus (739 Claude Code sessions). This
script replays a sample of those sessions with kvcache-lab's semantics -- every session's
requests (sub-agents included) merged by their time since the session start, sessions
with ids local to their file, 64-token blocks (``floor(in/64)`` ids: the tail is not a
block and not counted), token-weighted prefix hits, the first 50% of requests as warm-up,
a capacity reported only if the cache filled during the warm-up -- and draws:

- left: the published curves (739 sessions) and kvsim's on the sample, against the
  capacity *per session* (the sessions run side by side, so the working set grows with
  their number);
- right: on the sample, kvcache-lab's own three policies (ported in
  ``kvsim.sweep.kvcache_lab``) beside kvsim's one-pass block LRU and exact optimum.

Inputs: the session files (``trace_NNNN.json`` of github.com/callanjfox/kv-cache-tester)
and the flattened published curves (``capacityResults`` of
``data/kv_cache_lab/precomputed.json`` in github.com/kvcache-ai/kvcache-blog, one CSV row
per capacity with ``capacity_blocks,fifo_hit_rate,lru_hit_rate,optimal_hit_rate``).

    python scripts/kvcache_lab_compare.py KV_CACHE_TESTER/traces/trace_00{01,02,03,04,06,07,08,09,10,11}.json \\
        --reference kvcache-lab_kv_cache_tester_claude_code.csv --png docs/images/kvcache_lab_comparison.png

``--native-sim PATH`` also runs kvcache-lab's compiled native simulator
(``scripts/kv-cache-lab-native-sim.cc``, ``g++ -O2 -std=c++17``) on the same block events
and checks that the port gives the same counts at every capacity.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np

WARMUP = 0.5
BLOCK = 64


def lab_trace(paths: list[Path]):
    """The sessions as kvcache-lab merges them: sub-agents in, empty requests out, stable
    order by time since each session's start, prompts cut to whole blocks."""
    from kvsim.io.load import load_trace

    trace = load_trace([str(p) for p in sorted(paths)], reader_options={"subagents": True})
    keep = np.flatnonzero(trace.prompt_lengths >= BLOCK)
    order = keep[np.argsort(trace.arrival[keep], kind="stable")]
    trace = trace.select(order)
    # the tail past the last whole block is no block in kvcache-lab: drop its tokens
    L = trace.prompt_lengths // BLOCK * BLOCK
    offsets = np.zeros(len(L) + 1, np.int64)
    offsets[1:] = np.cumsum(L)
    row = np.repeat(np.arange(len(L)), L)
    src = trace.offsets[:-1][row] + (np.arange(int(offsets[-1])) - offsets[:-1][row])
    return replace(trace, offsets=offsets, tokens=trace.tokens[src])


def read_reference(path: Path) -> dict[str, np.ndarray]:
    import pandas as pd

    frame = pd.read_csv(path)
    return {c: frame[c].to_numpy() for c in ("capacity_blocks", "fifo_hit_rate", "lru_hit_rate", "optimal_hit_rate")}


def sample_curves(trace, capacities: np.ndarray) -> dict[str, np.ndarray]:
    """Every curve on the sample at ``capacities`` (blocks); NaN where the cache never filled."""
    from kvsim.sweep.curves import block_lru_curve
    from kvsim.sweep.kvcache_lab import block_events, simulate
    from kvsim.sweep.optimal import block_optimal

    events = block_events(trace, BLOCK, tail="drop")
    warm = int(len(trace) * WARMUP)
    nxt = events.next_use()
    lab = {p: [simulate(events, p, int(c), warm, nxt) for c in capacities] for p in ("fifo", "lru", "belady")}
    filled = np.array([r.filled for r in lab["lru"]])
    lru = block_lru_curve(trace, BLOCK, warmup=WARMUP).hit_rate_at_units(capacities)
    opt = block_optimal(trace, BLOCK, warmup=WARMUP, tail="drop")
    out = {f"lab_{p}": np.array([r.hit_rate if r.filled else np.nan for r in res]) for p, res in lab.items()}
    out["kvsim_lru"] = np.where(filled, lru, np.nan)
    out["kvsim_optimal"] = np.where(filled, opt.hit_rate(capacities * BLOCK), np.nan)
    out["ceiling"] = opt.at(None).hit_rate
    return out


def check_native(trace, sim: Path, capacities: np.ndarray) -> int:
    """Run kvcache-lab's native simulator on the same events; returns the mismatches."""
    from kvsim.sweep.kvcache_lab import block_events, simulate

    ev = block_events(trace, BLOCK, tail="drop")
    warm = int(len(trace) * WARMUP)
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        files = {k: Path(tmp) / f"{k}.bin" for k in ("ids", "tokens", "ends", "next")}
        ev.node.astype(np.uint32).tofile(files["ids"])
        ev.tokens.astype(np.uint16).tofile(files["tokens"])
        ev.request_end.astype(np.uint32).tofile(files["ends"])
        base = [str(sim), "--ids", str(files["ids"]), "--tokens", str(files["tokens"]),
                "--total-blocks", str(len(ev.node)), "--next", str(files["next"])]
        subprocess.run(base[:1] + ["--policy", "build-next"] + base[1:], check=True, capture_output=True)
        for cap in capacities:
            out = json.loads(subprocess.run(
                base + ["--policy", "all", "--request-ends", str(files["ends"]), "--request-count",
                        str(ev.num_requests), "--warmup-requests", str(warm), "--capacity", str(int(cap))],
                check=True, capture_output=True, text=True).stdout)
            for mine, theirs in (("fifo", "fifo"), ("lru", "lru"), ("belady", "optimal")):
                got = simulate(ev, mine, int(cap), warm)
                ref = out[theirs]
                same = (not got.filled) if ref["measurementStartRequest"] == -2 else (
                    got.filled and (got.hit_tokens, got.measured_tokens) == (ref["hitTokens"], ref["totalTokens"]))
                bad += not same
    return bad


def draw(reference: dict, sessions_ref: int, sample: dict, capacities: np.ndarray, sessions: int, png: Path) -> None:
    from matplotlib.figure import Figure
    from matplotlib.ticker import PercentFormatter

    fig = Figure(figsize=(12.5, 4.8), dpi=110)
    fig.set_layout_engine("constrained")
    left, right = fig.subplots(1, 2)
    colors = {"fifo": "#8c564b", "lru": "#2563a8", "optimal": "#111111"}
    per_ref = reference["capacity_blocks"] / sessions_ref
    for p, ls in (("fifo", ":"), ("lru", "--"), ("optimal", "-")):
        left.plot(per_ref, reference[f"{p}_hit_rate"] * 100, color="#9ca3af", ls=ls, lw=2.2,
                  label=f"kvcache-lab {p if p == 'optimal' else p.upper()}, published ({sessions_ref} sessions)")
    per = capacities / sessions
    left.plot(per, sample["lab_fifo"] * 100, color=colors["fifo"], ls=":", lw=1.6, label="kvsim: FIFO (as kvcache-lab)")
    left.plot(per, sample["kvsim_lru"] * 100, color=colors["lru"], ls="--", lw=1.6, label="kvsim: block LRU")
    left.plot(per, sample["kvsim_optimal"] * 100, color=colors["optimal"], lw=1.6, label="kvsim: exact optimum")
    left.set_title(f"Published (all {sessions_ref} sessions) vs kvsim ({sessions}-session sample)", loc="left",
                   fontsize=10)
    left.set_xlabel("cache capacity per session [64-token blocks, log scale]")
    right.plot(capacities, sample["lab_belady"] * 100, color="#d9661f", lw=2.4, label="kvcache-lab trie Belady (port)")
    right.plot(capacities, sample["kvsim_optimal"] * 100, color=colors["optimal"], lw=1.2,
               label="kvsim: exact optimum")
    right.plot(capacities, sample["lab_lru"] * 100, color="#93c5fd", lw=2.4, label="kvcache-lab trie LRU (port)")
    right.plot(capacities, sample["kvsim_lru"] * 100, color=colors["lru"], ls="--", lw=1.2,
               label="kvsim: one-pass block LRU")
    right.plot(capacities, sample["lab_fifo"] * 100, color=colors["fifo"], ls=":", lw=1.4,
               label="kvcache-lab FIFO (port)")
    right.set_title(f"The same {sessions}-session sample, both simulators' policies", loc="left", fontsize=10)
    right.set_xlabel("cache capacity [64-token blocks, log scale]")
    for ax in (left, right):
        ax.axhline(sample["ceiling"] * 100, color="#6b7280", lw=0.8, ls="-.", label="sample: unlimited cache")
        ax.set_xscale("log")
        ax.set_ylim(0, 100)
        ax.yaxis.set_major_formatter(PercentFormatter())
        ax.set_ylabel("token hit rate, warm-up 50% [%]")
        ax.grid(True, alpha=0.3, lw=0.6)
        ax.legend(fontsize=7.5, loc="upper left", framealpha=0.9)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, format="png", metadata={"Software": None})


def mooncake_table(path: Path, capacities: list[int]) -> None:
    """kvcache-lab's policies and the optimum on a Mooncake hash-id trace (512-token blocks,
    the partial last block weighted by its length, warm-up 50%)."""
    from kvsim.io.load import load_trace
    from kvsim.sweep.kvcache_lab import block_events, simulate
    from kvsim.sweep.optimal import block_optimal

    trace = load_trace(str(path))
    events = block_events(trace, 512, tail="weighted")
    warm = int(len(trace) * WARMUP)
    nxt = events.next_use()
    opt = block_optimal(trace, 512, warmup=WARMUP, tail="weighted")
    print(f"{path.name}: {len(trace):,} requests, warm-up {warm:,}")
    print("| capacity [blocks] | FIFO | LRU | Belady (lab) | optimum, reached | optimum, bound |")
    print("|---:|---:|---:|---:|---:|---:|")
    for cap in capacities:
        res = [simulate(events, p, cap, warm, nxt) for p in ("fifo", "lru", "belady")]
        best = opt.at(cap * 512)
        cells = " | ".join(f"{r.hit_rate:.2%}" if r.filled else "—" for r in res)
        print(f"| {cap:,} | {cells} | {best.hit_rate:.2%} | {best.upper_rate:.2%} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sessions", nargs="*", type=Path, help="kv-cache-tester trace_NNNN.json files")
    ap.add_argument("--mooncake", nargs="+", type=Path, default=[],
                    help="also print the policies on these Mooncake hash-id traces (no figure)")
    ap.add_argument("--reference", type=Path, help="kvcache-lab's published curves (CSV)")
    ap.add_argument("--reference-sessions", type=int, default=739, help="sessions behind the published curves")
    ap.add_argument("--png", type=Path, default=Path("docs/images/kvcache_lab_comparison.png"))
    ap.add_argument("--points", type=int, default=40)
    ap.add_argument("--native-sim", type=Path, help="kvcache-lab's compiled native simulator, to cross-check")
    args = ap.parse_args(argv)

    for path in args.mooncake:
        mooncake_table(path, [1, 10, 100, 1000, 3000, 10000, 30000, 100000])
    if not args.sessions:
        return 0
    if args.reference is None:
        ap.error("--reference is needed with session files")
    trace = lab_trace(args.sessions)
    reference = read_reference(args.reference)
    from kvsim.sweep.kvcache_lab import block_events

    events = block_events(trace, BLOCK, tail="drop")
    warm = int(len(trace) * WARMUP)
    top = max(events.unique_in(len(trace)), 2)
    capacities = np.unique(np.geomspace(1, top, args.points).round().astype(np.int64))
    sample = sample_curves(trace, capacities)
    sessions = len(args.sessions)
    print(f"sample: {sessions} sessions, {len(trace):,} requests (sub-agents included), {warm:,} warm-up, "
          f"{len(events.node):,} blocks ({events.unique_in(len(trace)):,} distinct, "
          f"{events.unique_in(warm):,} in the warm-up); unlimited-cache hit rate {sample['ceiling']:.4f}")
    print("| capacity [blocks] | per session | FIFO | LRU (lab) | LRU (kvsim) | Belady (lab) | optimum (kvsim) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for i in np.linspace(0, len(capacities) - 1, 12).round().astype(int):
        vals = [sample[k][i] for k in ("lab_fifo", "lab_lru", "kvsim_lru", "lab_belady", "kvsim_optimal")]
        if np.isnan(vals).all():
            continue
        cells = " | ".join("—" if np.isnan(v) else f"{v:.2%}" for v in vals)
        print(f"| {capacities[i]:,} | {capacities[i] / sessions:,.1f} | {cells} |")
    gap = sample["kvsim_optimal"] - sample["lab_belady"]
    print(f"exact optimum - lab Belady: max {np.nanmax(gap):.2%}, median {np.nanmedian(gap):.2%} (points where filled)")
    lru_gap = np.abs(sample["kvsim_lru"] - sample["lab_lru"])
    print(f"|kvsim LRU - lab LRU|: max {np.nanmax(lru_gap):.2%}")
    draw(reference, args.reference_sessions, sample, capacities, sessions, args.png)
    print(f"figure written to {args.png}")
    if args.native_sim:
        bad = check_native(trace, args.native_sim, capacities)
        print(f"native simulator vs port: {bad} mismatches over {len(capacities)} capacities x 3 policies")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
