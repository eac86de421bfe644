"""Deterministic synthetic replies of an exact length in tokens.

A reply is words drawn by a seeded generator (the seed mixes the server's ``--seed``, the
request's ``seed`` and its prompt tokens, so the same request always gets the same reply)
from the common words of :mod:`kvsim.workloads.words` that are one token on their own and
after a space. Its token ids are the tokenizer's encoding of the text, so a client that
sends the reply back in the next turn sends the very tokens the engine generated, and the
cache can reuse them as the engine's would.

``finish="stop"`` ends the reply with the template's end-of-turn token (the stop token a
model samples; it is generated and counted but not shown in the text), else the reply
ends by length.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from kvsim.io.tokenize.tokenizers import Tokenizer
from kvsim.workloads import words as vocab

_CANDIDATES = tuple(dict.fromkeys(vocab.COMMON_NOUNS + vocab.COMMON_ADJECTIVES + vocab.COMMON_VERBS
                                  + vocab.PREPOSITIONS + vocab.ADVERBS + vocab.DETERMINERS))


@dataclass(frozen=True)
class Reply:
    token_ids: list[int]      # what the engine generated (the stop token included)
    pieces: list[str]         # text per generated token, for streaming ("" for the stop token)
    finish_reason: str        # "length" or "stop"

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class ReplyMaker:
    """Makes replies for one tokenizer."""

    def __init__(self, tokenizer: Tokenizer, stop_token_id: int | None, seed: int = 0) -> None:
        self.tokenizer = tokenizer
        self.stop_token_id = stop_token_id
        self.seed = seed
        # words that are one token alone and after a space: n words are n tokens
        self.words = [w for w in _CANDIDATES
                      if len(tokenizer.encode(w)) == 1 and len(tokenizer.encode(" " + w)) == 1]

    def make(self, num_tokens: int, key: bytes, finish: str = "length") -> Reply:
        """A reply of exactly ``num_tokens`` tokens (>= 1), the same for the same key."""
        digest = hashlib.sha256(self.seed.to_bytes(8, "little", signed=True) + key).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        stop = finish == "stop" and self.stop_token_id is not None
        n_text = num_tokens - 1 if stop else num_tokens
        ids, pieces = self._text(n_text, rng)
        if stop:
            return Reply(ids + [self.stop_token_id], pieces + [""], "stop")
        return Reply(ids, pieces, "length")

    def _text(self, n: int, rng: np.random.Generator) -> tuple[list[int], list[str]]:
        if n <= 0:
            return [], []
        if len(self.words) >= 8:
            words = self.words
            chosen = [words[i] for i in rng.integers(0, len(words), n).tolist()]
            pieces = [chosen[0]] + [" " + w for w in chosen[1:]]
            ids = self.tokenizer.encode("".join(pieces))
            if len(ids) == n:
                return ids, pieces
        # a tokenizer that merges across words (or has none of them as single tokens):
        # enough letters, cut at n tokens
        letters = "etaoinshrdlucmfwyp"

        def some(k: int) -> str:
            return "".join(letters[i] for i in rng.integers(0, len(letters), k).tolist())

        text = some(n)
        ids = self.tokenizer.encode(text)
        while len(ids) < n:
            text += " " + some(n)
            ids = self.tokenizer.encode(text)
        ids = ids[:n]
        pieces = [self.tokenizer.decode([i]) for i in ids]
        if "".join(pieces) != self.tokenizer.decode(ids):
            pieces = [self.tokenizer.decode(ids)] + [""] * (n - 1)
        return ids, pieces
