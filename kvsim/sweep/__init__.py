"""Sweeps: exact replays over a grid of capacities, block/page sizes and policies, run in
parallel, and one-pass hit-rate-vs-capacity curves.

- :func:`run_sweep` -> a tidy DataFrame, one row per combination; :func:`sweep` -> the
  same plus the one-pass curves (:class:`SweepResult`).
- :func:`curve` -> ``(capacities, hit_rates)`` arrays from one pass over the trace;
  :func:`curve_model` -> the full step function (:class:`CurveModel`).
- :func:`optimal_model` -> the offline optimum of an engine's rules at any capacity
  (``docs/optimal.md``).
- :func:`offload_rows` -> every combination again with a memory tier of each size
  (``docs/offload.md``).
"""
from __future__ import annotations

import importlib
from typing import Any

#: public name -> the module that defines it, imported on first use so that
#: ``kvsim.sweep.grid`` (capacity parsing, used by every command) does not pull in pandas
_HOMES = {"CurveModel": "curves", "curve": "curves", "curve_model": "curves",
          "OptimalModel": "optimal", "optimal_model": "optimal",
          "CurveSeries": "run", "SweepResult": "run", "run_sweep": "run", "sweep": "run",
          "offload_rows": "offload", "parse_offload_sizes": "offload", "tier_grid": "offload"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'kvsim.sweep' has no attribute {name!r}")
    return getattr(importlib.import_module(f"kvsim.sweep.{_HOMES[name]}"), name)


__all__ = ["CurveModel", "CurveSeries", "OptimalModel", "SweepResult", "curve", "curve_model", "offload_rows",
           "optimal_model", "parse_offload_sizes", "run_sweep", "sweep", "tier_grid"]
