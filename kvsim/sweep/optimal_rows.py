"""The optimum next to every sweep row, and the smooth optimal curves of a sweep.

Each row gets ``optimal_hit_rate``: the most any cache of that row's capacity and block
(APC) or page (radix) size could reach on the log under the engine's rules, with the same
warm-up (:mod:`kvsim.sweep.optimal`). Rows that share a block / page size (and, for
radix, the generation settings) share one model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kvsim.io.trace.columns import Trace
from kvsim.sweep.grid import SweepPoint
from kvsim.sweep.optimal import OptimalModel, apc_optimal, radix_optimal


@dataclass
class OptimalSeries:
    """The optimal curve of one engine setting: capacities (usable tokens) and hit rates."""

    engine: str
    settings: dict[str, Any]
    capacity_tokens: np.ndarray
    hit_rate: np.ndarray
    exactness: str
    seconds: float
    model: OptimalModel | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "settings": self.settings, "capacity_tokens": self.capacity_tokens.tolist(),
                "hit_rate": self.hit_rate.tolist(), "exactness": self.exactness, "seconds": round(self.seconds, 4)}


def model_key(point: SweepPoint) -> tuple | None:
    """Rows with the same key share one optimum model (None: the engine's rules have none)."""
    from kvsim.engines import registry

    spec = registry.engine(point.policy)
    if spec.optimal == "chained_blocks":
        return (point.policy, spec.optimal, point.block_size)
    if spec.optimal == "token_tree":
        s = spec.settings(point.options())
        return (point.policy, spec.optimal, point.page_size, s.overlap, s.finish, s.max_new_tokens,
                s.chunked_prefill_size)
    return None


def build_model(trace: Trace, key: tuple, warmup: Any) -> OptimalModel:
    if key[1] == "chained_blocks":
        return apc_optimal(trace, key[2], warmup=warmup)
    _, _, page, overlap, finish, max_new, chunk = key
    return radix_optimal(trace, page, warmup=warmup, overlap=overlap, finish=finish, max_new_tokens=max_new,
                         chunked_prefill_size=chunk)


def attach_optimal(trace: Trace, points: list[SweepPoint], frame: pd.DataFrame, warmup: Any = None,
                   curve_points: int = 64) -> list[OptimalSeries]:
    """Add ``optimal_hit_rate`` to ``frame`` (in place); return one smooth curve per model."""
    frame["optimal_hit_rate"] = np.nan
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(points):
        key = model_key(p)
        if key is not None:
            groups.setdefault(key, []).append(i)
    out = []
    for key, idx in groups.items():
        model = build_model(trace, key, warmup)
        caps = frame.loc[idx, "capacity_tokens"].to_numpy(np.float64)
        frame.loc[idx, "optimal_hit_rate"] = model.hit_rate([None if math.isinf(c) else c for c in caps])
        finite = caps[np.isfinite(caps)]
        hi = max(float(finite.max()) if len(finite) else 0.0, float(model.saturation_tokens))
        xs, ys = model.grid(curve_points, hi_tokens=hi)
        settings = dict(model.settings)
        out.append(OptimalSeries(key[0], settings, xs, ys, model.exactness,
                                 model.build_seconds + sum(pt.seconds for pt in model._points.values()), model))
    return out
