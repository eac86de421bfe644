"""Assemble a :class:`Trace` from the column chunks ("parts") the readers produce.

Readers never hold a list of per-request Python objects for a whole file: they emit parts of
a few thousand requests as numpy columns (or, for hash-id traces, the ids from which the
prompt tokens are synthesized at the end). Categorical values (tenant, salt, adapter,
session, role) are coded to small integers as they arrive.
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from kvsim.errors import ConfigError
from kvsim.io.trace.columns import NONE, Trace, TraceMeta

CATEGORIES = ("tenant", "cache_salt", "lora", "session")
#: how a request's output length was obtained (TraceMeta.notes counts the fallbacks)
OUT_LOGGED, OUT_KNOWN_IDS, OUT_MAX_TOKENS, OUT_DEFAULT = 0, 1, 2, 3


class Categories:
    """Strings to dense int32 codes, in order of first appearance."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.names: list[str] = []

    def code(self, value: str | None) -> int:
        if value is None or value == "":
            return NONE
        c = self.index.get(value)
        if c is None:
            c = self.index[value] = len(self.names)
            self.names.append(value)
        return c

    def codes(self, values: list[str | None]) -> list[int]:
        """The codes of several values (new ones numbered in order)."""
        get = self.index.get
        out = [get(v) for v in values]
        return out if None not in out else [self.code(v) for v in values]


class Synthesizer(Protocol):
    """Prompt tokens produced at build time (hash-id traces)."""

    def token_range(self) -> int:
        """How many distinct token values the synthesized tokens use: [base, base + range)."""

    def write(self, out: np.ndarray, base: int) -> None:
        """Fill ``out`` (this part's prompt tokens, concatenated) with values from ``base`` up."""


@dataclass
class Part:
    """A chunk of consecutive requests, as columns."""

    source: int                               # index of the input file
    prompt_lengths: np.ndarray                # int64 (n,)
    output_lengths: np.ndarray                # int64 (n,)
    arrival: np.ndarray                       # float64 (n,)
    tokens: np.ndarray | None = None          # concatenated prompt tokens, or
    synth: Synthesizer | None = None          # ... tokens synthesized at build time
    out_lengths: np.ndarray | None = None     # int64 (n,): known output ids per request
    out_tokens: np.ndarray | None = None
    out_known: np.ndarray | None = None       # bool (n,)
    out_source: np.ndarray | None = None      # int8 (n,): OUT_* codes
    out_mismatch: int = 0                     # logged length != number of known output ids
    codes: dict[str, np.ndarray] = field(default_factory=dict)  # CATEGORIES -> int32 (n,)
    prompt_logprobs: np.ndarray | None = None
    logprob_start_len: np.ndarray | None = None   # int64 (n,), -1 = none
    arrival_step: np.ndarray | None = None        # int64 (n,), -1 = none
    request_ids: list[str | None] | None = None
    msg_counts: np.ndarray | None = None      # int64 (n,)
    msg_starts: np.ndarray | None = None      # int64: token offset of each message in its prompt
    msg_roles: np.ndarray | None = None       # int32 role codes

    @property
    def n(self) -> int:
        return len(self.prompt_lengths)

    @property
    def length_only(self) -> bool:
        return self.tokens is None and self.synth is None


class TraceBuilder:
    """Collects parts in order and assembles the trace."""

    def __init__(self) -> None:
        self.categories = {name: Categories() for name in CATEGORIES}
        self.roles = Categories()
        self._parts: list[Part | Future] = []

    def add(self, part: Part | Future) -> None:
        """Append a part (or a future of one, e.g. being tokenized in a worker thread)."""
        self._parts.append(part)
        pending = [p for p in self._parts if isinstance(p, Future) and not p.done()]
        # bound the memory held by batches waiting for tokenization (four: with two, the chat
        # reader waited about 0.1 s for the tokenizing thread on a 48 MB log; docs/performance.md)
        if len(pending) > 4:
            pending[0].result()

    def parts(self) -> list[Part]:
        self._parts = [p.result() if isinstance(p, Future) else p for p in self._parts]
        return self._parts  # type: ignore[return-value]

    def requests_per_source(self, num_sources: int) -> list[int]:
        counts = [0] * num_sources
        for p in self.parts():
            counts[p.source] += p.n
        return counts

    def build(self, meta: TraceMeta, length_only: bool = False) -> Trace:
        """The trace; ``length_only`` when every source holds only lengths (tokens=None)."""
        parts = [p for p in self.parts() if p.n]
        n = sum(p.n for p in parts)
        lengths = _cat([p.prompt_lengths for p in parts], np.int64)
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        tokens = None if length_only else self._tokens(parts, offsets)
        out_lengths = _cat([p.out_lengths if p.out_lengths is not None else np.zeros(p.n, np.int64)
                            for p in parts], np.int64)
        out_offsets = np.zeros(n + 1, np.int64)
        np.cumsum(out_lengths, out=out_offsets[1:])
        out_tokens = _cat([p.out_tokens for p in parts if p.out_tokens is not None], np.int64)
        trace = Trace(
            offsets=offsets,
            tokens=tokens,
            output_lengths=_cat([p.output_lengths for p in parts], np.int64),
            arrival=_cat([p.arrival for p in parts], np.float64),
            output_offsets=out_offsets,
            output_tokens=_narrow(out_tokens),
            output_known=_cat([p.out_known if p.out_known is not None else np.zeros(p.n, bool)
                               for p in parts], bool),
            prompt_logprobs=_cat([p.prompt_logprobs if p.prompt_logprobs is not None
                                  else np.zeros(p.n, bool) for p in parts], bool),
            logprob_start_len=_cat([p.logprob_start_len if p.logprob_start_len is not None
                                    else np.full(p.n, -1, np.int64) for p in parts], np.int64),
            arrival_step=_cat([p.arrival_step if p.arrival_step is not None
                               else np.full(p.n, -1, np.int64) for p in parts], np.int64),
            request_ids=self._request_ids(parts, n),
            meta=meta,
            **self._categorical(parts),
            **self._messages(parts, n),
        )
        self._notes(parts, meta)
        return trace

    # -- columns ----------------------------------------------------------------------
    def _tokens(self, parts: list[Part], offsets: np.ndarray) -> np.ndarray | None:
        if any(p.length_only for p in parts):
            raise ConfigError("length-only traces (azure-csv) cannot be mixed with traces that carry tokens")
        real = [p.tokens for p in parts if p.tokens is not None and p.tokens.size]
        real_max = max((int(t.max()) for t in real), default=-1)
        # Synthesized tokens (hash-id traces) get their own value range above every real token.
        base = real_max + 1 if real else 0
        top = base + sum(p.synth.token_range() for p in parts if p.synth is not None)
        dtype = np.int32 if max(top, real_max + 1) <= 2**31 else np.int64
        if len(parts) == 1 and parts[0].tokens is not None:  # one part (a Parquet file): no copy
            return np.ascontiguousarray(parts[0].tokens, dtype)
        out = np.empty(int(offsets[-1]), dtype)
        i = 0
        for p in parts:
            a, b = int(offsets[i]), int(offsets[i + p.n])
            if p.tokens is not None:
                out[a:b] = p.tokens
                p.tokens = None  # free as we go
            else:
                assert p.synth is not None
                p.synth.write(out[a:b], base)
                base += p.synth.token_range()
            i += p.n
        return out

    def _categorical(self, parts: list[Part]) -> dict:
        cols: dict = {}
        names = {"tenant": "tenant_names", "cache_salt": "salt_names", "lora": "lora_names",
                 "session": "session_names"}
        for c in CATEGORIES:
            cols[c] = _cat([p.codes.get(c, np.full(p.n, NONE, np.int32)) for p in parts], np.int32)
            cols[names[c]] = list(self.categories[c].names)
        return cols

    def _request_ids(self, parts: list[Part], n: int) -> np.ndarray | None:
        if all(p.request_ids is None or all(r is None for r in p.request_ids) for p in parts):
            return None
        names: list[str] = []
        for p in parts:
            i = len(names)
            ids = p.request_ids or [None] * p.n
            names.extend(str(i + j) if r is None else r for j, r in enumerate(ids))
        out = np.empty(n, dtype=object)
        out[:] = names
        return out

    def _messages(self, parts: list[Part], n: int) -> dict:
        if all(p.msg_counts is None for p in parts):
            return {}
        counts = _cat([p.msg_counts if p.msg_counts is not None else np.zeros(p.n, np.int64)
                       for p in parts], np.int64)
        m_off = np.zeros(n + 1, np.int64)
        np.cumsum(counts, out=m_off[1:])
        return dict(
            msg_offsets=m_off,
            msg_starts=_cat([p.msg_starts for p in parts if p.msg_starts is not None], np.int64),
            msg_roles=_cat([p.msg_roles for p in parts if p.msg_roles is not None], np.int32),
            role_names=list(self.roles.names),
        )

    def _notes(self, parts: list[Part], meta: TraceMeta) -> None:
        src = _cat([p.out_source for p in parts if p.out_source is not None], np.int8)
        if src.size:
            n_max = int(np.sum(src == OUT_MAX_TOKENS))
            n_def = int(np.sum(src == OUT_DEFAULT))
            if n_max or n_def:
                meta.notes.append(
                    f"output length: {n_max} request(s) without a logged output length or reply used "
                    f"max_tokens; {n_def} had neither and count as 1 token")
        mismatch = sum(p.out_mismatch for p in parts)
        if mismatch:
            meta.notes.append(
                f"output length: {mismatch} request(s) log an output length that differs from the "
                "token count of their reply (+ end-of-turn) with this tokenizer; the logged length is used")


def _cat(arrays: list[np.ndarray], dtype) -> np.ndarray:
    if not arrays:
        return np.zeros(0, dtype)
    if len(arrays) == 1:
        return np.asarray(arrays[0], dtype)
    return np.concatenate(arrays).astype(dtype, copy=False)


def _narrow(tokens: np.ndarray) -> np.ndarray:
    from kvsim.io.trace.columns import narrow_tokens

    return narrow_tokens(tokens)
