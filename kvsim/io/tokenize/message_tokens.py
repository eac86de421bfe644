"""Chat prompts of a per-message template, assembled from each distinct message's tokens.

A template with a :class:`~kvsim.io.tokenize.templates.LocalForm` (llama3, chatml) renders every
message on its own, so a prompt is the template's head, one piece per message and the
generation prompt. :class:`MessageTokens` gives each distinct piece a handle the first time it
is seen (the reader keys messages by the raw bytes of their JSON, so a message resent turn
after turn is parsed and rendered once), tokenizes the new pieces of each batch at once, over
the cores, and assembles every prompt by concatenating its pieces' token arrays.

This equals tokenizing the whole prompt when every piece starts with a special token of an
overlap-free set (:mod:`kvsim.io.tokenize.pieces` says why): the tokenizer cuts the text there
first. A piece that does not is not given a handle, and its prompt is rendered and tokenized
as :class:`~kvsim.io.tokenize.pieces.PieceEncoder` does (``tests/test_io_message_tokens.py``).

An assistant message usually repeats the logged reply of the turn before, which is
tokenized anyway (it is that turn's output). Its piece is then assembled from the reply's
tokens between the template text's, where the tokenizer confirms that the join changes
nothing (:meth:`~kvsim.io.tokenize.tokenizers.Tokenizer.joins`), instead of being tokenized again.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from itertools import chain
from typing import Any, NamedTuple, Sequence

import numpy as np

from kvsim.io.tokenize.encode import Packed
from kvsim.io.tokenize.pieces import PieceEncoder
from kvsim.io.tokenize.templates import LocalForm, RenderedPieces
from kvsim.io.tokenize.tokenizers import Tokenizer
from kvsim.kernels import aot

#: characters of distinct pieces (and raw message bytes) held; beyond it the reader starts a new store
MAX_HELD_CHARS = 128 << 20
#: characters of replies kept (as tokens) for the next turn's history; beyond it they are dropped
MAX_REPLY_CHARS = 64 << 20
#: batches of at least this many prompt tokens are gathered by compiled code (kvsim.io.tokenize.gather)
COMPILED_GATHER_TOKENS = 1 << 18


class PieceRefs(NamedTuple):
    """A prompt as handles of its pieces (head, one per message, generation prompt)."""

    parts: list[int]
    weight: int  # characters of the pieces (sizes tokenization batches)


class Plan(NamedTuple):
    """What a batch tokenizes, decided on the reading thread when the batch is complete, so
    that tokenization starts at once (in the background) while earlier batches are assembled."""

    first: int           # the batch's new pieces are handles first ... stop - 1
    stop: int
    derived: list[bool]  # per new piece: assembled from a reply's tokens
    replies: list[str]   # the batch's reply texts
    clear: bool          # the replies kept so far are dropped first
    ids: list[Future]    # token arrays of the new pieces not derived, then of the replies


class MessageTokens:
    """Distinct pieces of a per-message template by handle, and their token arrays."""

    def __init__(self, tok: Tokenizer, form: LocalForm, specials: tuple[str, ...], fallback: PieceEncoder) -> None:
        self.tok = tok
        self.form = form
        self.specials = specials
        self.fallback = fallback      # prompts whose pieces cannot be cut apart
        self.handles: dict[str, int] = {}
        self.texts: list[str] = []    # by handle (the reading thread appends)
        self.chars: list[int] = []
        # every tokenized piece's ids, in handle order: piece h is flat[starts[h]:starts[h + 1]]
        # (the tokenizing thread appends)
        self._flat = np.empty(1 << 16, np.int32)
        self._starts = np.zeros(1 << 12, np.int64)
        self._count = 0  # pieces tokenized
        self._index = np.zeros(0, np.int32)   # the gather index of a batch (kept: _gather_index)
        self.splits: dict[int, tuple[str, str, str]] = {}  # handle -> (before, message text, after)
        self.held = 0
        # reply text -> its tokens, and whether they hold no special token (the tokenizing thread's)
        self.replies: dict[str, tuple[np.ndarray, bool]] = {}
        self._planned = 0                # pieces planned (the reading thread's)
        self._reply_texts: set[str] = set()  # the replies in self.replies once planned batches are done
        self._reply_chars = 0
        self.constants: dict[str, np.ndarray] = {}  # template text -> its tokens
        self._lock = threading.Lock()
        self.head = self._new(form.head) if form.head else None  # first in every prompt: no cut to check
        self.tail = self.piece(form.tail)

    @staticmethod
    def usable(form: LocalForm | None, specials: tuple[str, ...] | None) -> bool:
        """Can prompts of this form be cut between their pieces?"""
        return form is not None and bool(specials) and form.tail.startswith(specials)

    def piece(self, text: str) -> int | None:
        """The handle of a piece (new pieces are queued for tokenization); None if it does not
        start with a special token (so it cannot be tokenized apart from what precedes it)."""
        h = self.handles.get(text)
        if h is not None:
            return h
        if not text.startswith(self.specials):
            return None
        h = self.handles[text] = self._new(text)
        return h

    def _new(self, text: str) -> int:
        with self._lock:
            h = len(self.texts)
            self.texts.append(text)
        self.chars.append(len(text))
        self.held += len(text)
        return h

    def prompt(self, handles: Sequence[int], chars: int | None = None) -> PieceRefs:
        """The prompt whose messages' pieces are ``handles`` (``chars``: those pieces'
        characters, when the caller knows them)."""
        if self.head is None:
            parts = [*handles, self.tail]
            ends = self.chars[self.tail]
        else:
            parts = [self.head, *handles, self.tail]
            ends = self.chars[self.head] + self.chars[self.tail]
        if chars is None:
            chars = sum([self.chars[h] for h in handles])
        return PieceRefs(parts, chars + ends)

    def message(self, role: str, content: str) -> int | None:
        """The handle of a message's piece (None: it cannot be cut apart)."""
        parts = self.form.parts(role, content)
        text = "".join(parts)
        new = text not in self.handles
        h = self.piece(text)
        if new and h is not None and parts[1] and parts[2].startswith(self.specials):
            self.splits[h] = parts
        return h

    def render(self, messages: Sequence[tuple[str, str]]) -> PieceRefs | None:
        """The prompt of parsed messages, or None if a piece cannot be cut apart."""
        handles = []
        for role, content in messages:
            h = self.message(role, content)
            if h is None:
                return None
            handles.append(h)
        return self.prompt(handles)

    # -- on the reading thread, once a batch is complete --------------------------------------
    def plan(self, prompts: Sequence[PieceRefs | RenderedPieces], texts: Sequence[str] = (),
             last: bool = False) -> Plan:
        """Decide what the batch of ``prompts`` (with reply texts ``texts``) tokenizes and
        start it in the background; :meth:`encode` of the same batch takes the plan. ``last``:
        no batch follows, so tokenization may take every core."""
        first = self._planned
        with self._lock:  # every piece so far (the batch's lines are the last read)
            new = self.texts[first:]
            stop = first + len(new)
        clear = self._reply_chars > MAX_REPLY_CHARS
        if clear:
            self._reply_texts, self._reply_chars = set(), 0
        # pieces whose message text is a reply (of this batch or before) are assembled from it
        batch_replies = set(texts)
        known = self._reply_texts
        derived = []
        for h in range(first, stop):
            split = self.splits.get(h)
            derived.append(split is not None and (split[1] in known or split[1] in batch_replies))
        for text in texts:
            if text:
                known.add(text)
                self._reply_chars += len(text)
        self._planned = stop
        todo = [*(text for text, d in zip(new, derived) if not d), *texts]
        ids = self.tok.submit_arrays(todo, every_core=last) if todo else []
        return Plan(first, stop, derived, list(texts), clear, ids)

    # -- on the tokenizing thread -----------------------------------------------------------
    def encode(self, prompts: Sequence[PieceRefs | RenderedPieces], texts: Sequence[str] = (), pack: bool = False,
               plan: Plan | None = None) -> tuple[list[np.ndarray] | Packed, list[list[int]], list[np.ndarray]]:
        """Token ids of each prompt, the token index where each of its messages starts, and
        the ids of ``texts`` (tokenized in the same batch as the new pieces). With ``pack``,
        when every prompt is made of pieces, the prompts come as one :class:`Packed` (and no
        starts). ``plan``: the batch's :meth:`plan` (made here when not given)."""
        if plan is None:
            plan = self.plan(prompts, texts)
        assert plan.first == self._count and plan.replies == list(texts), "batches are encoded in plan order"
        refs = [i for i, p in enumerate(prompts) if isinstance(p, PieceRefs)]
        others = [i for i, p in enumerate(prompts) if not isinstance(p, PieceRefs)]
        first, derived = plan.first, plan.derived
        with self._lock:
            new = self.texts[first:plan.stop]
        if plan.clear:
            self.replies = {}
        encode = [k for k in range(len(new)) if not derived[k]]
        encoded = [*chain.from_iterable(f.result() for f in plan.ids)]
        reply_ids = encoded[len(encode):]
        self._keep_replies(texts, reply_ids)
        arrays: list[Any] = [None] * len(new)  # per new piece: its ids, or the parts they are joined from
        for k, a in zip(encode, encoded):
            arrays[k] = a
        missing = []
        for k in (k for k in range(len(new)) if derived[k]):
            arrays[k] = self._assembled(first + k)
            if arrays[k] is None:
                missing.append(k)
        for k, a in zip(missing, self.tok.encode_arrays([new[k] for k in missing]) if missing else []):
            arrays[k] = a
        self._append(arrays)
        if pack and not others:  # the reader's fast path: every prompt from pieces, assembled at once
            return self._pack(prompts), [], reply_ids  # type: ignore[arg-type]
        ids: list[Any] = [None] * len(prompts)
        starts: list[Any] = [None] * len(prompts)
        if others:
            o_ids, o_starts, _ = self.fallback.encode([prompts[i] for i in others])
            for i, a, s in zip(others, o_ids, o_starts):
                ids[i], starts[i] = a, s
        if refs:
            self._assemble([prompts[i] for i in refs], refs, ids, starts)
        return ids, starts, reply_ids

    def _keep_replies(self, texts: Sequence[str], ids: Sequence[np.ndarray]) -> None:
        if not ids:
            return
        # which replies hold a special token's id (one pass over all of them)
        lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
        low = self.tok.first_special_id
        special = np.flatnonzero(np.concatenate(ids) >= low) if low else None
        holds = (np.ones(len(ids), bool) if special is None
                 else np.bincount(np.searchsorted(np.cumsum(lengths), special, "right"), minlength=len(ids)) > 0)
        for text, a, h in zip(texts, ids, holds.tolist()):
            if text:
                self.replies[text] = (a, not h)

    def _assembled(self, h: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """A piece's tokens from its template texts' and its reply's (to be joined), if the
        joins are exact (the one before the piece's ``after`` text is a cut before a special
        token)."""
        before, text, after = self.splits.pop(h)
        ids, plain = self.replies[text]
        if not self.tok.joins(before, text, right_plain=plain):
            return None
        return self._constant(before), ids, self._constant(after)

    def _constant(self, text: str) -> np.ndarray:
        a = self.constants.get(text)
        if a is None:
            a = self.constants[text] = self.tok.encode_arrays([text])[0]
        return a

    def _append(self, arrays: list[np.ndarray | tuple[np.ndarray, ...]]) -> None:
        """Store the ids of the next pieces (in handle order); a piece may come as the parts its
        ids are joined from."""
        lengths = np.fromiter((len(a) if type(a) is not tuple else sum(map(len, a)) for a in arrays), np.int64,
                              count=len(arrays))
        flat_parts = [*chain.from_iterable(a if type(a) is tuple else (a,) for a in arrays)]
        n, end = self._count, int(self._starts[self._count])
        need = end + int(lengths.sum())
        wide = any(a.dtype != np.int32 for a in flat_parts)
        if need > len(self._flat) or (wide and self._flat.dtype == np.int32):
            flat = np.empty(max(need, 2 * len(self._flat)), np.int64 if wide else self._flat.dtype)
            flat[:end] = self._flat[:end]
            self._flat = flat
        if n + len(arrays) + 1 > len(self._starts):
            starts = np.zeros(max(n + len(arrays) + 1, 2 * len(self._starts)), np.int64)
            starts[:n + 1] = self._starts[:n + 1]
            self._starts = starts
        if flat_parts:
            np.concatenate(flat_parts, out=self._flat[end:need])
        np.cumsum(lengths, out=self._starts[n + 1:n + 1 + len(arrays)])
        self._starts[n + 1:n + 1 + len(arrays)] += end
        self._count = n + len(arrays)

    def _pack(self, prompts: Sequence[PieceRefs]) -> Packed:
        """Every prompt's ids, gathered from its pieces' (no Python object per piece)."""
        counts = np.fromiter(map(len, (p.parts for p in prompts)), np.int64, count=len(prompts))
        handles = np.fromiter(chain.from_iterable(p.parts for p in prompts), np.int64, count=int(counts.sum()))
        begin = self._starts[handles]
        sizes = self._starts[handles + 1] - begin
        first = 0 if self.head is None else 1
        total = int(sizes.sum())
        if total >= COMPILED_GATHER_TOKENS and aot.ready("kvsim.io.tokenize.gather:gather_pieces"):  # (an import costs more than it saves)
            from kvsim.io.tokenize.gather import gather_pieces

            tokens = np.empty(total, self._flat.dtype)
            lengths = np.empty(len(counts), np.int64)
            msg_counts = counts - 1 - first
            msg_starts = np.empty(int(msg_counts.sum()), np.int64)
            gather_pieces(self._flat, self._starts, handles, counts, first, tokens, lengths, msg_starts)
            return Packed(tokens, lengths, msg_counts, msg_starts)
        ends = np.cumsum(sizes)
        tokens = self._flat[self._gather_index(begin, sizes, ends, total)]
        last = np.cumsum(counts) - 1  # index of each prompt's last piece (the tail)
        lengths = np.diff(ends[last], prepend=0)
        # messages: the pieces after the head and before the tail; each starts where the
        # piece before it ends, the first at 0 (the head belongs to the first message)
        local = np.arange(len(handles)) - np.repeat(last + 1 - counts, counts)  # piece index in its prompt
        is_msg = (local >= first) & (local < np.repeat(counts, counts) - 1)
        prompt_base = np.repeat(ends[last] - lengths, counts)
        msg_starts = np.where(local == first, 0, ends - sizes - prompt_base)[is_msg]
        return Packed(tokens, lengths, counts - 1 - first, msg_starts)

    def _gather_index(self, begin: np.ndarray, sizes: np.ndarray, ends: np.ndarray, total: int) -> np.ndarray:
        """Where each of the batch's ``total`` tokens is in ``flat``: piece p's tokens are
        flat[begin[p]:begin[p] + sizes[p]], one after another. Built as the running sum of its
        steps (1 inside a piece, a jump where one starts) in a buffer kept between batches
        (int32 where it fits), so that a batch allocates no index of its own."""
        dtype = np.int32 if max(total, len(self._flat)) < 2**31 else np.int64
        if len(self._index) < total or self._index.dtype != dtype:
            self._index = np.empty(max(total, 2 * len(self._index)), dtype)
        index = self._index[:total]
        if total == 0:
            return index
        used = sizes > 0
        b, o, n = begin[used], (ends - sizes)[used], sizes[used]
        index.fill(1)
        index[0] = b[0]
        # at the start of piece p: from the last token of piece p - 1 to the first of p
        index[o[1:]] = b[1:] - (b[:-1] + n[:-1] - 1)
        np.cumsum(index, out=index)
        return index

    def _assemble(self, prompts: list[PieceRefs], where: list[int], ids: list, starts: list) -> None:
        packed = self._pack(prompts)
        ends = np.cumsum(packed.lengths).tolist()
        msg_ends = np.cumsum(packed.msg_counts).tolist()
        msg_starts = packed.msg_starts.tolist()
        for k, i in enumerate(where):
            ids[i] = packed.tokens[ends[k - 1] if k else 0:ends[k]]
            starts[i] = msg_starts[msg_ends[k - 1] if k else 0:msg_ends[k]]
