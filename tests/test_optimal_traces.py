"""The optimum bounds the engines on every bundled trace, with and without a warm-up window.

For each trace, APC (block 16) and radix (pages 1 and 16) are replayed exactly at
capacities from below the largest request to past saturation; the hits of the measured,
admitted requests never exceed the optimum and the denominators agree.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from kvsim.io.load import load_trace
from kvsim.drive.sequential import replay
from kvsim.engines.options import SimOptions
from kvsim.sweep.optimal import apc_optimal, radix_optimal
from kvsim.warmup import measured_mask

ROOT = Path(__file__).resolve().parents[1] / "traces"
SMALL = sorted(p.name for p in ROOT.glob("*.jsonl"))
PUBLIC = ["public/conversation_trace.jsonl", "public/synthetic_trace.jsonl", "public/kv-cache-tester"]


def _load(name: str):
    path = ROOT / name
    if path.is_dir():
        return load_trace(sorted(str(p) for p in path.glob("*.json")))
    return load_trace(str(path))


def _check(trace, capacities, warmup):
    measured = measured_mask(len(trace), warmup)
    settings = [(apc_optimal(trace, 16, warmup=warmup), "apc", {"block_size": 16})]
    settings += [(radix_optimal(trace, p, warmup=warmup), "radix", {"page_size": p}) for p in (1, 16)]
    for model, policy, opts in settings:
        for cap in capacities:
            res = replay(policy, trace, SimOptions(capacity_tokens=cap, **opts))
            ok = ~res.rejected & measured
            best = model.at(cap)
            assert int(trace.prompt_lengths[ok].sum()) == best.measured_tokens
            assert int(res.cached_tokens[ok].sum()) <= best.hit_tokens, (model.policy, opts, cap)


def _capacities(trace, points: int) -> list[float]:
    L = trace.prompt_lengths
    lo = float(np.median(L))
    hi = float(L.sum() + np.maximum(trace.output_lengths, 1).sum())
    return [float(c) for c in np.geomspace(lo, hi, points).round()] + [math.inf]


@pytest.mark.parametrize("name", SMALL)
def test_optimum_bounds_the_engines_on_bundled_traces(name):
    trace = _load(name)
    for warmup in (0.0, 0.5):
        _check(trace, _capacities(trace, 7), warmup)


@pytest.mark.slow
@pytest.mark.parametrize("name", PUBLIC)
def test_optimum_bounds_the_engines_on_public_traces(name):
    trace = _load(name)
    _check(trace, _capacities(trace, 3)[1:2], 0.5)     # one capacity in the middle: these replays take seconds
