"""What an offload tier did in one replay, the same for every backend: :class:`TierRun`.

Per request, the cached prompt tokens by where they came from (``gpu``, ``cpu``, ``disk``;
SGLang's device / host are ``gpu`` / ``cpu``); per run, per tier, the tokens stored,
loaded and evicted and the stores that found no room. :meth:`TierRun.summary` gives the
JSON-ready figures and the verdicts the terminal and the report print.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

TIERS = ("gpu", "cpu", "disk")
#: a tier that serves less than this share of the prompt tokens is "too small to matter"
SMALL_SHARE = 0.01


@dataclass
class TierRun:
    """An offload tier's per-request and per-run figures."""

    backend: str                              # native | lmcache | hicache
    description: str                          # the tier in a few words
    capacity_tokens: dict[str, int]           # tier -> tokens it holds
    by_tier: dict[str, np.ndarray]            # "gpu"/"cpu"/"disk" -> cached prompt tokens per request
    stored_tokens: dict[str, int]
    loaded_tokens: dict[str, int]
    evicted_tokens: dict[str, int]
    store_failures: dict[str, int]
    skipped_tokens: dict[str, int] = field(default_factory=dict)   # vLLM store_threshold
    bytes_per_token: int = 0                  # 0: no --model, bytes are not reported
    link_bytes_per_s: dict[str, float] = field(default_factory=dict)   # tier -> its link to the GPU

    def tiers(self) -> list[str]:
        return [t for t in TIERS if t in self.by_tier]

    def cached_by_tier(self, i: int) -> dict[str, int]:
        """Request ``i``'s cached tokens by tier (every tier of the run, zeros included)."""
        return {t: int(self.by_tier[t][i]) for t in self.tiers()}

    def summary(self, prompt_tokens: np.ndarray, counted: np.ndarray) -> dict[str, Any]:
        """Per-tier hits and hit rates over the counted requests, and the run's transfers."""
        prompt = int(np.asarray(prompt_tokens)[counted].sum())
        per = self.bytes_per_token
        tiers: dict[str, Any] = {}
        for t in self.tiers():
            col = np.asarray(self.by_tier[t])[counted]
            row: dict[str, Any] = {"hit_tokens": int(col.sum()), "hit_requests": int((col > 0).sum()),
                                   "hit_rate": int(col.sum()) / prompt if prompt else 0.0}
            if t != "gpu":
                row.update(capacity_tokens=self.capacity_tokens.get(t), stored_tokens=self.stored_tokens.get(t, 0),
                           loaded_tokens=self.loaded_tokens.get(t, 0), evicted_tokens=self.evicted_tokens.get(t, 0),
                           store_failures=self.store_failures.get(t, 0))
                if t in self.skipped_tokens:
                    row["skipped_by_threshold_tokens"] = self.skipped_tokens[t]
                if per:
                    row.update(stored_bytes=row["stored_tokens"] * per, loaded_bytes=row["loaded_tokens"] * per)
            tiers[t] = row
        offloaded = sum(tiers[t]["hit_tokens"] for t in tiers if t != "gpu")
        notes = []
        if prompt and offloaded / prompt < SMALL_SHARE:
            notes.append(f"the {self.backend} tier serves {offloaded / prompt:.2%} of the prompt tokens: too small "
                         "(or the GPU holds the reuse already) to matter on this log")
        return {"backend": self.backend, "description": self.description, "bytes_per_token": per or None,
                "offloaded_hit_tokens": offloaded, "offloaded_hit_rate": offloaded / prompt if prompt else 0.0,
                "tiers": tiers, "notes": notes}

    def transfer_costs(self, recompute, counted: np.ndarray) -> dict[str, Any] | None:
        """Loading against recomputing, per request over the counted ones: a load takes its bytes
        over each tier's link; recomputing the same tokens after the GPU prefix takes
        ``recompute(new_tokens, context)`` seconds (the roofline, or a calibration). None
        without the bytes (no --model)."""
        if not self.bytes_per_token or not self.link_bytes_per_s:
            return None
        gpu = np.asarray(self.by_tier["gpu"])
        load = np.zeros(len(gpu))
        loaded = np.zeros(len(gpu), np.int64)
        for t in self.tiers():
            if t != "gpu":
                col = np.asarray(self.by_tier[t])
                load += col * self.bytes_per_token / self.link_bytes_per_s[t]
                loaded += col
        idx = np.nonzero(np.asarray(counted, bool) & (loaded > 0))[0]
        again = np.array([recompute([int(loaded[i])], [int(gpu[i])]) for i in idx])
        worse = int((load[idx] > again).sum()) if len(idx) else 0
        out = {"requests_loading": len(idx), "load_seconds": float(load[idx].sum()),
               "recompute_seconds": float(again.sum()) if len(idx) else 0.0, "loads_slower_than_recompute": worse}
        if len(idx) and out["load_seconds"] > out["recompute_seconds"]:
            out["note"] = (f"loading from the tier takes {out['load_seconds']:.3g} s against {out['recompute_seconds']:.3g} s "
                           "to recompute the same tokens: the loads cost more than recompute on this GPU and link")
        elif worse:
            out["note"] = f"{worse:,} of {len(idx):,} loads take longer than recomputing their tokens"
        return out
