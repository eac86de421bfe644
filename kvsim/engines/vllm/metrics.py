"""vLLM's prefix-cache hit-rate metrics (``docs/engines/apc.md §5``; vLLM ``v1/metrics/stats.py``).

``PrefixCacheStats`` collects one scheduler step's lookups; ``CachingMetrics`` is the
sliding window behind the log line "Prefix cache hit rate: X%" (the most recent 1000
requests, token-weighted: Σ hit tokens / Σ queried tokens).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass
class PrefixCacheStats:
    """One step's prefix-cache lookups, in tokens. Preempted requests are kept apart (0.20+)."""

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool = False) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
            return
        self.requests += 1
        self.queries += num_tokens
        self.hits += num_hits


class CachingMetrics:
    """Hit rate over the most recent ``max_recent_requests`` requests (vLLM ``CachingMetrics``)."""

    def __init__(self, max_recent_requests: int = 1000) -> None:
        self.max_recent_requests = max_recent_requests
        self.aggregated_requests = 0
        self.aggregated_query_total = 0
        self.aggregated_query_hit = 0
        self.query_queue: deque[tuple[int, int, int]] = deque()

    def observe(self, stats: PrefixCacheStats) -> None:
        """Add one step's stats; a reset clears the window first, empty steps are ignored."""
        if stats.reset:
            self.reset()
        if stats.requests == 0:
            return
        self.query_queue.append((stats.requests, stats.queries, stats.hits))
        self.aggregated_requests += stats.requests
        self.aggregated_query_total += stats.queries
        self.aggregated_query_hit += stats.hits
        # the newest entry is kept even if alone it exceeds the limit (§5.2)
        while len(self.query_queue) > 1 and self.aggregated_requests > self.max_recent_requests:
            r, q, h = self.query_queue.popleft()
            self.aggregated_requests -= r
            self.aggregated_query_total -= q
            self.aggregated_query_hit -= h

    def reset(self) -> None:
        self.aggregated_requests = 0
        self.aggregated_query_total = 0
        self.aggregated_query_hit = 0
        self.query_queue.clear()

    @property
    def empty(self) -> bool:
        return self.aggregated_requests == 0

    @property
    def hit_rate(self) -> float:
        if self.aggregated_query_total == 0:
            return 0.0
        return self.aggregated_query_hit / self.aggregated_query_total


def sequential_hit_rate_figures(queries: np.ndarray, hits: np.ndarray,
                                window: int = 1000) -> dict[str, float | int]:
    """vLLM's hit-rate figures for a sequential replay, where each step admits one request.

    ``queries``/``hits`` are the tokens of the requests that looked the cache up, in
    admission order. Returns the Prometheus counter totals and the windowed rate the log
    line would show after the last request (the last ``window`` one-request steps).
    """
    q_total, h_total = int(np.sum(queries)), int(np.sum(hits))
    q_win, h_win = int(np.sum(queries[-window:])), int(np.sum(hits[-window:]))
    return {
        "vllm_prefix_cache_queries": q_total,
        "vllm_prefix_cache_hits": h_total,
        "vllm_hit_rate_total": h_total / q_total if q_total else 0.0,
        "vllm_hit_rate_window": h_win / q_win if q_win else 0.0,
    }


def replay_report(settings, implementation: str, cache, work, cols) -> tuple[dict, dict, np.ndarray]:
    """A sequential replay's resolved configuration, its extra figures and, per request,
    whether it read the cache (prompt-logprob and rejected requests did not; §2.1)."""
    from kvsim.engines.vllm.rules import reads_cache

    read = ~cols.rejected & reads_cache(work.prompt_logprobs)
    tier = getattr(cache, "tier", None)
    local = cols.cached_tokens if tier is None else np.asarray(tier.gpu, np.int64)   # vLLM counts GPU hits
    figures = sequential_hit_rate_figures(work.prompt_lengths[read], local[read])
    config = {"block_size": settings.block_size, "num_gpu_blocks": settings.num_gpu_blocks,
              "capacity_tokens": settings.capacity_tokens, "hash_algo": settings.hash_algo,
              "engine_version": settings.profile.version}
    extra = {
        "engine": implementation,
        "num_gpu_blocks": settings.num_gpu_blocks,
        "block_size": settings.block_size,
        "hash_algo": settings.hash_algo,
        "engine_version": settings.profile.version,
        "peak_blocks_in_use": cache.peak_in_use_blocks,
        "evicted_blocks": int(cols.evictions.sum()),
        **figures,
    }
    if tier is not None:       # the offload tier (docs/engines/offload.md §1.12)
        config["offload"] = settings.offload.as_dict()
        extra["offload"] = cache.tier.run()
    return config, extra, read
