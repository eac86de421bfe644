"""Sequential replay of a trace through vLLM APC (``--policy apc``, ``--concurrency 1``).

Each request is admitted (lookup + prefill), decoded to its output length and freed before
the next one starts, as a vLLM engine would serve requests sent one at a time. A request
that can never fit is reported as rejected and leaves the cache untouched (spec
``vllm_apc.md §1`` note). ``engine="fast"`` (default) runs the compiled engine;
``engine="reference"`` the readable model, which gives identical results, slowly.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kvsim.cache.apc import hashing
from kvsim.cache.apc.reference import APCCache
from kvsim.cache.apc.settings import APCSettings
from kvsim.cache.apc.metrics import sequential_hit_rate_figures
from kvsim.errors import ConfigError
from kvsim.io.trace import Trace
from kvsim.replay.options import SimOptions
from kvsim.replay.requests import iter_requests, output_token_arrays
from kvsim.replay.result import ReplayResult

ENGINES = ("fast", "reference")


def unlimited_num_blocks(blocks_needed: np.ndarray) -> int:
    """A pool so large nothing is ever evicted: every block any request takes, plus the null block."""
    return int(blocks_needed.sum()) + 1


@dataclass
class APCFinalState:
    """The pool after a replay, for comparisons with vLLM's own."""

    free_queue: list[int]        # free block ids, head (next victim) first
    map_keys: int                # distinct block hashes in the cache map
    cached_blocks: int           # blocks registered in the map


def replay_apc(trace: Trace, options: SimOptions, progress: Callable[[int, int], Any] | None = None,
               engine: str = "fast") -> ReplayResult:
    """Replay ``trace`` sequentially through vLLM APC; see :class:`ReplayResult`."""
    return _replay(trace, options, progress, engine)[0]


def replay_apc_detailed(trace: Trace, options: SimOptions, progress: Callable[[int, int], Any] | None = None,
                        engine: str = "fast") -> tuple[ReplayResult, APCFinalState]:
    """:func:`replay_apc`, plus the final state of the block pool."""
    result, final = _replay(trace, options, progress, engine)
    return result, final()


def _replay(trace: Trace, options: SimOptions, progress, engine: str):
    if engine not in ENGINES:
        raise ConfigError(f"unknown APC engine {engine!r}; choose one of {', '.join(ENGINES)}")
    settings = APCSettings.from_options(options)
    trace.require_tokens("the APC simulation")
    t0 = time.perf_counter()
    run = _replay_fast(trace, settings, progress) if engine == "fast" else \
        _replay_reference(trace, settings, progress)
    elapsed = time.perf_counter() - t0
    B = settings.block_size
    read = ~run["rejected"] & ~trace.prompt_logprobs.astype(bool)
    figures = sequential_hit_rate_figures(trace.prompt_lengths[read], run["cached"][read])
    extra = {
        "engine": engine,
        "num_gpu_blocks": settings.num_gpu_blocks,
        "block_size": B,
        "hash_algo": settings.hash_algo,
        "engine_version": settings.profile.version,
        "peak_blocks_in_use": run["peak_in_use"],
        "evicted_blocks": int(run["evicted"].sum()),
        **figures,
    }
    result = ReplayResult(
        policy="apc",
        config={"block_size": B, "num_gpu_blocks": settings.num_gpu_blocks,
                "capacity_tokens": settings.capacity_tokens, "hash_algo": settings.hash_algo,
                "engine_version": settings.profile.version},
        cached_tokens=run["cached"],
        rejected=run["rejected"],
        read_cache=read,
        evictions=run["evicted"],
        evicted_tokens=run["evicted"] * B,
        capacity_tokens=settings.capacity_tokens,
        peak_used_tokens=run["peak_used"] * B,
        elapsed_s=elapsed,
        extra=extra,
    )
    return result, run["final"]


def _namespaces(trace: Trace, settings: APCSettings) -> tuple[list, list]:
    lora = [trace.name_of("lora", int(c)) for c in trace.lora]
    lora = [None if n is None else (n, settings.lora_paths.get(n, n)) for n in lora]
    salt = [trace.name_of("cache_salt", int(c)) for c in trace.cache_salt]
    return lora, salt


def _replay_fast(trace: Trace, settings: APCSettings, progress) -> dict[str, Any]:
    from kvsim.cache.apc.fast import build_workload, replay_fast

    out, out_off = output_token_arrays(trace)
    lora, salt = _namespaces(trace, settings)
    work = build_workload(trace.tokens, trace.offsets, out, out_off, ~trace.prompt_logprobs.astype(bool),
                          lora, salt, settings.block_size, settings.hash_algo)
    n = settings.num_gpu_blocks
    if n is None:
        n = unlimited_num_blocks(np.where(work.prompt_len > 0, work.blocks_needed, 0))
    run = replay_fast(work, n, settings.profile.free_unhashed_to_head, progress)
    from kvsim.cache.apc.fast import ST_PEAK_IN_USE, ST_PEAK_USED

    def final() -> APCFinalState:
        chains = run.state.cached_blocks()
        return APCFinalState(run.state.free_queue(), len(chains), sum(map(len, chains.values())))

    return {"cached": run.cached_tokens, "rejected": run.rejected, "evicted": run.evictions,
            "peak_used": int(run.state.st[ST_PEAK_USED]), "peak_in_use": int(run.state.st[ST_PEAK_IN_USE]),
            "final": final}


def _replay_reference(trace: Trace, settings: APCSettings, progress) -> dict[str, Any]:
    n = len(trace)
    B = settings.block_size
    num_blocks = settings.num_gpu_blocks
    if num_blocks is None:
        L = trace.prompt_lengths
        M = np.maximum(trace.output_lengths, 1)
        num_blocks = unlimited_num_blocks(np.where(L > 0, -(-(L + M - 1) // B), 0))
    cache = APCCache(replace(settings, num_gpu_blocks=num_blocks))
    cached = np.zeros(n, np.int64)
    rejected = np.zeros(n, bool)
    evicted = np.zeros(n, np.int64)
    peak_in_use = 0
    for i, req in enumerate(iter_requests(trace)):
        if not cache.fits_ever(req):
            rejected[i] = True
            continue
        before = cache.pool.num_evicted
        admission = cache.admit(req)
        assert admission is not None, "a request that fits an idle cache was refused"
        for _ in range(len(req.output) - 1):
            cache.decode(req)
        peak_in_use = max(peak_in_use, math.ceil((len(req.prompt) + len(req.output) - 1) / B))
        cache.finish(req)
        cached[i] = admission.cached_tokens
        evicted[i] = cache.pool.num_evicted - before
        if progress is not None and (i + 1) % 1024 == 0:
            progress(i + 1, n)
    if progress is not None:
        progress(n, n)
    def final() -> APCFinalState:
        pool = cache.pool
        return APCFinalState(pool.free_block_ids(), len(pool.cached), pool.cached.num_blocks())

    return {"cached": cached, "rejected": rejected, "evicted": evicted,
            "peak_used": cache.pool.peak_used_blocks, "peak_in_use": peak_in_use, "final": final}
