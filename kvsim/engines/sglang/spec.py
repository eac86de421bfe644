"""SGLang 0.5.23's RadixAttention, as kvsim's commands reach it."""
from __future__ import annotations

from typing import Any

from kvsim.engines.spec import EngineSpec
from kvsim.errors import ConfigError


#: radix eviction policies with a one-pass curve
CURVE_EVICTION = ("lru",)


class RadixSpec(EngineSpec):
    name = "radix"
    label = "SGLang radix"
    short = "radix"
    release = "SGLang 0.5.23"
    family = "sglang"
    color = "#d9661f"
    unit, unit_name = "page_size", "page"
    axes = ("page_size", "eviction_policy")
    capacity_column = "max_total_tokens"
    curve, curve_exact = "token_tree", False
    optimal = "token_tree"
    orders = ("fcfs", "lpm")
    settings_type = "kvsim.engines.sglang.settings:RadixSettings"
    reference = "kvsim.engines.sglang.sequential:RadixReference"
    fast = "kvsim.engines.sglang.sequential:RadixFast"
    report = "kvsim.engines.sglang.stats:replay_report"
    scheduler = "kvsim.engines.sglang.scheduler"
    serve = "kvsim.engines.sglang.serve:RadixServeEngine"
    events = "kvsim.engines.sglang.events"

    @property
    def extra_keys(self) -> tuple[str, ...]:
        from kvsim.engines.offload import KEYS
        from kvsim.engines.sglang.settings import EXTRA_KEYS

        return (*EXTRA_KEYS, *KEYS)

    def check_concurrent(self, options: Any) -> None:
        super().check_concurrent(options)
        extra = options.extra
        if extra.get("radix_tree", "unified") != "unified":
            raise ConfigError("--replay steps|timed models SGLang 0.5.23's default tree (--radix-tree unified)")
        if extra.get("eviction_amount", "shortfall") != "shortfall":
            raise ConfigError("--eviction-amount applies to --replay sequential only")

    def describe(self, config: dict[str, Any]) -> str:
        return f"SGLang radix (page {config.get('page_size', '?')}, {config.get('eviction_policy', 'lru')})"

    def setting_label(self, row: dict[str, Any]) -> str:
        return f"radix p{row['page_size']} {row['eviction_policy']}"

    def curve_gap(self) -> str:
        return f"radix eviction policies other than {', '.join(CURVE_EVICTION)}"

    def curve_applies(self, settings: dict[str, Any]) -> bool:
        """The one-pass tree curve models LRU eviction only (docs/curves.md)."""
        return str(settings.get("eviction_policy") or "lru").lower() in CURVE_EVICTION


RADIX = RadixSpec()
