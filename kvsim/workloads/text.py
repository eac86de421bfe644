"""Plausible, deterministic English from a tiny sentence grammar over word lists.

Lengths are asked for in approximate tokens: :func:`approx_tokens` counts words,
numbers and punctuation the way cl100k splits ordinary English, within a few percent.
"""
from __future__ import annotations

import re
from collections.abc import Callable

from kvsim.workloads.rng import Rng
from kvsim.workloads.words import ADVERBS, CONNECTIVES, DETERMINERS, PREPOSITIONS, Vocab

_TOKEN_RE = re.compile(r"[A-Za-z]+|\d{1,3}|[^\sA-Za-z\d]+\n*|\n+")

# {N} noun, {Ns} plural noun, {A} adjective, {V} verb, {Vs} verb with -s, {D} determiner,
# {P} preposition, {R} adverb, {C} connective phrase.
_SENTENCES = (
    "{D} {A} {N} {Vs} {D} {N} {P} {D} {A} {N}.",
    "{C}, {D} {N} {Vs} {D} {A} {N}.",
    "If {D} {N} {Vs} {D} {N}, {V} the {N} {P} {D} {A} {N}.",
    "Always {V} the {A} {N} before you {V} {D} {N}.",
    "{D} {N} should {R} {V} {D} {A} {N} {P} the {N}.",
    "When {D} {N} {Vs}, {V} the {N} and {V} {D} {A} {N}.",
    "Never {V} {D} {A} {N} {P} {D} {N}.",
    "{A} {Ns} {P} {D} {N} are {A} {P} {D} {A} {N}.",
    "You can {V} {D} {N} {P} the {A} {N} at any time.",
    "We {R} {V} {D} {A} {N} when {D} {N} is {A}.",
    "Make sure {D} {N} is {A} and {A} {P} {D} {N}.",
    "{Ns} that {V} {D} {N} must {V} {D} {A} {N}.",
    "{C}, {V} {D} {N} {R} so that {D} {N} stays {A}.",
    "It is {A} to {V} {D} {N} {P} {D} {A} {N}.",
)
_VOWEL_A = re.compile(r"\b([Aa]) ([aeiou])")


def approx_tokens(text: str) -> int:
    """Approximate token count: words, 1-3 digit runs, punctuation runs (with any newlines after them), newline runs."""
    return len(_TOKEN_RE.findall(text))


def plural(noun: str) -> str:
    if noun.endswith(("s", "x", "ch", "sh", "z")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def third_person(verb: str) -> str:
    return plural(verb)  # the same spelling rules: fix -> fixes, apply -> applies


def capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


class TextGen:
    """Sentences, paragraphs and bullet lists over one vocabulary."""

    def __init__(self, rng: Rng, vocab: Vocab) -> None:
        self.rng = rng
        self.vocab = vocab

    def _fill(self, slot: str) -> str:
        rng, v = self.rng, self.vocab
        if slot == "N":
            return rng.choice(v.nouns)
        if slot == "Ns":
            return plural(rng.choice(v.nouns))
        if slot == "A":
            return rng.choice(v.adjectives)
        if slot == "V":
            return rng.choice(v.verbs)
        if slot == "Vs":
            return third_person(rng.choice(v.verbs))
        if slot == "D":
            return rng.choice(DETERMINERS)
        if slot == "P":
            return rng.choice(PREPOSITIONS)
        if slot == "R":
            return rng.choice(ADVERBS)
        if slot == "C":
            return rng.choice(CONNECTIVES)
        raise KeyError(slot)

    def sentence(self) -> str:
        template = self.rng.choice(_SENTENCES)
        text = re.sub(r"\{(\w+)\}", lambda m: self._fill(m.group(1)), template)
        return capitalize(_VOWEL_A.sub(r"\1n \2", text))

    def sentences(self, tokens: int) -> str:
        """Sentences joined by spaces, about ``tokens`` tokens (at least one sentence)."""
        return fill(self.sentence, tokens, " ")

    def paragraphs(self, tokens: int, per_paragraph: int = 80) -> str:
        """Paragraphs of about ``per_paragraph`` tokens, about ``tokens`` in all."""
        return fill(lambda: self.sentences(min(per_paragraph, tokens)), tokens, "\n\n")

    def bullets(self, tokens: int, marker: str = "-") -> str:
        """A bullet list of single sentences, about ``tokens`` tokens."""
        count = iter(range(1, 1 << 30))
        if marker == "1.":
            return fill(lambda: f"{next(count)}. {self.sentence()}", tokens, "\n")
        return fill(lambda: f"{marker} {self.sentence()}", tokens, "\n")


def fill(make: Callable[[], str], tokens: int, sep: str) -> str:
    """Pieces from ``make()`` joined by ``sep`` until the text is about ``tokens`` tokens:
    the last piece is kept only if that lands closer to the target (at least one piece)."""
    out: list[str] = []
    used = 0
    while True:
        piece = make()
        cost = approx_tokens(piece)
        if out and used + cost - tokens > tokens - used:
            break
        out.append(piece)
        used += cost
        if used >= tokens:
            break
    return sep.join(out)
