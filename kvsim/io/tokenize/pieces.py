"""Chat prompts tokenized piece by piece: each distinct piece once.

A multi-turn log resends the whole history every turn, so most of its text is pieces seen
before: the system prompt, earlier questions and replies. The chat template renders a prompt
as pieces (:class:`~kvsim.io.tokenize.templates.RenderedPieces`, one per message as rendered at its
position, plus the template's own text); :class:`PieceEncoder` tokenizes each distinct piece
once, in bulk, and assembles every prompt from its pieces' tokens.

Why the result is the prompt's own tokenization: tiktoken and the bytes tokenizer first cut
the text at special tokens and tokenize the ordinary text between two of them on its own
(``Tokenizer.split_first``). A cut of the prompt right after or right before a special token
is such a place, so the tokens on either side do not depend on the other side, provided no
two special tokens can overlap in a text (one ending with the start of another, or one inside
another; checked once per tokenizer). Pieces whose cut is not next to a special token (the
``plain`` template, say, or a Jinja template that joins messages with plain text) are joined
and tokenized together, so the assembled tokens always equal tokenizing the whole prompt
(``tests/test_io_pieces.py`` checks this token for token for every template).
"""
from __future__ import annotations

from itertools import accumulate, repeat
from typing import Sequence

import numpy as np

from kvsim.io.tokenize.templates import RenderedPieces
from kvsim.io.tokenize.tokenizers import Tokenizer, overlap_free

#: tokens held for reuse, in bytes of ids; beyond it the cache starts over
MAX_CACHED_BYTES = 256 << 20


def cut_strings(tok: Tokenizer) -> tuple[str, ...] | None:
    """The special tokens next to which a prompt may be cut for ``tok`` (None: nowhere)."""
    specials = tok.split_first()
    if specials is None:
        return None
    specials = tuple(s for s in specials if s)
    return specials if overlap_free(specials) else None


__all__ = ["PieceEncoder", "cut_strings", "overlap_free"]


class PieceEncoder:
    """Tokenizes rendered chat prompts, each distinct run of pieces once per load."""

    def __init__(self, tok: Tokenizer, specials: tuple[str, ...]) -> None:
        self.tok = tok
        self.specials = specials
        self.longest = max((len(s) for s in specials), default=0)
        self.cache: dict[str, np.ndarray] = {}
        self.held = 0

    def runs(self, rendered: RenderedPieces) -> tuple[list[str], list[tuple[int, int]] | None]:
        """The prompt as runs of pieces tokenized together, and where each piece sits
        (run index, character offset in the run; None when every piece is a run of its own).
        A run ends where the next piece starts with a special token or the text so far ends
        with one."""
        specials = self.specials
        pieces = rendered.pieces
        if all(map(str.startswith, pieces[1:], repeat(specials))):  # built-in templates, mostly
            return pieces, None
        runs: list[str] = []
        where: list[tuple[int, int]] = []
        current: list[str] = []
        length = 0
        for piece in rendered.pieces:
            if current and (piece.startswith(specials) or self._ends_special(current)):
                runs.append(current[0] if len(current) == 1 else "".join(current))
                current, length = [], 0
            where.append((len(runs), length))
            current.append(piece)
            length += len(piece)
        runs.append(current[0] if len(current) == 1 else "".join(current))
        return runs, where

    def _ends_special(self, current: list[str]) -> bool:
        last = current[-1]
        if len(last) >= self.longest or len(current) == 1:
            return last.endswith(self.specials)
        tail, k = "", len(current)
        while k and len(tail) < self.longest:  # a special token may span the last pieces
            k -= 1
            tail = current[k] + tail
        return tail.endswith(self.specials)

    def encode(self, prompts: Sequence[RenderedPieces], texts: Sequence[str] = ()
               ) -> tuple[list[np.ndarray], list[list[int]], list[np.ndarray]]:
        """Token ids of each prompt, the token index where each of its messages starts, and
        the ids of ``texts`` (other texts to tokenize in the same batch, not kept)."""
        split = [self.runs(p) for p in prompts]
        if self.held > MAX_CACHED_BYTES:
            self.cache, self.held = {}, 0
        missing = [r for r in dict.fromkeys(r for runs, _ in split for r in runs) if r not in self.cache]
        encoded = self.tok.encode_arrays([*missing, *texts])  # one batch: every core busy
        for text, ids in zip(missing, encoded):
            self.cache[text] = ids
            self.held += ids.nbytes
        cache, out_ids, out_starts = self.cache, [], []
        for rendered, (runs, where) in zip(prompts, split):
            parts = [cache[r] for r in runs]
            first = [0, *accumulate(map(len, parts))]
            if where is None and not any(char for _, char in rendered.starts):
                starts = [first[piece] for piece, _ in rendered.starts]  # every message starts a run
            else:
                starts = [self._start(runs, parts, first, where, piece, char) for piece, char in rendered.starts]
            out_ids.append(parts[0] if len(parts) == 1 else np.concatenate(parts))
            out_starts.append(starts)
        return out_ids, out_starts, encoded[len(missing):]

    def _start(self, runs, parts, first, where, piece: int, char: int) -> int:
        """Token index where a message starts (character ``char`` of piece ``piece``)."""
        run, offset = (piece, 0) if where is None else where[piece]
        offset += char
        if not offset:
            return first[run]
        return first[run] + self.tok.token_starts(runs[run], parts[run], [offset])[0]
