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

    outputs: list = [r.output_ids for r in batch]
    if replies:
        encoded = (encoded_replies if encoded_replies is not None
                   else tok.encode_arrays([batch[i].reply for i in replies]))
        eot = None if eot_id is None else np.array([eot_id], np.int64)
        for i, a in zip(replies, encoded):
            outputs[i] = (a, eot) if eot is not None and batch[i].reply_eot else a  # joined below
    known = np.fromiter((o is not None for o in outputs), bool, count=n)
    out_lengths = np.fromiter((0 if o is None else len(o) if type(o) is not tuple else len(o[0]) + 1
                               for o in outputs), np.int64, count=n)
    out_tokens = _concat([*chain.from_iterable(o if type(o) is tuple else (o,) for o in outputs if o is not None)],
                         int(out_lengths.sum()))

    output_lengths = np.empty(n, np.int64)
    out_source = np.empty(n, np.int8)
    mismatch = 0
    for i, r in enumerate(batch):
        if r.logged_output is not None:
            output_lengths[i], out_source[i] = r.logged_output, OUT_LOGGED
            mismatch += bool(known[i] and out_lengths[i] != r.logged_output)
        elif known[i]:
            output_lengths[i], out_source[i] = out_lengths[i], OUT_KNOWN_IDS
        elif r.max_tokens is not None:
            output_lengths[i], out_source[i] = r.max_tokens, OUT_MAX_TOKENS
        else:
            output_lengths[i], out_source[i] = 1, OUT_DEFAULT

    part = Part(
        source=source,
        prompt_lengths=lengths,
        output_lengths=output_lengths,
        arrival=np.fromiter((r.arrival for r in batch), np.float64, count=n),
        tokens=tokens,
        out_lengths=out_lengths,
        out_tokens=narrow_tokens(out_tokens),
        out_known=known,
        out_source=out_source,
        out_mismatch=mismatch,
        codes={c: np.fromiter((getattr(r, c) for r in batch), np.int32, count=n)
               for c in ("tenant", "cache_salt", "lora", "session")},
        prompt_logprobs=np.fromiter((r.prompt_logprobs for r in batch), bool, count=n),
        logprob_start_len=np.fromiter((r.logprob_start_len for r in batch), np.int64, count=n),
        arrival_step=np.fromiter((r.arrival_step for r in batch), np.int64, count=n),
        request_ids=[r.request_id for r in batch] if any(r.request_id is not None for r in batch) else None,
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


def _concat(seqs: list, total: int) -> np.ndarray:
    """Concatenate lists of ints and integer arrays into one array (int64, or the arrays'
    common integer type)."""
    if all(isinstance(s, list) for s in seqs):
        return np.fromiter(chain.from_iterable(seqs), np.int64, count=total)
    arrays = [s if isinstance(s, np.ndarray) else np.asarray(s, np.int64) for s in seqs]
    return np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
