"""Sweeps: exact replays over a grid of capacities, block/page sizes and policies, run in
parallel, and one-pass hit-rate-vs-capacity curves.

- :func:`run_sweep` -> a tidy DataFrame, one row per combination; :func:`sweep` -> the
  same plus the one-pass curves (:class:`SweepResult`).
- :func:`curve` -> ``(capacities, hit_rates)`` arrays from one pass over the trace;
  :func:`curve_model` -> the full step function (:class:`CurveModel`).
- :func:`optimal_model` -> the offline optimum of an engine's rules at any capacity
  (``docs/optimal.md``).
"""
from __future__ import annotations

from kvsim.sweep.curves import CurveModel, curve, curve_model
from kvsim.sweep.optimal import OptimalModel, optimal_model
from kvsim.sweep.run import CurveSeries, SweepResult, run_sweep, sweep

__all__ = ["CurveModel", "CurveSeries", "OptimalModel", "SweepResult", "curve", "curve_model", "optimal_model",
           "run_sweep", "sweep"]
