"""The APC model's settings: vLLM's own options, typed, frozen and checked once where built."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvsim.engines.vllm.hashing import check_algo
from kvsim.errors import ConfigError

#: keys of ``SimOptions.extra`` this engine reads (and the offload tier's, kvsim.engines.offload.KEYS)
EXTRA_KEYS = ("lora_paths",)


@dataclass(frozen=True)
class EngineProfile:
    """The vLLM behaviours that changed between versions (docs/engines/apc.md §7)."""

    version: str
    free_unhashed_to_head: bool   # 0.24+: freed unhashed blocks go to the queue head (§3.5)
    stats_at_admission: bool      # 0.29+: hit stats recorded once, at admission (§5.1)


PROFILES = {
    "0.33": EngineProfile("0.33", free_unhashed_to_head=True, stats_at_admission=True),
    "0.11": EngineProfile("0.11", free_unhashed_to_head=False, stats_at_admission=False),
}


def engine_profile(version: str | None) -> EngineProfile:
    """The profile for ``--engine-version`` (default 0.33)."""
    if version is None:
        return PROFILES["0.33"]
    key = str(version).strip().removeprefix("v")
    key = ".".join(key.split(".")[:2])
    if key not in PROFILES:
        raise ConfigError(f"unknown --engine-version {version!r}; choose 0.33 (default) or 0.11")
    return PROFILES[key]


@dataclass(frozen=True)
class APCSettings:
    """One APC configuration; a bad value is a :class:`ConfigError` when it is built."""

    block_size: int = 16                   # vLLM --block-size
    num_gpu_blocks: int | None = None      # vLLM's num_gpu_blocks, null block included; None = unlimited
    hash_algo: str = "fast"                # fast | sha256 | sha256_cbor
    engine_version: str | None = None      # behaviour profile: "0.33" (default) or "0.11"
    lora_paths: dict[str, str] = field(default_factory=dict)  # adapter name -> path (vLLM hashes both)
    offload: Any = None                    # the CPU tier (kvsim.tiers.setup.VllmTier), None: none

    def __post_init__(self) -> None:
        b = self.block_size
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise ConfigError(f"block size must be a positive integer, got {b!r}")
        n = self.num_gpu_blocks
        if n is not None and (isinstance(n, bool) or not isinstance(n, int)):
            raise ConfigError(f"num_gpu_blocks must be an integer, got {n!r}")
        if n is not None and n < 1:
            raise ConfigError(f"capacity gives {n} KV blocks; vLLM needs at least the null block")
        check_algo(self.hash_algo)
        engine_profile(self.engine_version)
        if not isinstance(self.lora_paths, dict):
            raise ConfigError("lora_paths must map adapter names to paths")

    @property
    def profile(self) -> EngineProfile:
        return engine_profile(self.engine_version)

    @property
    def capacity_tokens(self) -> int | None:
        """Usable KV tokens: (num_gpu_blocks - 1) * block_size."""
        return None if self.num_gpu_blocks is None else (self.num_gpu_blocks - 1) * self.block_size

    @classmethod
    def from_options(cls, options: Any) -> "APCSettings":
        """The settings a :class:`kvsim.engines.options.SimOptions` describes."""
        from kvsim.models import apc_num_gpu_blocks

        try:
            block_size = int(options.block_size)
        except (TypeError, ValueError):
            raise ConfigError(f"block size must be a positive integer, got {options.block_size!r}") from None
        if block_size < 1 or block_size != options.block_size:
            raise ConfigError(f"block size must be a positive integer, got {options.block_size!r}")
        if getattr(options, "concurrency", 1) != 1:
            raise ConfigError("the APC model replays sequentially only (--concurrency 1)")
        try:
            num_blocks = apc_num_gpu_blocks(options)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"invalid capacity: {e}") from None
        from kvsim.engines.offload import vllm_tier

        lora_paths = (options.extra or {}).get("lora_paths") or {}
        return cls(block_size, num_blocks, options.hash_algo, options.engine_version,
                   dict(lora_paths) if isinstance(lora_paths, dict) else lora_paths,
                   vllm_tier(options, block_size, num_blocks))
