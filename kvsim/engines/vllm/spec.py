"""vLLM 0.33.0's Automatic Prefix Caching, as kvsim's commands reach it."""
from __future__ import annotations

from typing import Any

from kvsim.engines.spec import EngineSpec
from kvsim.errors import ConfigError


class APCSpec(EngineSpec):
    name = "apc"
    label = "vLLM APC"
    short = "APC"
    release = "vLLM 0.33.0"
    family = "vllm"
    color = "#2563a8"
    unit, unit_name = "block_size", "block"
    axes = ("block_size",)
    capacity_column = "num_gpu_blocks"
    @property
    def extra_keys(self) -> tuple[str, ...]:
        from kvsim.engines.offload import KEYS
        from kvsim.engines.vllm.settings import EXTRA_KEYS

        return (*EXTRA_KEYS, *KEYS)

    curve, curve_exact = "chained_blocks", True
    optimal = "chained_blocks"
    settings_type = "kvsim.engines.vllm.settings:APCSettings"
    reference = "kvsim.engines.vllm.sequential:APCReference"
    fast = "kvsim.engines.vllm.sequential:APCFast"
    report = "kvsim.engines.vllm.metrics:replay_report"
    scheduler = "kvsim.engines.vllm.scheduler"
    serve = "kvsim.engines.vllm.serve:ApcServeEngine"
    events = "kvsim.engines.vllm.events"

    def check_concurrent(self, options: Any) -> None:
        super().check_concurrent(options)
        if options.engine_version not in (None, "0.33"):
            raise ConfigError("--replay steps|timed models vLLM 0.33.0's scheduler; --engine-version applies "
                              "to --replay sequential only")

    def describe(self, config: dict[str, Any]) -> str:
        return f"vLLM APC (block {config.get('block_size', '?')})"

    def sequential_figures(self, result: Any, hits: int, queries: int) -> dict[str, Any]:
        # the rate vLLM's own log and metrics would show: GPU hits only, the connector's
        # tokens are counted apart (docs/engines/offload.md §1.12)
        tier = result.extra.get("offload")
        if tier is not None:
            looked = ~result.rejected & result.read_cache
            if result.measured is not None:
                looked &= result.measured
            hits -= int(sum(tier.by_tier[t][looked].sum() for t in tier.tiers() if t != "gpu"))
        return {"vllm_logged_hit_rate": hits / queries if queries else 0.0}


APC = APCSpec()
