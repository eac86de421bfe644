"""What a replay returns: per-request columns plus a few totals, the same for every policy."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class ReplayResult:
    """Outcome of replaying a trace through one cache model.

    ``cached_tokens[i]`` is the engine's own per-request figure: vLLM's
    ``num_cached_tokens`` / SGLang's ``cached_tokens``, i.e. prompt tokens served from the
    cache at the request's first admission.
    """

    policy: str                       # "apc" or "radix"
    config: dict[str, Any]            # resolved settings (block/page size, capacity, ...)
    cached_tokens: np.ndarray         # int64 (n,)
    rejected: np.ndarray              # bool (n,): can never fit in the cache (engine refuses it)
    read_cache: np.ndarray            # bool (n,): False where a logprob request skipped the lookup
                                      # (APC; also False for rejected requests) or capped it (radix)
    evictions: np.ndarray             # int64 (n,): eviction units (APC blocks, radix leaves) while serving i
    evicted_tokens: np.ndarray        # int64 (n,): tokens of KV evicted while serving i
    capacity_tokens: int | None       # usable KV capacity in tokens; None = unlimited
    peak_used_tokens: int             # most KV tokens ever held (cached or in use)
    elapsed_s: float = 0.0            # wall time of the replay itself
    extra: dict[str, Any] = field(default_factory=dict)  # policy-specific (tree stats, ...)
    measured: np.ndarray | None = None  # bool (n,): requests counted (None: all; see kvsim.warmup)

    def __post_init__(self) -> None:
        self.cached_tokens = np.asarray(self.cached_tokens, np.int64)
        self.rejected = np.asarray(self.rejected, bool)
        self.read_cache = np.asarray(self.read_cache, bool)
        self.evictions = np.asarray(self.evictions, np.int64)
        self.evicted_tokens = np.asarray(self.evicted_tokens, np.int64)

    def __len__(self) -> int:
        return len(self.cached_tokens)
