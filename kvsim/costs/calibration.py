"""Measured prefill cost, fitted by ``kvsim gpu-validate`` and read by ``kvsim simulate --calibration``.

The model of one prefill of ``n`` new tokens after ``c`` cached (context) tokens::

    seconds = fixed_s + per_token_s * n + per_context_token_s * (n*c + n*(n+1)/2)

``per_token_s`` covers the work proportional to the tokens computed (the linear layers),
``per_context_token_s`` the attention, which grows with each new token's context (the
cached tokens plus the earlier new ones: the causal query-key pairs). The saving of serving
``c`` of a ``p``-token prompt from the cache is then
``per_token_s * c + per_context_token_s * c*(c+1)/2``.

No torch here: simulate reads calibrations on machines without the gpu extra.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.errors import InputError, read_json_input

SCHEMA = "kvsim.calibration/1"
_NUMBERS = ("fixed_s", "per_token_s", "per_context_token_s")


def attention_pairs(new_tokens, context_tokens):
    """Causal query-key pairs of a prefill (arrays or numbers)."""
    return new_tokens * context_tokens + new_tokens * (new_tokens + 1) / 2


@dataclass
class Calibration:
    """Fitted prefill cost of one model shape on one device and dtype."""

    device: str
    model: str
    dtype: str
    fixed_s: float
    per_token_s: float
    per_context_token_s: float
    fit: dict[str, Any] = field(default_factory=dict)   # how it was fitted: method, points, errors, source

    def prefill_seconds(self, new_tokens, context_tokens):
        """Estimated seconds to prefill ``new_tokens`` after ``context_tokens`` cached ones."""
        return (self.fixed_s + self.per_token_s * new_tokens
                + self.per_context_token_s * attention_pairs(new_tokens, context_tokens))

    def saved_seconds(self, prompt_tokens, cached_tokens):
        """Prefill seconds saved by serving ``cached_tokens`` of the prompt from the cache."""
        return self.prefill_seconds(prompt_tokens, 0) - self.prefill_seconds(prompt_tokens - cached_tokens,
                                                                             cached_tokens)

    # -- files -----------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, **asdict(self)}

    def save(self, path: str | Path) -> None:
        from kvsim.outputs import write_json

        write_json(Path(path), self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        """Read a calibration JSON, or raise :class:`InputError` saying what is wrong."""
        path = Path(path)
        data = read_json_input(path, "calibration JSON")
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise InputError(path, f"not a kvsim calibration (expected \"schema\": \"{SCHEMA}\"; "
                                   "write one with kvsim gpu-validate)")
        values = {}
        for name in _NUMBERS:
            v = data.get(name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise InputError(path, f"{name} must be a finite non-negative number, got {v!r}")
            values[name] = float(v)
        fit = data.get("fit", {})
        if not isinstance(fit, dict):
            raise InputError(path, "fit must be an object")
        return cls(device=str(data.get("device", "")), model=str(data.get("model", "")),
                   dtype=str(data.get("dtype", "")), fit=fit, **values)


def fit_calibration(new_tokens, context_tokens, seconds, device: str, model: str, dtype: str,
                    source: dict[str, Any] | None = None) -> Calibration:
    """Least-squares fit of the three non-negative coefficients to measured prefills.

    Non-negativity is enforced exactly: every subset of the three terms is fitted and the
    best fit with no negative coefficient wins (a tiny active-set NNLS).
    """
    n = np.asarray(new_tokens, np.float64)
    c = np.asarray(context_tokens, np.float64)
    y = np.asarray(seconds, np.float64)
    if not (len(n) == len(c) == len(y)) or len(y) == 0:
        raise ValueError("need the same positive number of new_tokens, context_tokens and seconds")
    features = np.stack([np.ones_like(n), n, attention_pairs(n, c)], axis=1)
    scale = np.maximum(np.abs(features).max(axis=0), 1e-30)
    x = features / scale
    best_coef, best_err = np.zeros(3), float(np.sum(y**2))
    for k in (1, 2, 3):
        for cols in itertools.combinations(range(3), k):
            sol, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
            if np.any(sol < 0):
                continue
            err = float(np.sum((x[:, cols] @ sol - y) ** 2))
            if err < best_err:
                best_err = err
                best_coef = np.zeros(3)
                best_coef[list(cols)] = sol
    coef = best_coef / scale
    pred = features @ coef
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    fit = {
        "method": "non-negative least squares over measured prefills",
        "model": "fixed_s + per_token_s*n + per_context_token_s*(n*c + n*(n+1)/2)",
        "points": len(y),
        "r2": (1.0 - best_err / ss_tot) if ss_tot > 0 else None,
        "rms_relative_error": float(np.sqrt(np.mean(((pred - y) / np.maximum(y, 1e-30)) ** 2))),
        "new_tokens_range": [float(n.min()), float(n.max())],
        "context_tokens_range": [float(c.min()), float(c.max())],
        **({"source": source} if source else {}),
    }
    return Calibration(device=device, model=model, dtype=dtype, fixed_s=float(coef[0]),
                       per_token_s=float(coef[1]), per_context_token_s=float(coef[2]), fit=fit)
