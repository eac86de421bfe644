"""``run_sweep``: every combination as an exact replay, plus one-pass curves and their error."""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvsim.io.trace.columns import Trace
from kvsim.sweep.curves import CurveModel, curve_model
from kvsim.sweep.grid import (
    SweepPoint,
    expand_grid,
    parse_capacities,
    parse_eviction_policies,
    parse_ints,
    parse_policies,
)
from kvsim.sweep.executors import Executor, run_points

#: summary figures kept as columns, in this order
FIGURES = ("token_hit_rate", "vllm_logged_hit_rate", "sglang_logged_hit_rate", "request_hit_rate",
           "mean_cached_fraction", "requests", "admitted", "rejected", "prompt_tokens", "cached_tokens",
           "evictions", "evicted_tokens", "peak_used_tokens", "replay_seconds")
#: the scheduler model's figures under load (``concurrent=``), after the sequential ones
CONCURRENT_FIGURES = ("concurrent_hit_rate", "concurrent_preemptions", "ttft_p50_s", "ttft_p90_s")


@dataclass
class CurveSeries:
    """One one-pass curve: a policy setting, its smooth curve, and its error at the swept points."""

    policy: str
    settings: dict[str, Any]
    capacity_tokens: np.ndarray      # smooth curve x (usable KV tokens)
    hit_rate: np.ndarray             # smooth curve y (token hit rate)
    points: int                      # swept points compared
    max_abs_error: float | None      # vs the exact replays at the swept points
    mean_abs_error: float | None
    exactness: str
    seconds: float
    model: CurveModel | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {"policy": self.policy, "settings": self.settings,
                "capacity_tokens": self.capacity_tokens.tolist(), "hit_rate": self.hit_rate.tolist(),
                "points": self.points, "max_abs_error": self.max_abs_error,
                "mean_abs_error": self.mean_abs_error, "exactness": self.exactness,
                "seconds": round(self.seconds, 4)}


@dataclass
class SweepResult:
    """The tidy table (one row per combination) and the one-pass curves."""

    frame: pd.DataFrame
    curves: list[CurveSeries]
    points: list[SweepPoint]
    elapsed_s: float
    optimal: list = field(default_factory=list)     # kvsim.sweep.optimal_rows.OptimalSeries
    warmup: dict[str, Any] | None = None             # kvsim.warmup.Warmup.as_dict, when one is used

    def as_dict(self) -> dict[str, Any]:
        rows = self.frame.replace({np.inf: None}).astype(object).where(self.frame.notna(), None)
        out = {"rows": rows.to_dict(orient="records"), "curves": [c.as_dict() for c in self.curves],
               "optimal_curves": [c.as_dict() for c in self.optimal], "seconds": round(self.elapsed_s, 3)}
        if self.warmup is not None:
            out["warmup"] = self.warmup
        return out


def sweep(trace: Trace, policies: str | Sequence[str] = "apc,radix", capacities: str | Sequence[Any] = "inf",
          block_sizes: str | Sequence[int] = (16,), page_sizes: str | Sequence[int] = (1,),
          eviction_policies: str | Sequence[str] = ("lru",), model: str | None = None,
          jobs: int | None = None, executor: str | Executor = "local", curves: bool = True,
          curve_points: int = 64, progress: bool | Callable[[int, int], Any] = False,
          warmup: Any = None, optimal: bool = True, concurrent: Any = None, **options: Any) -> SweepResult:
    """Replay every combination exactly and attach one-pass curves; see :func:`run_sweep`.

    ``concurrent`` = ``(ReplayMode, step cost or None)`` (:mod:`kvsim.drive.concurrent`) also
    replays each combination through the engine's scheduler model as the log arrived, as
    ``kvsim simulate --replay`` does: columns ``concurrent_hit_rate``,
    ``concurrent_preemptions`` and, timed, ``ttft_p50_s`` / ``ttft_p90_s``.
    """
    from kvsim.warmup import parse_warmup

    t0 = time.perf_counter()
    trace.require_tokens("a sweep")
    names = parse_policies(policies)
    caps = parse_capacities(capacities, model)
    window = parse_warmup(warmup)
    base = dict(options)
    if model is not None:
        base["model"] = model
    from kvsim.engines import registry

    axes = {a for n in names for a in registry.engine(n).axes}
    points = expand_grid(
        names, caps,
        block_sizes=parse_ints(block_sizes, "--block-size") if "block_size" in axes else (16,),
        page_sizes=parse_ints(page_sizes, "--page-size") if "page_size" in axes else (1,),
        eviction_policies=parse_eviction_policies(eviction_policies) if "eviction_policy" in axes else ("lru",),
        base=base, warmup=window if window.active else None)   # executors.replay_point counts after it
    if concurrent is not None:
        from dataclasses import replace

        points = [replace(p, concurrent=concurrent) for p in points]
    rows = run_points(trace, points, executor=executor, jobs=jobs, progress=progress)
    frame = _frame(points, rows)
    series = _curves(trace, points, frame, curve_points, window) if curves else []
    best = []
    if optimal:
        from kvsim.sweep.optimal_rows import attach_optimal

        best = attach_optimal(trace, points, frame, window, curve_points)
    return SweepResult(frame, series, points, time.perf_counter() - t0, best,
                       window.as_dict(len(trace)) if window.active else None)


def run_sweep(trace: Trace, policies: str | Sequence[str] = "apc,radix", capacities: str | Sequence[Any] = "inf",
              block_sizes: str | Sequence[int] = (16,), page_sizes: str | Sequence[int] = (1,),
              eviction_policies: str | Sequence[str] = ("lru",), model: str | None = None,
              jobs: int | None = None, executor: str | Executor = "local", curves: bool = True,
              **options: Any) -> pd.DataFrame:
    """One row per combination (policy x settings x capacity), as a tidy DataFrame.

    Each list is a comma string or a sequence. Capacities are usable KV tokens ('1e5',
    'inf') or memory ('20GiB', with ``model``). APC rows vary ``block_sizes``, radix rows
    ``page_sizes`` x ``eviction_policies``. Replays run in a process pool of ``jobs``
    workers (default: all CPUs; 1 = in this process) or on Ray (``executor="ray"``). With
    ``curves``, LRU-like rows get ``curve_hit_rate`` (the one-pass estimate) and
    ``curve_abs_error`` (its distance to the exact replay). ``options`` are further
    :class:`~kvsim.engines.options.SimOptions` fields shared by every replay; ``warmup``
    (a fraction or a request count, :mod:`kvsim.warmup`) leaves the first requests out of
    every figure, and every row gets ``optimal_hit_rate`` (:mod:`kvsim.sweep.optimal`).
    """
    return sweep(trace, policies, capacities, block_sizes, page_sizes, eviction_policies, model, jobs,
                 executor, curves, **options).frame


def _frame(points: list[SweepPoint], rows: list[dict[str, Any]]) -> pd.DataFrame:
    from kvsim.engines import registry

    records = []
    for p, row in zip(points, rows):
        cfg = row.get("config", {})
        cap = row.get("capacity_tokens")
        own = registry.engine(p.policy).capacity_column      # the engine's own capacity unit
        rec = {**p.label(), "capacity_tokens": math.inf if cap is None else float(cap),
               **{col: cfg.get(col) if col == own else None for col in ("num_gpu_blocks", "max_total_tokens")}}
        for key in FIGURES:
            rec[key] = row.get(key)
        for key in CONCURRENT_FIGURES:
            if key in row:
                rec[key] = row[key]
        records.append(rec)
    frame = pd.DataFrame.from_records(records)
    for col in ("block_size", "page_size", "num_gpu_blocks", "max_total_tokens"):
        frame[col] = frame[col].astype("Int64")
    return frame


def _curve_groups(points: list[SweepPoint]) -> dict[tuple, list[int]]:
    """Rows that share one curve: an engine's rows at one size of its unit (APC per block
    size; radix LRU per page size)."""
    from kvsim.engines import registry

    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(points):
        spec = registry.engine(p.policy)
        if spec.curve_applies(p.label()):
            groups.setdefault((p.policy, getattr(p, spec.unit)), []).append(i)
    return groups


def _curves(trace: Trace, points: list[SweepPoint], frame: pd.DataFrame, curve_points: int,
            window: Any = None) -> list[CurveSeries]:
    from kvsim.warmup import as_fraction

    frame["curve_hit_rate"] = np.nan
    frame["curve_abs_error"] = np.nan
    engine_version = points[0].base.get("engine_version") if points else None
    warm = as_fraction(len(trace), window)
    out: list[CurveSeries] = []
    from kvsim.engines import registry

    for (policy, size), idx in _curve_groups(points).items():
        model = curve_model(trace, policy, **{registry.engine(policy).unit: size}, engine_version=engine_version,
                            warmup=warm)
        caps = frame.loc[idx, "capacity_tokens"].to_numpy(np.float64)
        est = model.hit_rate(caps)
        exact = frame.loc[idx, "token_hit_rate"].to_numpy(np.float64)
        err = np.abs(est - exact)
        frame.loc[idx, "curve_hit_rate"] = est
        frame.loc[idx, "curve_abs_error"] = err
        finite = caps[np.isfinite(caps)]
        hi = max(float(finite.max()) if len(finite) else 0.0, model.saturation_units * model.unit_tokens)
        xs, ys = model.grid(curve_points, hi_tokens=hi)
        settings = dict(model.settings)
        out.append(CurveSeries(policy, settings, xs, ys, len(idx),
                               float(err.max()) if len(err) else None, float(err.mean()) if len(err) else None,
                               model.exactness, model.elapsed_s, model))
    return out


def sweep_json(trace: Trace, result: SweepResult, settings: dict[str, Any]) -> dict[str, Any]:
    """Everything the terminal shows, plus the smooth curves, as JSON (no prompt text)."""
    return {
        "trace": {"sources": trace.meta.sources, "formats": trace.meta.formats, "requests": len(trace),
                  "prompt_tokens": trace.num_prompt_tokens, "skipped_lines": trace.meta.skipped_lines},
        "settings": settings,
        **result.as_dict(),
    }
