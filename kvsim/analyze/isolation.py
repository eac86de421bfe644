"""Isolation and adapters: what per-tenant cache salts and per-adapter namespaces cost.

The same upper bound is computed with namespaces honoured (what vLLM and SGLang do:
a salt isolates a whole sequence, a LoRA adapter every block) and with salts and/or
adapters ignored. The difference is the reuse given up for isolation: for salts the
price of tenant isolation, for adapters the base prompt computed once per adapter.
"""
from __future__ import annotations

from typing import Any, Callable

from kvsim.io.trace.columns import NONE, Trace

Bound = Callable[[bool, bool], dict[str, Any]]  # (honour salt, honour lora) -> bound summary


def isolation_costs(trace: Trace, bound: Bound, honoured: dict[str, Any]) -> dict[str, Any] | None:
    """Section 6 (None when the trace has neither salts nor adapters)."""
    has_salt = bool((trace.cache_salt != NONE).any())
    has_lora = bool((trace.lora != NONE).any())
    if not (has_salt or has_lora):
        return None
    out: dict[str, Any] = {"honoured": honoured}
    if has_salt:
        out["salts_ignored"] = _cost(bound(False, True), honoured)
    if has_lora:
        out["adapters_ignored"] = _cost(bound(True, False), honoured)
    if has_salt and has_lora:
        out["both_ignored"] = _cost(bound(False, False), honoured)
    return out


def _cost(ignored: dict[str, Any], honoured: dict[str, Any]) -> dict[str, Any]:
    out = dict(ignored)
    for key in ("token", "block16"):
        out[f"{key}_cost_tokens"] = ignored[f"{key}_tokens"] - honoured[f"{key}_tokens"]
        out[f"{key}_cost_points"] = 100.0 * (ignored[key] - honoured[key])
    return out
