"""vLLM APC behind ``kvsim serve``: the reference model with the settings ``simulate`` resolves.

:class:`~kvsim.engines.vllm.sequential.APCReference`: ``fits_ever`` (else rejected, cache
untouched), ``admit`` -> ``decode`` x (M - 1) -> ``finish`` (as its ``serve``);
``implementation="fast"`` makes the M - 1 decode steps one call (``decode_rest``).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from kvsim.engines.base import Request
from kvsim.engines.options import SimOptions
from kvsim.engines.serving import EngineState, Served, ServeEngine

#: blocks an unlimited APC pool starts with; it doubles whenever a request could evict
_INITIAL_UNLIMITED_BLOCKS = 1024


class ApcServeEngine(ServeEngine):
    """vLLM APC serving one request at a time."""

    policy = "apc"
    family = "vllm"
    sequential = "kvsim.engines.vllm.sequential:APCReference"

    def __init__(self, options: SimOptions, implementation: str = "fast") -> None:
        from kvsim.engines.spec import load
        from kvsim.engines.vllm.settings import APCSettings

        model = load(self.sequential)
        s = self._settings = APCSettings.from_options(options)
        self.capacity_tokens = s.capacity_tokens
        self._unlimited = s.num_gpu_blocks is None
        blocks = _INITIAL_UNLIMITED_BLOCKS if self._unlimited else s.num_gpu_blocks
        self._make = lambda: model(replace(s, num_gpu_blocks=blocks))
        self.cache = self._make()
        self._step_by_step = implementation == "reference"

    def serve(self, request_id, prompt, output, lora=None, cache_salt=None, prompt_logprobs=False,
              logprob_start_len=-1) -> Served:
        cache = self.cache
        req = Request(request_id, np.asarray(prompt, np.int64), np.asarray(output, np.int64), lora=lora,
                      cache_salt=cache_salt, prompt_logprobs=prompt_logprobs)
        if self._unlimited:
            cache.pool.grow_before_evicting(cache.blocks_needed(req))
        served = cache.serve(req, step_by_step=self._step_by_step)
        if served.rejected:           # docs/engines/apc.md §1 note: never schedulable
            return Served(0, 0, True, 0, 0)
        return Served(served.cached_tokens, len(req.output), False, served.evicted_tokens, served.extend_tokens)

    def reset(self) -> bool:
        return self.cache.manager.reset_prefix_cache()

    def state(self) -> EngineState:
        pool = self.cache.pool
        B = self.cache.page_size
        free_cached = pool.num_free_blocks - (pool.num_blocks - 1 - pool.used_blocks)
        return EngineState(
            prefix_queries=self.cache.queries, prefix_hits=self.cache.hits, held_tokens=pool.used_blocks * B,
            capacity_tokens=self.capacity_tokens,
            available_tokens=None if self._unlimited else (pool.num_blocks - 1 - pool.used_blocks) * B,
            evictable_tokens=free_cached * B, usage=0.0 if self._unlimited else pool.usage())

    def max_request_tokens(self) -> int | None:
        # the peak ceil((L + M - 1) / B) blocks fit in num_gpu_blocks - 1 when L + M <= that many tokens
        return self.capacity_tokens

    def settings(self) -> dict[str, Any]:
        s = self._settings
        return {"block_size": s.block_size, "num_gpu_blocks": s.num_gpu_blocks,
                "capacity_tokens": s.capacity_tokens, "hash_algo": s.hash_algo,
                "engine_version": s.profile.version}
