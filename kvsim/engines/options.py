"""Options shared by every cache policy, as the CLI and the Python API pass them."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, asdict
from typing import Any

from kvsim.errors import ConfigError


@dataclass
class SimOptions:
    """How to replay a trace. Capacity may be given in any one of several units.

    Exactly one capacity source is used, in this order: ``num_gpu_blocks`` (APC's own
    unit, null block included), ``max_total_tokens`` (SGLang's own unit),
    ``capacity_tokens`` (usable KV tokens, ``inf`` for unlimited), ``kv_cache_memory``
    bytes with ``model``, or ``model`` with ``gpu`` (an estimate of what the engine would
    find free after loading weights). None of them means unlimited.
    """

    capacity_tokens: float | None = None
    num_gpu_blocks: int | None = None
    max_total_tokens: int | None = None
    kv_cache_memory: int | None = None     # bytes of KV cache memory
    model: str | None = None               # model shape name or path to a HF config.json
    gpu: str | None = None                 # GPU name for memory-derived capacity estimates
    gpu_memory_utilization: float = 0.9    # vLLM's --gpu-memory-utilization
    mem_fraction_static: float | None = None  # SGLang's --mem-fraction-static (None: its default)
    block_size: int = 16                   # APC block size (vLLM --block-size)
    page_size: int = 1                     # radix page size (SGLang --page-size)
    eviction_policy: str = "lru"           # radix eviction policy
    engine_version: str | None = None      # behaviour profile, e.g. "0.33" (default) or "0.11"
    hash_algo: str = "fast"                # APC block hash: fast | sha256 | sha256_cbor
    concurrency: int = 1                   # 1 = sequential replay
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._coerce()
        if self.block_size is None or int(self.block_size) < 1:
            raise ConfigError(f"block size must be a positive integer, got {self.block_size!r}")
        if self.page_size is None or int(self.page_size) < 1:
            raise ConfigError(f"page size must be a positive integer, got {self.page_size!r}")
        if self.capacity_tokens is not None:
            c = float(self.capacity_tokens)
            if math.isnan(c) or c <= 0:
                raise ConfigError(f"capacity must be a positive number of tokens or 'inf', got {self.capacity_tokens!r}")
        for name in ("num_gpu_blocks", "max_total_tokens", "kv_cache_memory"):
            v = getattr(self, name)
            if v is not None and int(v) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive, got {v!r}")
        if self.concurrency != 1:
            raise ConfigError("only sequential replay (--concurrency 1) is implemented so far")
        self._check_extra()

    def _check_extra(self) -> None:
        """Every key of ``extra`` must be a setting some engine reads: a typo is an error."""
        from difflib import get_close_matches

        from kvsim.engines.registry import extra_keys

        if not isinstance(self.extra, dict):
            raise ConfigError(f"extra must be a dict of engine settings, got {type(self.extra).__name__}")
        known = extra_keys()
        for key in self.extra:
            if key not in known:
                near = get_close_matches(str(key), known, n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else f"; known: {', '.join(known)}"
                raise ConfigError(f"unknown engine setting {key!r} in SimOptions.extra{hint}")

    def _coerce(self) -> None:
        """Turn numeric strings into numbers; anything else is a one-line ConfigError."""
        for name, kind in (("block_size", int), ("page_size", int), ("num_gpu_blocks", int),
                           ("max_total_tokens", int), ("kv_cache_memory", int), ("concurrency", int),
                           ("capacity_tokens", float), ("gpu_memory_utilization", float),
                           ("mem_fraction_static", float)):
            value = getattr(self, name)
            if value is None or isinstance(value, bool):
                continue
            try:
                number = kind(float(value)) if kind is int else float(value)
                if kind is int and float(value) != number:
                    raise ValueError
            except (TypeError, ValueError, OverflowError):
                flag = "--" + name.replace("_", "-")
                raise ConfigError(f"{flag} must be a {'whole ' if kind is int else ''}number, got {value!r}") from None
            setattr(self, name, number)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
