"""The knobs of a synthetic workload. Each scenario declares which ones it takes and
their defaults; :func:`kvsim.workloads.registry.resolve` fills in and checks them."""
from __future__ import annotations

from dataclasses import dataclass

from kvsim.workloads.record import DEFAULT_MODEL


@dataclass(frozen=True)
class Params:
    """Resolved options of one scenario (``None``: the scenario does not use it)."""

    seed: int = 0
    requests: int | None = None        # total requests (single-turn scenarios, mixture)
    sessions: int | None = None        # conversations (support_chat)
    turns: int | None = None           # mean turns per conversation
    tenants: int | None = None         # tenants sharing a system prompt (multi_tenant)
    adapters: int | None = None        # LoRA adapters, one per team (multi_lora)
    rate: float | None = None          # mean arrival rate, requests per second
    system_tokens: int | None = None   # approximate size of the shared system prompt
    doc_tokens: int | None = None      # approximate size of one retrieved document (rag)
    popular_last: bool | None = None   # rag: put the popular document after the others
    mix: str | None = None             # mixture: "scenario=weight,..."
    burstiness: float | None = None    # mixture: burst rate / quiet rate
    model: str = DEFAULT_MODEL
    max_requests: int | None = None    # internal: cap on requests (used by the mixture)


# Options a user can set, by CLI flag name, with their checks.
POSITIVE_INT = ("requests", "sessions", "turns", "tenants", "adapters")
MIN_TOKENS = {"system_tokens": 50, "doc_tokens": 20}
