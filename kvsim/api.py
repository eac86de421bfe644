"""The Python API in a few names: load, simulate, summarize."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from kvsim.engines.registry import resolve_policies
from kvsim.io.trace.columns import Trace
from kvsim.drive.sequential import replay
from kvsim.drive.metrics import breakdowns, per_request_frame, summarize
from kvsim.engines.options import SimOptions
from kvsim.drive.result import ReplayResult


def _as_trace(trace: Trace | str | Path, **load_kwargs: Any) -> Trace:
    if isinstance(trace, Trace):
        return trace
    from kvsim.io.load import load_trace

    return load_trace(trace, **load_kwargs)


def simulate(trace: Trace | str | Path, policy: str = "apc", options: SimOptions | None = None,
             **option_kwargs: Any) -> ReplayResult:
    """Replay a trace (or a log path) through one policy: ``simulate(t, "apc", capacity_tokens=1e5)``."""
    opts = options or SimOptions(**option_kwargs)
    return replay(policy, _as_trace(trace), opts)


def compare(trace: Trace | str | Path, policies: str = "all", options: SimOptions | None = None,
            **option_kwargs: Any) -> pd.DataFrame:
    """Side-by-side summary of several policies on one trace, one column per policy."""
    t = _as_trace(trace)
    opts = options or SimOptions(**option_kwargs)
    rows = {name: summarize(replay(name, t, opts), t) for name in resolve_policies(policies)}
    return pd.DataFrame(rows)


__all__ = ["simulate", "compare", "summarize", "per_request_frame", "breakdowns", "SimOptions", "ReplayResult"]
