"""The interface every cache model implements, so drivers, sweeps and gpu-validate treat
vLLM APC and SGLang RadixAttention alike.

A request's life in a sequential replay: ``admit`` (lookup + allocate its prefill),
``decode`` once per generated token after the first, then ``finish``. The block table in
an :class:`Admission` lists the physical KV pages (APC block ids, radix page/slot
indices) that hold the request's tokens, cached prefix first.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np


@dataclass
class Request:
    """One request as the cache sees it."""

    request_id: str
    prompt: np.ndarray                  # prompt token ids
    output: np.ndarray                  # token ids it will generate (logged or synthesized)
    lora: str | None = None             # LoRA adapter name (namespace)
    cache_salt: str | None = None       # tenant isolation salt (namespace)
    prompt_logprobs: bool = False       # vLLM: skip reading the cache, still write it
    logprob_start_len: int = -1         # SGLang: a logprob request's match cap (-1: none)
    num_generated: int = field(default=0)  # output tokens appended so far

    @property
    def tokens(self) -> np.ndarray:
        """Prompt plus the output tokens generated so far."""
        return np.concatenate([self.prompt, self.output[: self.num_generated]])


class Admission(NamedTuple):
    """Result of admitting a request: what was reused and where its KV lives."""

    cached_tokens: int                  # prompt tokens served from the cache
    block_table: np.ndarray             # physical page ids, in token order
    evicted_tokens: int                 # KV tokens evicted to make room
    evictions: int                      # eviction units (APC blocks, radix leaves)


class PrefixCache(ABC):
    """A prefix cache driven one request at a time, as the engine's scheduler drives it."""

    #: tokens per physical page (APC block size, radix page size)
    page_size: int

    @abstractmethod
    def admit(self, req: Request) -> Admission | None:
        """Look up the longest cached prefix and allocate the prefill; None if it cannot fit."""

    @abstractmethod
    def decode(self, req: Request) -> int:
        """Append the next output token to a running request; returns tokens evicted."""

    @abstractmethod
    def finish(self, req: Request) -> int:
        """Release a finished request (caching what the engine caches); returns tokens evicted."""

    @abstractmethod
    def used_tokens(self) -> int:
        """KV tokens currently held (in use or cached)."""
