"""Scenario name -> generator, and the options each scenario takes.

A new scenario is one module with its ``build`` function and one row in ``_SCENARIOS``.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from kvsim.errors import ConfigError
from kvsim.workloads.record import DEFAULT_MODEL, ChatRequest
from kvsim.workloads.rng import Rng


@dataclass(frozen=True)
class Params:
    """Resolved options of one scenario (``None``: the scenario does not use it). Each
    scenario declares which ones it takes and their defaults; :func:`resolve` fills in and
    checks them."""

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

Builder = Callable[[Params, Rng], list[ChatRequest]]


@dataclass(frozen=True)
class Scenario:
    """A workload generator: its name, one-line summary, where its builder lives
    (``module:function`` under ``kvsim.workloads``, imported when first used) and the
    options it takes with their defaults."""

    name: str
    summary: str
    builder: str
    defaults: Mapping[str, Any]

    def build(self, p: Params, rng: Rng) -> list[ChatRequest]:
        """The scenario's requests for ``p``, drawn from ``rng``, in arrival order."""
        module, function = self.builder.split(":")
        build: Builder = getattr(importlib.import_module(f"kvsim.workloads.{module}"), function)
        return build(p, rng)


DEFAULT_MIX = "code_review=0.25,support_chat=0.3,rag=0.2,multi_tenant=0.15,multi_lora=0.1"

# Every scenario, in the order `kvsim generate --list` shows them.
_SCENARIOS = (
    Scenario("code_review", "long shared system prompt, short varied code snippets to review",
             "code_review:build", {"requests": 200, "rate": 2.0, "system_tokens": 3000}),
    Scenario("support_chat", "support chatbot; every turn resends system prompt + history",
             "support_chat:build", {"sessions": 40, "turns": 6, "rate": 1.0}),
    Scenario("rag", "popular document first, then 1-3 varying ones (--popular-last)",
             "rag:build", {"requests": 300, "rate": 2.0, "doc_tokens": 500, "popular_last": False}),
    Scenario("multi_tenant", "tenants share a system prompt, each with its own cache_salt",
             "multi_tenant:build", {"requests": 300, "tenants": 4, "rate": 3.0, "system_tokens": 1500}),
    Scenario("multi_lora", "teams use their own LoRA adapter on the same base prompts",
             "multi_lora:build", {"requests": 300, "adapters": 3, "rate": 2.0, "system_tokens": 600}),
    Scenario("volatile_prefix", "code_review with a timestamp + request id opening the prompt",
             "code_review:build_volatile", {"requests": 200, "rate": 2.0, "system_tokens": 3000}),
    Scenario("mixture", "a mix of the above with bursty Poisson arrivals",
             "mixture:build", {"requests": 500, "rate": 1.0, "mix": DEFAULT_MIX, "burstiness": 5.0,
                               "turns": None, "tenants": None, "adapters": None,
                               "system_tokens": None, "doc_tokens": None, "popular_last": None}),
)
_BY_NAME = {s.name: s for s in _SCENARIOS}


def scenarios() -> dict[str, Scenario]:
    """All scenarios by name, in the order ``kvsim generate --list`` shows them."""
    return dict(_BY_NAME)


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name``; ConfigError naming the choices when there is none."""
    found = _BY_NAME.get(name)
    if found is None:
        raise ConfigError(f"unknown scenario {name!r}; choose one of: {', '.join(_BY_NAME)}")
    return found


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def resolve(name: str, seed: int = 0, **options: Any) -> Params:
    """The scenario's defaults overridden by ``options`` (``None`` values are ignored).

    Raises ConfigError for an option the scenario does not take or a bad value.
    """
    scenario = get_scenario(name)
    known = {f.name for f in fields(Params)}
    given = {k: v for k, v in options.items() if v is not None}
    for key in given:
        if key not in known:
            raise TypeError(f"unknown option {key!r}")
        if key not in scenario.defaults and key != "model":
            takes = ", ".join(_flag(k) for k in scenario.defaults) or "no options"
            raise ConfigError(f"{_flag(key)} does not apply to scenario {name} (it takes {takes})")
    values = {**scenario.defaults, **given}
    for key in POSITIVE_INT:
        if values.get(key) is not None and values[key] < 1:
            raise ConfigError(f"{_flag(key)} must be at least 1 (got {values[key]})")
    for key, low in MIN_TOKENS.items():
        if values.get(key) is not None and values[key] < low:
            raise ConfigError(f"{_flag(key)} must be at least {low} (got {values[key]})")
    if values.get("rate") is not None and not values["rate"] > 0:
        raise ConfigError(f"--rate must be positive (got {values['rate']})")
    if values.get("burstiness") is not None and not values["burstiness"] >= 1:
        raise ConfigError(f"--burstiness must be at least 1 (got {values['burstiness']})")
    return replace(Params(seed=seed), **values)


def generate(name: str, seed: int = 0, **options: Any) -> list[ChatRequest]:
    """Generate scenario ``name``: the requests in arrival order, same seed -> same list.

    ``options`` are the scenario's knobs (``requests``, ``sessions``, ``turns``, ``tenants``,
    ``adapters``, ``rate``, ``system_tokens``, ``doc_tokens``, ``popular_last``, ``mix``,
    ``burstiness``, ``model``); see ``kvsim generate --list`` for which apply.
    """
    params = resolve(name, seed=seed, **options)
    return get_scenario(name).build(params, Rng(f"{name}:{seed}"))
