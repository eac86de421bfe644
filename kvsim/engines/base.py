"""The interfaces every cache model implements, and their typed results.

:class:`SequentialCache` is what the replay driver runs: the reference model and the fast
engine of each design implement it, so one driver replays both designs with either
implementation. :class:`PrefixCache` adds the stepwise life of a request (``admit`` ->
``decode`` -> ``finish``, with block tables), which the reference models implement for
gpu-validate and the concurrent scheduler.

A request's block table (in an :class:`Admission`) lists the physical KV pages (APC block
ids, radix page/slot indices) that hold its tokens, cached prefix first.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

Progress = Callable[[int, int], Any]   # progress(done, total)


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


@dataclass(frozen=True)
class Workload:
    """A trace's requests as flat arrays, the input of a sequential replay.

    Request i's prompt is ``prompt_tokens[prompt_offsets[i]:prompt_offsets[i+1]]`` and the
    tokens it generates (at least one) ``output_tokens[output_offsets[i]:output_offsets[i+1]]``.
    """

    prompt_tokens: np.ndarray
    prompt_offsets: np.ndarray
    output_tokens: np.ndarray
    output_offsets: np.ndarray
    lora: list[str | None]
    cache_salt: list[str | None]
    prompt_logprobs: np.ndarray          # bool (n,)
    logprob_start_len: np.ndarray        # int64 (n,), -1 = none
    request_ids: list[str]

    def __len__(self) -> int:
        return len(self.prompt_offsets) - 1

    @property
    def prompt_lengths(self) -> np.ndarray:
        return np.diff(self.prompt_offsets)

    @property
    def output_lengths(self) -> np.ndarray:
        return np.diff(self.output_offsets)

    def request(self, i: int) -> Request:
        return Request(
            request_id=self.request_ids[i],
            prompt=np.asarray(self.prompt_tokens[self.prompt_offsets[i]:self.prompt_offsets[i + 1]], np.int64),
            output=self.output_tokens[self.output_offsets[i]:self.output_offsets[i + 1]],
            lora=self.lora[i], cache_salt=self.cache_salt[i],
            prompt_logprobs=bool(self.prompt_logprobs[i]), logprob_start_len=int(self.logprob_start_len[i]))

    def __iter__(self) -> Iterator[Request]:
        return (self.request(i) for i in range(len(self)))


class Served(NamedTuple):
    """What serving one request did."""

    cached_tokens: int        # prompt tokens served from the cache (the engine's own figure)
    rejected: bool            # the engine refused it (never fits, or an invalid request)
    evicted_tokens: int       # KV tokens evicted while serving it
    evictions: int            # eviction units: APC blocks, radix leaves
    max_new: int              # tokens it may generate (radix: clipped to the pool)
    extend_tokens: int        # prompt tokens prefilled (radix: SGLang's #new-token)


@dataclass(frozen=True)
class ServedColumns:
    """:class:`Served` for every request of a replay, as columns."""

    cached_tokens: np.ndarray
    rejected: np.ndarray
    evicted_tokens: np.ndarray
    evictions: np.ndarray
    max_new: np.ndarray
    extend_tokens: np.ndarray

    @classmethod
    def empty(cls, n: int) -> "ServedColumns":
        return cls(*(np.zeros(n, bool if name == "rejected" else np.int64) for name in Served._fields))

    def set(self, i: int, served: Served) -> None:
        self.cached_tokens[i], self.rejected[i], self.evicted_tokens[i], self.evictions[i], \
            self.max_new[i], self.extend_tokens[i] = served


class SequentialCache(ABC):
    """A cache model that serves requests one at a time, each from admission to finish."""

    #: the engine's typed settings (APCSettings, RadixSettings)
    settings: Any

    @abstractmethod
    def serve(self, req: Request) -> Served:
        """Admit, prefill, decode every token, finish: one request of a sequential replay."""

    def replay(self, work: Workload, progress: Progress | None = None) -> ServedColumns:
        """Serve every request of ``work`` in order; ``progress(done, total)`` now and then."""
        n = len(work)
        out = ServedColumns.empty(n)
        step = max(1, min(1024, n // 100 or 1))
        done = 0
        for i in range(n):
            out.set(i, self.serve_at(work, i))
            if progress is not None and i + 1 - done >= step:
                progress(i + 1, n)
                done = i + 1
        if progress is not None and n > done:
            progress(n, n)
        return out

    @classmethod
    def for_workload(cls, settings: Any, work: Workload) -> "SequentialCache":
        """The engine that will replay ``work`` (an engine may size an unlimited pool to it)."""
        return cls(settings)

    def serve_at(self, work: Workload, i: int) -> Served:
        """Serve request ``i`` of ``work`` (an engine may read the arrays directly)."""
        return self.serve(work.request(i))

    @property
    @abstractmethod
    def peak_used_tokens(self) -> int:
        """The most KV tokens held at once (in use or cached)."""


class Admission(NamedTuple):
    """Result of admitting a request: what was reused and where its KV lives."""

    cached_tokens: int                  # prompt tokens served from the cache
    block_table: np.ndarray             # physical page ids, in token order
    evicted_tokens: int                 # KV tokens evicted to make room
    evictions: int                      # eviction units (APC blocks, radix leaves)


class PrefixCache(SequentialCache):
    """A prefix cache driven one step at a time, as the engine's scheduler drives it."""

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

    @abstractmethod
    def block_table(self, req: Request) -> np.ndarray | None:
        """A running request's physical page ids, in token order (None: not running)."""


@dataclass
class StepResult:
    """Per-request outcome of a step replay; -1 marks "never happened" (e.g. rejected).

    ``cached_tokens`` is what the engine reports for the request: vLLM's
    ``num_cached_tokens`` (its first prefill's prefix-cache hit), SGLang's
    ``cached_tokens``. ``first_token_step`` is the step whose output holds the first
    output token, ``finish_step`` the step whose output finishes the request.
    """

    engine: str
    cached_tokens: np.ndarray
    first_token_step: np.ndarray
    finish_step: np.ndarray
    preemptions: np.ndarray
    rejected: np.ndarray
    output_tokens: np.ndarray | None = None         # tokens each request generated
    steps: int = 0                                  # scheduler steps taken (the clock at the end)
    finished: list = field(default_factory=list)    # request indices in the order they finished
    extra: dict = field(default_factory=dict)

    @classmethod
    def empty(cls, engine: str, n: int) -> StepResult:
        return cls(engine, np.full(n, -1, np.int64), np.full(n, -1, np.int64), np.full(n, -1, np.int64),
                   np.zeros(n, np.int64), np.zeros(n, bool), np.zeros(n, np.int64))


class EventReplica:
    """One replica of a sequential fleet whose cache records KV events for an event-fed router:
    ``serve_at`` one request, then ``drain()`` the blocks it stored and removed. Each engine's
    ``events.py`` subclasses it with how its model is built and serves."""

    implementation = "fast"        # which sequential implementation it replays (the report says it)

    def __init__(self, cache, settings, drain: Callable[[], list]) -> None:
        self.cache = cache
        self.settings = settings
        self.drain = drain

    def serve_at(self, work: "Workload", i: int) -> Served:
        return self.cache.serve_at(work, i)

    @property
    def peak_used_tokens(self) -> int:
        return self.cache.peak_used_tokens

    def report_cache(self):
        """What the engine's ``replay_report`` reads."""
        return self.cache
