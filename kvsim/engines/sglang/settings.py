"""The radix model's settings: SGLang's own options, typed, frozen and checked once where built
(sections: docs/engines/radix.md).

Defaults are a default SGLang 0.5.23 server's. In :class:`kvsim.engines.options.SimOptions`
the radix-only settings travel in ``extra`` under the keys of :data:`EXTRA_KEYS`:

==========================  =============================================================
``radix_tree``              ``"unified"`` (UnifiedRadixCache, what the server builds) or
                            ``"classic"`` (RadixCache)
``overlap``                 overlap scheduler on (default ``True``;
                            ``--disable-overlap-schedule`` = ``False``)
``chunked_prefill_size``    SGLang's ``--chunked-prefill-size`` (-1 disables); default
                            from ``--gpu`` as SGLang derives it, else 4096
``finish``                  ``"length"`` (default: replies end at their logged length,
                            ``max_tokens`` = that length) or ``"stop"`` (they end with a
                            stop token; with overlap one more decode step runs, §3.3)
``max_new_tokens``          the client's ``max_tokens`` with ``finish="stop"``
                            (default: none, clipped to the pool as SGLang does)
``eviction_amount``         ``"shortfall"`` (0.5.23) or ``"need"`` (before 2026-07, §5.5)
``slru_protected_threshold``, ``tlru_threshold``, ``tlru_next_prompt_estimate``
                            ``--radix-eviction-policy-config`` of slru / tlru
==========================  =============================================================
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvsim.engines.sglang.evict import POLICIES, POLICY_CONFIG_KEYS, make_policy, policy_config
from kvsim.errors import ConfigError

TREES = ("unified", "classic")
FINISHES = ("length", "stop")
EVICTION_AMOUNTS = ("shortfall", "need")
DEFAULT_CHUNKED_PREFILL = 4096      # SGLang's chunked_prefill_size when the GPU is unknown

#: keys of ``SimOptions.extra`` this engine reads
EXTRA_KEYS = ("radix_tree", "overlap", "chunked_prefill_size", "finish", "max_new_tokens", "eviction_amount",
              *(k for keys in POLICY_CONFIG_KEYS.values() for k in keys))


def sglang_chunked_prefill_size(gpu: str | None) -> int:
    """SGLang's default --chunked-prefill-size for a GPU (arg_groups/memory_hook.py)."""
    if not gpu:
        return DEFAULT_CHUNKED_PREFILL
    from kvsim.models import MiB, gpu_memory_bytes

    mib = gpu_memory_bytes(gpu) / MiB
    for limit, size in ((20 * 1024, 2048), (35 * 1024, 4096), (60 * 1024, 4096), (90 * 1024, 8192),
                        (160 * 1024, 8192)):
        if mib < limit:
            return size
    return 16384


@dataclass(frozen=True)
class RadixSettings:
    """One SGLang radix configuration; a bad value is a :class:`ConfigError` when it is built."""

    page_size: int = 1                       # SGLang --page-size
    capacity: int | None = None              # max_total_num_tokens (a multiple of the page); None = unlimited
    eviction_policy: str = "lru"             # --radix-eviction-policy (all eight of evict.py)
    policy_config: dict[str, int] = field(default_factory=dict)  # --radix-eviction-policy-config
    tree: str = "unified"                    # "unified" (UnifiedRadixCache) or "classic" (RadixCache)
    overlap: bool = True                     # the overlap scheduler (SGLang's default)
    chunked_prefill_size: int = DEFAULT_CHUNKED_PREFILL  # -1 disables chunking
    finish: str = "length"                   # replies end by "length" or with a "stop" token
    max_new_tokens: int | None = None        # the client's max_tokens with finish="stop"
    eviction_amount: str = "shortfall"       # evict need - free (0.5.23) or the whole need (older)
    hicache: Any = None                      # the host cache (kvsim.tiers.hicache.HiCacheSettings), None: off

    def __post_init__(self) -> None:
        p = self.page_size
        if isinstance(p, bool) or not isinstance(p, int) or p < 1:
            raise ConfigError(f"page size must be a positive integer, got {p!r}")
        if self.capacity is not None and (self.capacity <= 0 or self.capacity % p):
            raise ConfigError(f"radix capacity must be a positive multiple of the page size, got {self.capacity}")
        policy = str(self.eviction_policy or "lru").lower()
        if policy not in POLICIES:
            raise ConfigError(f"unknown radix eviction policy {self.eviction_policy!r}; "
                              f"choose from {', '.join(POLICIES)}")
        object.__setattr__(self, "eviction_policy", policy)
        make_policy(policy, self.policy_config)   # bad parameters fail here
        if self.tree not in TREES:
            raise ConfigError(f"unknown radix tree {self.tree!r}; choose from {', '.join(TREES)}")
        if policy == "tlru" and self.tree != "unified":
            raise ConfigError("the tlru eviction policy needs the unified tree (SGLang refuses it otherwise)")
        chunk = self.chunked_prefill_size
        if chunk == 0 or chunk < -1:
            raise ConfigError(f"chunked prefill size must be positive or -1 (disabled), got {chunk}")
        if self.finish not in FINISHES:
            raise ConfigError(f"unknown finish {self.finish!r}; choose from {', '.join(FINISHES)}")
        if self.eviction_amount not in EVICTION_AMOUNTS:
            raise ConfigError(f"unknown eviction amount {self.eviction_amount!r}; "
                              f"choose from {', '.join(EVICTION_AMOUNTS)}")
        if self.max_new_tokens is not None and self.max_new_tokens < 0:
            raise ConfigError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.hicache is not None and self.tree != "unified":
            raise ConfigError("--offload hicache is built on the unified tree (SGLang 0.5.23's UnifiedRadixCache): "
                              "drop --radix-tree classic")

    @property
    def capacity_tokens(self) -> int | None:
        """Usable KV tokens (SGLang's max_total_num_tokens); None = unlimited."""
        return self.capacity

    @classmethod
    def from_options(cls, options: Any) -> "RadixSettings":
        """The settings a :class:`kvsim.engines.options.SimOptions` describes."""
        from kvsim.engines.offload import hicache_tier
        from kvsim.models import radix_max_total_tokens

        extra = options.extra or {}
        policy = str(options.eviction_policy or "lru").lower()
        if policy not in POLICIES:
            raise ConfigError(f"unknown radix eviction policy {options.eviction_policy!r}; "
                              f"choose from {', '.join(POLICIES)}")
        chunk = extra.get("chunked_prefill_size")
        cap = extra.get("max_new_tokens")
        return cls(
            page_size=int(options.page_size), capacity=radix_max_total_tokens(options), eviction_policy=policy,
            policy_config=policy_config(policy, extra), tree=str(extra.get("radix_tree", "unified")),
            overlap=bool(extra.get("overlap", True)),
            chunked_prefill_size=sglang_chunked_prefill_size(options.gpu) if chunk is None else int(chunk),
            finish=str(extra.get("finish", "length")), max_new_tokens=None if cap is None else int(cap),
            eviction_amount=str(extra.get("eviction_amount", "shortfall")),
            hicache=hicache_tier(options, radix_max_total_tokens(options), int(options.page_size)))
