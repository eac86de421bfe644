"""Policy registry: a policy name maps to the function that replays a trace through it.

Adding a policy is one module with a ``replay_*(trace, options, progress=None)`` function
and one line here.
"""
from __future__ import annotations

import importlib
from typing import Callable, Protocol

from kvsim.errors import ConfigError

_POLICIES: dict[str, str] = {
    "apc": "kvsim.replay.apc:replay_apc",        # vLLM Automatic Prefix Caching
    "radix": "kvsim.replay.radix:replay_radix",  # SGLang RadixAttention
}


class Replayer(Protocol):
    def __call__(self, trace, options, progress=None): ...


def extra_keys() -> tuple[str, ...]:
    """The ``SimOptions.extra`` keys some engine reads (each engine's settings list theirs)."""
    from kvsim.cache.apc.settings import EXTRA_KEYS as APC_KEYS
    from kvsim.cache.radix.settings import EXTRA_KEYS as RADIX_KEYS

    return (*APC_KEYS, *RADIX_KEYS)


def policy_names() -> list[str]:
    """Policies whose implementation is present."""
    names = []
    for name, target in _POLICIES.items():
        module = target.split(":")[0]
        if importlib.util.find_spec(module) is not None:
            names.append(name)
    return names


def get_replayer(name: str) -> Callable:
    """The replay function of a policy, or a clear error."""
    if name not in _POLICIES:
        raise ConfigError(f"unknown policy {name!r}; choose from {', '.join(_POLICIES)} or 'all'")
    module, func = _POLICIES[name].split(":")
    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"policy {name!r} is not available in this build")
    return getattr(importlib.import_module(module), func)


def resolve_policies(spec: str) -> list[str]:
    """'apc', 'radix', 'apc,radix' or 'all' -> list of policy names."""
    if spec.strip() == "all":
        return policy_names()
    names = [s.strip() for s in spec.split(",") if s.strip()]
    for n in names:
        get_replayer(n)
    return names
