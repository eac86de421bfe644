"""Scenario name -> generator. A new scenario is one module and one line here."""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from kvsim.errors import ConfigError
from kvsim.workloads.params import MIN_TOKENS, POSITIVE_INT, Params
from kvsim.workloads.record import ChatRequest
from kvsim.workloads.rng import Rng

Builder = Callable[[Params, Rng], list[ChatRequest]]


@dataclass(frozen=True)
class Scenario:
    """A workload generator: its name, one-line summary, options with their defaults."""

    name: str
    summary: str
    build: Builder
    defaults: Mapping[str, Any]


# One module per scenario, each defining SCENARIO; listed in `kvsim generate --list` order.
_MODULES = ("code_review", "support_chat", "rag", "multi_tenant", "multi_lora",
            "volatile_prefix", "mixture")


def _scenarios() -> dict[str, Scenario]:
    found = {}
    for module in _MODULES:
        scenario = importlib.import_module(f"kvsim.workloads.{module}").SCENARIO
        found[scenario.name] = scenario
    return found


_CACHE: dict[str, Scenario] = {}


def scenarios() -> dict[str, Scenario]:
    """All scenarios by name, in the order ``kvsim generate --list`` shows them."""
    if not _CACHE:
        _CACHE.update(_scenarios())
    return _CACHE


def get_scenario(name: str) -> Scenario:
    found = scenarios().get(name)
    if found is None:
        raise ConfigError(f"unknown scenario {name!r}; choose one of: {', '.join(scenarios())}")
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
