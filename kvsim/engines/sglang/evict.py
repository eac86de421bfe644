"""SGLang's radix eviction policies: one small class each, plus a registry.

Mirrors ``sglang/srt/mem_cache/evict_policy.py`` (0.5.23). The eviction walk pops the
evictable leaf with the smallest ``priority(node)`` first (a min-heap, spec
``docs/engines/radix.md §5.3``). All eight strategies of the file are here; SGLang's CLI
(``--radix-eviction-policy``) accepts only :data:`CLI_POLICIES`, the other three are
reachable only through its Python API.
"""
from __future__ import annotations

from typing import Any, Protocol

from kvsim.errors import ConfigError


class EvictNode(Protocol):
    """What a policy reads from a tree node."""

    last_access_time: int
    creation_time: int
    hit_count: int
    priority: int
    key_len: int
    tlru_cached_prefix_len: int
    tlru_history_len: int


class EvictionPolicy:
    """Smaller key = evicted first."""

    name = ""

    def priority(self, node: EvictNode) -> Any:
        raise NotImplementedError


class LRU(EvictionPolicy):
    name = "lru"

    def priority(self, node):
        return node.last_access_time


class LFU(EvictionPolicy):
    # hit_count grows on insert only (a request inserting through a node), never on match
    name = "lfu"

    def priority(self, node):
        return (node.hit_count, node.last_access_time)


class FIFO(EvictionPolicy):
    name = "fifo"

    def priority(self, node):
        return node.creation_time


class MRU(EvictionPolicy):
    name = "mru"

    def priority(self, node):
        return -node.last_access_time


class FILO(EvictionPolicy):
    name = "filo"

    def priority(self, node):
        return -node.creation_time


class Priority(EvictionPolicy):
    """Lower request priority first, then LRU (a node keeps the max priority inserted through it)."""

    name = "priority"

    def priority(self, node):
        return (node.priority, node.last_access_time)


class SLRU(EvictionPolicy):
    """Probationary segment (hit_count < threshold) before the protected one, LRU inside."""

    name = "slru"

    def __init__(self, protected_threshold: int = 2):
        self.protected_threshold = int(protected_threshold)

    def priority(self, node):
        return (1 if node.hit_count >= self.protected_threshold else 0, node.last_access_time)


class TLRU(EvictionPolicy):
    """Tail-optimized LRU: nodes past a conversation's TTFT budget are evicted first.

    ``budget = max(history + next_prompt_estimate - threshold, 0)``; a node whose path
    without it already caches ``budget`` tokens is "TEL-safe" and sorts as infinitely old.
    Needs the unified tree's per-node depth bookkeeping.
    """

    name = "tlru"

    def __init__(self, threshold: int = 0, next_prompt_estimate: int = 0):
        self.threshold = int(threshold)
        self.next_prompt_estimate = int(next_prompt_estimate)
        if self.threshold < 0 or self.next_prompt_estimate < 0:
            raise ConfigError("tlru needs non-negative threshold and next_prompt_estimate")
        if self.threshold <= self.next_prompt_estimate:
            raise ConfigError("tlru needs threshold > next_prompt_estimate "
                              f"(got {self.threshold} <= {self.next_prompt_estimate})")

    def priority(self, node):
        budget = max(node.tlru_history_len + self.next_prompt_estimate - self.threshold, 0)
        tel_safe = node.tlru_cached_prefix_len - node.key_len >= budget
        return (-1 if tel_safe else 0, node.last_access_time)


POLICIES: dict[str, type[EvictionPolicy]] = {
    c.name: c for c in (LRU, LFU, FIFO, MRU, FILO, Priority, SLRU, TLRU)
}
#: what ``sglang serve --radix-eviction-policy`` accepts (arg_groups/choices.py)
CLI_POLICIES = ("lru", "lfu", "slru", "priority", "tlru")
#: option keys (SimOptions.extra) of the policies that take parameters
POLICY_CONFIG_KEYS = {
    "slru": {"slru_protected_threshold": "protected_threshold"},
    "tlru": {"tlru_threshold": "threshold", "tlru_next_prompt_estimate": "next_prompt_estimate"},
}


def policy_config(name: str, extra: dict[str, Any] | None) -> dict[str, Any]:
    """The policy's constructor arguments taken from ``SimOptions.extra``."""
    extra = extra or {}
    keys = POLICY_CONFIG_KEYS.get(name.lower(), {})
    return {arg: int(extra[k]) for k, arg in keys.items() if extra.get(k) is not None}


def make_policy(name: str, config: dict[str, Any] | None = None) -> EvictionPolicy:
    """The strategy for ``name`` (case-insensitive), or a clear error."""
    cls = POLICIES.get(str(name).lower())
    if cls is None:
        raise ConfigError(f"unknown eviction policy {name!r}; choose from {', '.join(POLICIES)}")
    try:
        return cls(**(config or {}))
    except TypeError as e:
        raise ConfigError(f"bad parameters for eviction policy {name!r}: {e}") from None
