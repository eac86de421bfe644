"""The sweep grid: parse the comma lists of the CLI and expand them into combinations.

A combination is one exact replay: a policy, a capacity and the settings that policy
reads (its spec's ``axes``: APC reads the block size; radix the page size and eviction
policy). A list never multiplies the combinations of a policy that ignores it.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kvsim.errors import ConfigError
from kvsim.engines.options import SimOptions



@dataclass(frozen=True)
class Capacity:
    """One point of the capacity list: a number of tokens, unlimited, or bytes of KV memory."""

    label: str                       # as the user wrote it ("1e5", "inf", "20GiB")
    tokens: float | None = None      # usable KV tokens; inf = unlimited
    memory_bytes: int | None = None  # KV cache memory (needs a model)

    def options(self) -> dict[str, Any]:
        """The SimOptions fields that carry this capacity."""
        if self.memory_bytes is not None:
            return {"kv_cache_memory": self.memory_bytes}
        return {"capacity_tokens": self.tokens}


@dataclass(frozen=True)
class SweepPoint:
    """One combination of the grid; ``index`` is its place in the output."""

    index: int
    policy: str
    capacity: Capacity
    block_size: int | None = None
    page_size: int | None = None
    eviction_policy: str | None = None
    base: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    warmup: Any = field(default=None, compare=False, hash=False)   # kvsim.warmup window (None: none)
    concurrent: Any = field(default=None, compare=False, hash=False)  # (ReplayMode, step cost) or None

    def options(self) -> SimOptions:
        """The options of this combination's exact replay."""
        kwargs = dict(self.base)
        kwargs.update(self.capacity.options())
        from kvsim.engines import registry

        for name in registry.engine(self.policy).axes:
            kwargs[name] = getattr(self, name)
        return SimOptions(**kwargs)

    def label(self) -> dict[str, Any]:
        """The identifying columns of this point (tidy: None where the policy ignores a setting)."""
        return {"policy": self.policy, "capacity": self.capacity.label, "block_size": self.block_size,
                "page_size": self.page_size, "eviction_policy": self.eviction_policy}

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("base")
        d.pop("warmup")
        d.pop("concurrent")
        return d


def split_list(text: str | Sequence[Any] | None, what: str) -> list[str]:
    """'a,b, c' (or a list) -> ['a', 'b', 'c']; an empty list is an error."""
    if text is None:
        return []
    items = [str(t) for t in text] if not isinstance(text, str) else text.split(",")
    out = [s.strip() for s in items if s is not None and str(s).strip()]
    if not out:
        raise ConfigError(f"{what}: empty list")
    return out


def parse_capacity(text: str | float | int, model: str | None = None) -> Capacity:
    """'1e5' or '250000' (tokens), 'inf' (unlimited), '20GiB' / '512MB' (memory, needs a model)."""
    label = str(text).strip()
    low = label.lower()
    if low in ("inf", "infinity", "unlimited"):
        return Capacity("inf", tokens=math.inf)
    try:
        value = float(low.replace("_", ""))
    except ValueError:
        value = None
    if value is not None:
        if math.isnan(value) or value <= 0:
            raise ConfigError(f"capacity must be a positive number of tokens, 'inf' or a memory size, got {label!r}")
        if math.isinf(value):
            return Capacity("inf", tokens=math.inf)
        if value < 1:
            raise ConfigError(f"capacity must be at least 1 token, got {label!r}")
        return Capacity(label, tokens=value)
    from kvsim.models import parse_bytes

    try:
        nbytes = parse_bytes(label)
    except ConfigError:
        raise ConfigError(f"not a capacity: {label!r} (tokens such as 1e5 or 250000, 'inf', "
                          "or memory such as 20GiB with --model)") from None
    if model is None:
        raise ConfigError(f"capacity {label!r} is a memory size: give --model to convert it into tokens")
    return Capacity(label, memory_bytes=nbytes)


def parse_capacities(text: str | Sequence[Any], model: str | None = None) -> list[Capacity]:
    """A comma list of capacities, duplicates removed, order kept."""
    caps: list[Capacity] = []
    seen: set[tuple] = set()
    for item in split_list(text, "--capacity"):
        c = parse_capacity(item, model)
        key = (c.tokens, c.memory_bytes)
        if key not in seen:
            seen.add(key)
            caps.append(c)
    return caps


def parse_ints(text: str | Sequence[Any], what: str) -> list[int]:
    """A comma list of positive integers, duplicates removed, order kept."""
    out: list[int] = []
    for item in split_list(text, what):
        try:
            value = float(item)
        except ValueError:
            raise ConfigError(f"{what}: {item!r} is not a positive integer") from None
        if not value.is_integer() or value < 1:
            raise ConfigError(f"{what}: {item!r} is not a positive integer")
        if int(value) not in out:
            out.append(int(value))
    return out


def parse_eviction_policies(text: str | Sequence[Any]) -> list[str]:
    """A comma list of radix eviction policy names (checked against the radix model's list)."""
    from kvsim.engines.sglang.evict import POLICIES

    out: list[str] = []
    for item in split_list(text, "--eviction"):
        name = item.lower()
        if name not in POLICIES:
            raise ConfigError(f"--eviction: unknown eviction policy {item!r}; choose from {', '.join(POLICIES)}")
        if name not in out:
            out.append(name)
    return out


def parse_policies(text: str | Sequence[Any]) -> list[str]:
    """'apc,radix' or 'all' -> policy names, each checked against the registry."""
    from kvsim.engines.registry import resolve_policies

    items = split_list(text, "--policy")
    return list(dict.fromkeys(resolve_policies(",".join(items))))


def expand_grid(policies: Iterable[str], capacities: Sequence[Capacity], block_sizes: Sequence[int] = (16,),
                page_sizes: Sequence[int] = (1,), eviction_policies: Sequence[str] = ("lru",),
                base: dict[str, Any] | None = None, warmup: Any = None) -> list[SweepPoint]:
    """Every combination, in a fixed order: policy, then its settings, then capacity.

    ``base`` holds further SimOptions fields shared by all points (model, engine version ...);
    ``warmup`` the window every replay leaves out of its figures (:mod:`kvsim.warmup`).
    """
    if not capacities:
        raise ConfigError("--capacity: give at least one capacity")
    base = dict(base or {})
    for key in ("capacity_tokens", "num_gpu_blocks", "max_total_tokens", "kv_cache_memory",
                "block_size", "page_size", "eviction_policy"):
        base.pop(key, None)
    from itertools import product

    from kvsim.engines import registry

    values = {"block_size": block_sizes, "page_size": page_sizes, "eviction_policy": eviction_policies}
    points: list[SweepPoint] = []
    for policy in policies:
        axes = registry.engine(policy).axes
        for combo in product(*(values[a] for a in axes)):
            s = dict(zip(axes, combo))
            for cap in capacities:
                points.append(SweepPoint(len(points), policy, cap, base=base, warmup=warmup, **s))
    for p in points:
        p.options()  # fail before any replay starts
    return points
