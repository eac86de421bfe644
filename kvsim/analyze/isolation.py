"""Isolation and adapters: what per-tenant cache salts and per-adapter namespaces cost.

The same upper bound is computed with namespaces honoured (what vLLM and SGLang do:
a salt isolates a whole sequence, a LoRA adapter every block) and with salts and/or
adapters ignored. The difference is the reuse given up for isolation: for salts the
price of tenant isolation, for adapters the base prompt computed once per adapter.
"""
from __future__ import annotations

from typing import Any, Callable

from kvsim.analyze.upper_bound import bound_change
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
        out["salts_ignored"] = bound_change(bound(False, True), honoured, "cost")
    if has_lora:
        out["adapters_ignored"] = bound_change(bound(True, False), honoured, "cost")
    if has_salt and has_lora:
        out["both_ignored"] = bound_change(bound(False, False), honoured, "cost")
    return out
