"""The cache model behind ``kvsim serve``: the one place serve builds and drives an engine.

Each request goes through the engine exactly as the sequential replay of
``kvsim simulate`` serves it, so a recorded log replayed by ``simulate`` gives the same
``cached_tokens`` request for request:

* ``apc`` — vLLM 0.33 APC, the reference model :class:`kvsim.engines.vllm.sequential.APCReference`
  with the settings :meth:`APCSettings.from_options` resolves: ``fits_ever`` (else
  rejected, cache untouched), ``admit`` → ``decode`` × (M − 1) → ``finish`` (as its
  ``serve``); ``implementation="fast"`` makes the M − 1 decode steps one call
  (:meth:`APCReference.decode_rest`).
* ``radix`` — SGLang 0.5.23 RadixAttention with :meth:`RadixSettings.from_options`, one
  ``serve`` call per request: the fast engine :class:`kvsim.engines.sglang.sequential.RadixFast`
  (``implementation="fast"``, what ``simulate`` runs) or the reference model
  :class:`kvsim.engines.sglang.sequential.RadixReference`.

Requests reach the engine one at a time, in the order the server applies them (see
:mod:`kvsim.serve.service`); there is no notion of time yet.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsim.engines.base import Request
from kvsim.errors import ConfigError
from kvsim.engines.options import SimOptions

POLICIES = ("apc", "radix")
IMPLEMENTATIONS = ("fast", "reference")
#: blocks an unlimited APC pool starts with; it doubles whenever a request could evict
_INITIAL_UNLIMITED_BLOCKS = 1024


@dataclass(frozen=True)
class Served:
    """What the engine did with one request."""

    cached_tokens: int        # prompt tokens served from the cache (the engine's own figure)
    generated: int            # output tokens generated (SGLang clips a reply to the empty pool)
    rejected: bool            # cannot fit even an empty cache: refused, cache untouched
    evicted_tokens: int       # KV tokens evicted while serving it
    computed_tokens: int      # prompt tokens computed in prefill (SGLang's #new-token)


@dataclass(frozen=True)
class EngineState:
    """The engine between requests, for ``/metrics``."""

    prefix_queries: int       # vLLM prefix_cache_queries (tokens; APC only)
    prefix_hits: int          # vLLM prefix_cache_hits (tokens; APC only)
    held_tokens: int          # KV tokens held: in use or cached
    capacity_tokens: int | None
    available_tokens: int | None   # free slots holding nothing (SGLang kv_available_tokens)
    evictable_tokens: int | None   # cached and unlocked (SGLang kv_evictable_tokens)
    usage: float              # vLLM kv_cache_usage_perc / SGLang token_usage


class ServeEngine(ABC):
    """A prefix cache serving one request at a time."""

    policy: str
    capacity_tokens: int | None

    @abstractmethod
    def serve(self, request_id: str, prompt: np.ndarray, output: np.ndarray, lora: str | None = None,
              cache_salt: str | None = None, prompt_logprobs: bool = False, logprob_start_len: int = -1) -> Served:
        """Admit, decode every output token, finish; ``output`` holds at least one token.
        ``prompt_logprobs``: vLLM skips reading the cache; ``logprob_start_len`` (-1: none):
        SGLang caps the match there and refuses a start past the prompt."""

    @abstractmethod
    def reset(self) -> bool:
        """Forget every cached prefix (vLLM ``reset_prefix_cache``, SGLang ``flush_cache``)."""

    @abstractmethod
    def state(self) -> EngineState:
        ...

    @abstractmethod
    def max_request_tokens(self) -> int | None:
        """The longest prompt + output an idle cache always admits whole (None: unlimited)."""

    @abstractmethod
    def settings(self) -> dict[str, Any]:
        """Resolved settings, as ``kvsim simulate --json`` reports them."""


class _ApcEngine(ServeEngine):
    policy = "apc"

    def __init__(self, options: SimOptions, implementation: str = "fast") -> None:
        from dataclasses import replace

        from kvsim.engines.vllm.sequential import APCReference
        from kvsim.engines.vllm.settings import APCSettings

        s = self._settings = APCSettings.from_options(options)
        self.capacity_tokens = s.capacity_tokens
        self._unlimited = s.num_gpu_blocks is None
        blocks = _INITIAL_UNLIMITED_BLOCKS if self._unlimited else s.num_gpu_blocks
        self._make = lambda: APCReference(replace(s, num_gpu_blocks=blocks))
        self.cache = self._make()
        self._step_by_step = implementation == "reference"

    def serve(self, request_id, prompt, output, lora=None, cache_salt=None, prompt_logprobs=False,
              logprob_start_len=-1) -> Served:
        cache = self.cache
        req = Request(request_id, np.asarray(prompt, np.int64), np.asarray(output, np.int64), lora=lora,
                      cache_salt=cache_salt, prompt_logprobs=prompt_logprobs)
        if self._unlimited:
            self._ensure_no_eviction(cache.blocks_needed(req))
        if not cache.fits_ever(req):  # docs/engines/apc.md §1 note: never schedulable
            return Served(0, 0, True, 0, 0)
        before = cache.pool.num_evicted
        admission = cache.admit(req)
        assert admission is not None, "a request that fits an idle cache was refused"
        if self._step_by_step:
            for _ in range(len(req.output) - 1):
                cache.decode(req)
        else:
            cache.decode_rest(req)   # the same final pool, without a Python step per token
        cache.finish(req)
        evicted = (cache.pool.num_evicted - before) * cache.page_size
        return Served(admission.cached_tokens, len(req.output), False, evicted,
                      len(req.prompt) - admission.cached_tokens)

    def _ensure_no_eviction(self, need: int) -> None:
        """Unlimited capacity, as ``simulate`` models it: a pool so large that nothing is ever
        evicted. ``simulate`` sizes it for the whole trace up front; a server cannot, so the
        pool grows (fresh blocks at the head of the free queue) whenever one of the ``need``
        blocks a request may pop would hold a cached hash. Which block ids are used differs
        from ``simulate``; which prefixes are cached, and so every hit, does not."""
        pool = self.cache.pool
        head = []
        for block_id in pool.free_queue:
            if len(head) == need:
                break
            head.append(block_id)
        if len(head) == need and all(pool.blocks[b].block_hash is None for b in head):
            return
        pool.add_free_blocks(max(need, pool.num_blocks))

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


class _RadixEngine(ServeEngine):
    policy = "radix"

    def __init__(self, options: SimOptions, implementation: str = "fast") -> None:
        from kvsim.engines.sglang.sequential import RadixFast
        from kvsim.engines.sglang.sequential import RadixReference
        from kvsim.engines.sglang.settings import RadixSettings

        s = self._settings = RadixSettings.from_options(options)
        self.capacity_tokens = s.capacity
        self._fast = implementation == "fast"
        self._make = lambda: (RadixFast if self._fast else RadixReference)(s)
        self.model = self._make()

    def serve(self, request_id, prompt, output, lora=None, cache_salt=None, prompt_logprobs=False,
              logprob_start_len=-1) -> Served:
        from kvsim.engines.sglang.rules import namespace

        prompt, output = np.asarray(prompt, np.int64), np.asarray(output, np.int64)
        if self._fast:
            o = self.model.serve_tokens(prompt, output, namespace(lora, cache_salt), logprob_start_len)
        else:
            o = self.model.serve(Request(request_id, prompt, output, lora=lora, cache_salt=cache_salt,
                                         prompt_logprobs=prompt_logprobs, logprob_start_len=logprob_start_len))
        if o.rejected:
            return Served(0, 0, True, o.evicted_tokens, 0)
        generated = min(len(output), max(o.max_new, 1))  # RadixReference.new_state
        return Served(o.cached_tokens, generated, False, o.evicted_tokens, o.extend_tokens)

    def reset(self) -> bool:
        if not self._fast and self.model.active:
            return False
        self.model = self._make()  # SGLang flush_cache: a fresh tree and allocator when idle
        return True

    def state(self) -> EngineState:
        m = self.model
        cap = self.capacity_tokens
        held, available, evictable = m.used_tokens(), m.available(), m.evictable
        available = None if cap is None else int(available)
        usage = 0.0 if cap is None else (cap - available - int(evictable)) / cap
        return EngineState(prefix_queries=0, prefix_hits=0, held_tokens=int(held), capacity_tokens=cap,
                           available_tokens=available, evictable_tokens=int(evictable), usage=usage)

    def max_request_tokens(self) -> int | None:
        # SGLang admits when extend + min(M, 4096) + page < free + evictable and clips M to
        # capacity - ceil_page(L) - page - 1 (radix/rules.py admits, max_new_tokens_for_memory): both hold
        # in an idle cache for every L + M <= capacity - 2 * page.
        if self.capacity_tokens is None:
            return None
        return self.capacity_tokens - 2 * self._settings.page_size

    def settings(self) -> dict[str, Any]:
        s = self._settings
        return {"page_size": s.page_size, "max_total_tokens": s.capacity, "eviction_policy": s.eviction_policy,
                "radix_tree": s.tree, "overlap": s.overlap, "chunked_prefill_size": s.chunked_prefill_size,
                "finish": s.finish}


def build_engine(policy: str, options: SimOptions, implementation: str = "fast") -> ServeEngine:
    """The engine of ``policy`` with the settings ``simulate`` would use for ``options``;
    ``implementation="reference"`` drives the readable models step by step (same answers, slower)."""
    if implementation not in IMPLEMENTATIONS:
        raise ConfigError(f"unknown implementation {implementation!r}; choose fast or reference")
    if policy == "apc":
        return _ApcEngine(options, implementation)
    if policy == "radix":
        return _RadixEngine(options, implementation)
    raise ConfigError(f"unknown policy {policy!r} for serve; choose apc or radix")
