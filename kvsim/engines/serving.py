"""The model behind ``kvsim serve``: what a served request did, and the adapter each engine provides.

Each request goes through the engine exactly as the sequential replay of ``kvsim simulate``
serves it, so a recorded log replayed by ``simulate`` gives the same ``cached_tokens``
request for request. Requests reach the engine one at a time, in the order the server
applies them (see :mod:`kvsim.serve.service`); there is no notion of time here. Each
engine's adapter (:meth:`kvsim.engines.spec.EngineSpec.serve_adapter`) implements
:class:`ServeEngine`.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np


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
    family: str               # vllm | sglang: whose metrics and request rules
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

    def refuses(self, prompt_len: int, logprob_start_len: int) -> bool:
        """Does the engine refuse this request outright (HTTP 400)? Default: never."""
        return False

    @abstractmethod
    def settings(self) -> dict[str, Any]:
        """Resolved settings, as ``kvsim simulate --json`` reports them."""
