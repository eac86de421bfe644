"""Turn parsed text/token requests into a column :class:`Part`, tokenizing in bulk.

A chat prompt is rendered by the template first (the reader does that) and tokenized as one
text, special tokens as single ids, the way the engine does. A logged reply becomes the
tokens the engine generated: the reply's tokens followed by the template's end-of-turn
token, so that the next turn's history (which contains the reply and that token) lines up
with prompt + output token for token.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np

from kvsim.io.trace.builder import OUT_DEFAULT, OUT_KNOWN_IDS, OUT_LOGGED, OUT_MAX_TOKENS, Part
from kvsim.io.tokenize.pieces import PieceEncoder
from kvsim.io.tokenize.templates import RenderedPieces
from kvsim.io.tokenize.tokenizers import Tokenizer
from kvsim.io.trace.columns import NONE, narrow_tokens

if TYPE_CHECKING:
    from kvsim.io.tokenize.message_tokens import MessageTokens, PieceRefs, Plan


class Packed(NamedTuple):
    """A batch's prompts assembled into one array (what :class:`MessageTokens` gives when
    every prompt of the batch is made of its pieces): each prompt's length, its message
    count and the token offset of each message in its prompt."""

    tokens: np.ndarray
    lengths: np.ndarray     # int64, one per prompt
    msg_counts: np.ndarray  # int64, one per prompt
    msg_starts: np.ndarray  # int64, one per message


@dataclass(slots=True)
class PendingRequest:
    """One request as parsed from a record, before tokenization."""

    prompt_text: str | None = None            # text to tokenize, or
    prompt_pieces: RenderedPieces | PieceRefs | None = None  # ... a chat prompt in pieces, or
    prompt_ids: np.ndarray | None = None      # ... token ids given by the log
    msg_chars: list[int] | None = None        # character offset where each message starts
    msg_roles: list[int] | None = None        # role codes
    reply: str | None = None                  # logged reply text
    reply_eot: bool = False                   # append the template's end-of-turn token to the reply
    output_ids: np.ndarray | None = None      # logged output ids
    logged_output: int | None = None
    max_tokens: int | None = None
    arrival: float = math.nan
    tenant: int = NONE
    cache_salt: int = NONE
    lora: int = NONE
    session: int = NONE
    request_id: str | None = None
    prompt_logprobs: bool = False
    logprob_start_len: int = -1
    arrival_step: int = -1

    @property
    def weight(self) -> int:
        """Rough size, to bound a batch's memory."""
        if self.prompt_text is not None:
            n = len(self.prompt_text)
        elif self.prompt_pieces is not None:
            n = self.prompt_pieces.weight
        else:
            n = 4 * len(self.prompt_ids)
        return n + (len(self.reply) if self.reply else 0)


def plan_requests(batch: Sequence[PendingRequest], pieces: PieceEncoder | MessageTokens | None,
                  last: bool = False) -> Plan | None:
    """On the reading thread, once a batch is complete: start the tokenization its prompts in
    pieces need, when ``pieces`` plans ahead (:class:`MessageTokens`); give the plan to
    :func:`encode_requests`. None when there is nothing to plan. ``last``: no batch follows
    (the reading thread is done, so tokenization may take every core)."""
    if not hasattr(pieces, "plan"):
        return None
    prompts = [r.prompt_pieces for r in batch if r.prompt_pieces is not None]
    if not prompts:
        return None
    return pieces.plan(prompts, [r.reply for r in batch if r.output_ids is None and r.reply is not None], last)


def encode_requests(batch: Sequence[PendingRequest], source: int, tok: Tokenizer | None,
                    eot_id: int | None, pieces: PieceEncoder | MessageTokens | None = None,
                    plan: Plan | None = None) -> Part:
    """Tokenize a batch of requests (in bulk) and return it as columns (``plan``: what
    :func:`plan_requests` started for it)."""
    n = len(batch)
    prompts: list = [r.prompt_ids for r in batch]
    msg_token_starts: list[list[int] | None] = [None] * n
    chat = [i for i, r in enumerate(batch) if r.prompt_text is not None and r.msg_chars is not None]
    text = [i for i, r in enumerate(batch) if r.prompt_text is not None and r.msg_chars is None]
    piecewise = [i for i, r in enumerate(batch) if r.prompt_pieces is not None]
    if chat or text or piecewise or any(r.reply is not None for r in batch):
        assert tok is not None, "text requests need a tokenizer"
    if chat:
        ids, starts = tok.encode_with_starts([batch[i].prompt_text for i in chat],
                                             [batch[i].msg_chars for i in chat])
        for i, a, s in zip(chat, ids, starts):
            prompts[i], msg_token_starts[i] = a, s
    replies = [i for i, r in enumerate(batch) if r.output_ids is None and r.reply is not None]
    encoded_replies = None
    packed = None
    if piecewise:
        assert pieces is not None, "prompts rendered in pieces need a PieceEncoder"
        # a plan comes from MessageTokens, which can give the whole batch as one array
        extra: dict = {} if plan is None else {"plan": plan, "pack": len(piecewise) == n}
        ids, starts, encoded_replies = pieces.encode([batch[i].prompt_pieces for i in piecewise],
                                                     [batch[i].reply for i in replies], **extra)
        if isinstance(ids, Packed):  # every prompt of the batch, already in one array
            packed = ids
        else:
            for i, a, s in zip(piecewise, ids, starts):
                prompts[i], msg_token_starts[i] = a, s
    if text:
        for i, a in zip(text, tok.encode_batch([batch[i].prompt_text for i in text])):
            prompts[i] = a
    if packed is not None:
        lengths, tokens = packed.lengths, narrow_tokens(packed.tokens)
    else:
        lengths = np.fromiter((len(p) for p in prompts), np.int64, count=n)
        tokens = narrow_tokens(_concat(prompts, int(lengths.sum())))

    (arrival, tenant, salt, lora, session, prompt_logprobs, logprob_start_len, arrival_step, logged, max_tokens,
     request_ids, outputs) = (list(c) for c in zip(*map(_COLUMNS, batch))) if n else ([] for _ in range(12))
    if replies:
        encoded = (encoded_replies if encoded_replies is not None
                   else tok.encode_arrays([batch[i].reply for i in replies]))
        eot = None if eot_id is None else np.array([eot_id], np.int32 if eot_id < 2**31 else np.int64)
        for i, a in zip(replies, encoded):
            outputs[i] = (a, eot) if eot is not None and batch[i].reply_eot else a  # joined below
    known = [o is not None for o in outputs]
    out_lengths = [0 if o is None else len(o) if type(o) is not tuple else len(o[0]) + 1 for o in outputs]
    out_tokens = _concat([*chain.from_iterable(o if type(o) is tuple else (o,) for o in outputs if o is not None)],
                         sum(out_lengths))

    output_lengths, out_source = [], []
    mismatch = 0
    for logged_n, is_known, known_n, max_n in zip(logged, known, out_lengths, max_tokens):
        if logged_n is not None:
            output_lengths.append(logged_n)
            out_source.append(OUT_LOGGED)
            mismatch += is_known and known_n != logged_n
        elif is_known:
            output_lengths.append(known_n)
            out_source.append(OUT_KNOWN_IDS)
        elif max_n is not None:
            output_lengths.append(max_n)
            out_source.append(OUT_MAX_TOKENS)
        else:
            output_lengths.append(1)
            out_source.append(OUT_DEFAULT)

    part = Part(
        source=source,
        prompt_lengths=lengths,
        output_lengths=np.array(output_lengths, np.int64),
        arrival=np.array(arrival, np.float64),
        tokens=tokens,
        out_lengths=np.array(out_lengths, np.int64),
        out_tokens=narrow_tokens(out_tokens),
        out_known=np.array(known, bool),
        out_source=np.array(out_source, np.int8),
        out_mismatch=mismatch,
        codes={"tenant": np.array(tenant, np.int32), "cache_salt": np.array(salt, np.int32),
               "lora": np.array(lora, np.int32), "session": np.array(session, np.int32)},
        prompt_logprobs=np.array(prompt_logprobs, bool),
        logprob_start_len=np.array(logprob_start_len, np.int64),
        arrival_step=np.array(arrival_step, np.int64),
        request_ids=request_ids if any(r is not None for r in request_ids) else None,
    )
    if packed is not None:
        part.msg_counts, part.msg_starts = packed.msg_counts, packed.msg_starts
        part.msg_roles = np.fromiter(chain.from_iterable(r.msg_roles for r in batch), np.int32,
                                     count=int(packed.msg_counts.sum()))
    elif chat or piecewise:
        counts = np.fromiter((0 if s is None else len(s) for s in msg_token_starts), np.int64, count=n)
        part.msg_counts = counts
        part.msg_starts = np.fromiter(chain.from_iterable(s for s in msg_token_starts if s is not None),
                                      np.int64, count=int(counts.sum()))
        part.msg_roles = np.fromiter(chain.from_iterable(r.msg_roles for r, s in zip(batch, msg_token_starts)
                                                         if s is not None), np.int32, count=int(counts.sum()))
    return part


#: what encode_requests takes of each request, in one pass
_COLUMNS = attrgetter("arrival", "tenant", "cache_salt", "lora", "session", "prompt_logprobs", "logprob_start_len",
                      "arrival_step", "logged_output", "max_tokens", "request_id", "output_ids")


def _concat(seqs: list, total: int) -> np.ndarray:
    """Concatenate lists of ints and integer arrays into one array (int64, or the arrays'
    common integer type)."""
    if all(isinstance(s, list) for s in seqs):
        return np.fromiter(chain.from_iterable(seqs), np.int64, count=total)
    arrays = [s if isinstance(s, np.ndarray) else np.asarray(s, np.int64) for s in seqs]
    return np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
