"""The cache designs kvsim models, by name: ``apc`` (vLLM Automatic Prefix Caching) and
``radix`` (SGLang RadixAttention).

Each entry says where the design's parts live: its settings type, its two
implementations (``reference``: the readable model; ``fast``: the engine replays use,
tested equal to the reference) and the function that reports a replay's figures. A new
design is one package under ``kvsim/cache/`` and one entry here. Everything is loaded
lazily (the fast engines compile on first use); nothing here imports from above
``kvsim.cache``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable

from kvsim.errors import ConfigError

#: the two implementations of every design
IMPLEMENTATIONS = ("fast", "reference")


@dataclass(frozen=True)
class Design:
    """Where one cache design's parts live (``module:name`` strings, loaded on use)."""

    name: str
    label: str           # how reports name it
    settings: str        # typed settings with ``from_options(SimOptions)``
    reference: str       # the readable model (a ``SequentialCache``; stepwise ``PrefixCache``)
    fast: str            # the fast engine (a ``SequentialCache``)
    report: str          # replay_report(settings, implementation, cache, work, columns)
    extra_keys: str      # the ``SimOptions.extra`` keys its settings read

    def load(self, part: str) -> Any:
        module, attr = getattr(self, part).split(":")
        return getattr(importlib.import_module(module), attr)

    def settings_type(self) -> type:
        return self.load("settings")

    def implementation(self, implementation: str) -> type:
        """The engine class of ``implementation`` ("fast" or "reference")."""
        if implementation not in IMPLEMENTATIONS:
            raise ConfigError(f"unknown implementation {implementation!r} of the {self.name} engine; "
                              f"choose one of {', '.join(IMPLEMENTATIONS)}")
        return self.load(implementation)

    def reporter(self) -> Callable:
        return self.load("report")


DESIGNS: dict[str, Design] = {
    "apc": Design("apc", "vLLM APC", "kvsim.engines.vllm.settings:APCSettings",
                  "kvsim.engines.vllm.sequential:APCReference", "kvsim.engines.vllm.sequential:APCFast",
                  "kvsim.engines.vllm.metrics:replay_report", "kvsim.engines.vllm.settings:EXTRA_KEYS"),
    "radix": Design("radix", "SGLang radix", "kvsim.engines.sglang.settings:RadixSettings",
                    "kvsim.engines.sglang.sequential:RadixReference", "kvsim.engines.sglang.sequential:RadixFast",
                    "kvsim.engines.sglang.stats:replay_report", "kvsim.engines.sglang.settings:EXTRA_KEYS"),
}


def policy_names() -> list[str]:
    """The cache designs (``--policy`` values), in order."""
    return list(DESIGNS)


def get_design(name: str) -> Design:
    """The design called ``name``, or a clear error."""
    if name not in DESIGNS:
        raise ConfigError(f"unknown policy {name!r}; choose from {', '.join(DESIGNS)} or 'all'")
    return DESIGNS[name]


def resolve_policies(spec: str) -> list[str]:
    """'apc', 'radix', 'apc,radix' or 'all' -> list of policy names."""
    if spec.strip() == "all":
        return policy_names()
    names = [s.strip() for s in spec.split(",") if s.strip()]
    for n in names:
        get_design(n)
    return names


def extra_keys() -> tuple[str, ...]:
    """The ``SimOptions.extra`` keys some design reads."""
    return tuple(k for d in DESIGNS.values() for k in d.load("extra_keys"))
