"""(c) RAG: every question retrieves one popular document plus 1-3 others that vary.

By default the popular document comes first in the system message, right after the
instruction, so all requests share it as a prefix (the seed article's cache-friendly
layout). ``--popular-last`` puts it after the varying documents instead, which leaves
little more than the instruction to share: the ordering effect, shown by one flag.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvsim.workloads import words
from kvsim.workloads.record import ChatRequest, Turn, single_turns
from kvsim.workloads.registry import Params
from kvsim.workloads.rng import Rng, zipf_weights
from kvsim.workloads.text import TextGen, approx_tokens

MAX_TOKENS = 512
CORPUS_SIZE = 40  # documents besides the popular one
INSTRUCTION = ("Answer the question using the documents below. Quote the document number you "
               "rely on, and say so if the documents do not contain the answer.")
POPULAR_TITLE = "Python Tutorial, Chapter 3: An Informal Introduction to Python"
_CHAPTERS = ("More Control Flow Tools", "Data Structures", "Modules", "Input and Output",
             "Errors and Exceptions", "Classes", "Brief Tour of the Standard Library",
             "Virtual Environments and Packages", "Floating-Point Arithmetic",
             "Interactive Input Editing")
_MODULES = ("json", "os.path", "itertools", "functools", "collections", "datetime", "re",
            "pathlib", "logging", "asyncio", "typing", "dataclasses", "subprocess", "threading",
            "unittest", "argparse", "csv", "sqlite3", "urllib.request", "math", "random",
            "statistics", "shutil", "tempfile", "heapq", "bisect", "enum", "contextlib", "abc",
            "string")
_EXAMPLES = (">>> 2 + 2\n4", ">>> width = 20\n>>> height = 5 * 9\n>>> width * height\n900",
             ">>> word = 'Python'\n>>> word[0:2]\n'Py'", ">>> squares = [1, 4, 9, 16, 25]\n>>> squares[-3:]\n[9, 16, 25]",
             ">>> 17 // 3\n5\n>>> 17 % 3\n2", ">>> print('C:\\\\some\\\\name')\nC:\\some\\name")
_QUESTIONS = (
    "How do I {V} a {N} in Python?", "What is the difference between a {N} and a {N2}?",
    "Why does my {N} raise an error when I {V} it?", "Can you show an example of {A} {Ns}?",
    "When should I use {M} instead of {M2}?", "How does {M} handle {A} {Ns}?",
    "Is it safe to {V} a {N} inside a loop?", "What does the {A} {N} do in {M}?",
)


@dataclass(frozen=True)
class Document:
    title: str
    body: str


def _document(rng: Rng, title: str, tokens: int) -> Document:
    text = TextGen(rng, words.DOCS)
    example = rng.choice(_EXAMPLES)
    prose = text.paragraphs(max(10, tokens - approx_tokens(title) - approx_tokens(example) - 2), 90)
    parts = prose.split("\n\n")
    parts.insert(min(1, len(parts)), example)
    return Document(title, "\n\n".join(parts))


def corpus(rng: Rng, doc_tokens: int) -> tuple[Document, list[Document]]:
    """The popular document and the rest of the corpus, most retrieved first."""
    popular = _document(rng.fork("popular"), POPULAR_TITLE, doc_tokens)
    titles = [f"Python Tutorial, Chapter {i + 4}: {c}" for i, c in enumerate(_CHAPTERS)]
    titles += [f"Library Reference: {m}" for m in _MODULES]
    docs = [_document(rng.fork(f"doc{i}"), t, doc_tokens) for i, t in enumerate(titles[:CORPUS_SIZE])]
    rng.fork("order").shuffle(docs)
    return popular, docs


def question(rng: Rng) -> str:
    nouns = words.DOC_NOUNS
    n, n2 = rng.sample(nouns, 2)
    m, m2 = rng.sample(_MODULES, 2)
    slots = {"V": rng.choice(words.CODE_VERBS), "N": n, "N2": n2, "Ns": n + "s",
             "A": rng.choice(words.DOC_ADJECTIVES), "M": m, "M2": m2}
    return rng.choice(_QUESTIONS).format(**slots)


def system_message(docs: list[Document]) -> str:
    listed = "\n\n".join(f"Document {i + 1}: {d.title}\n{d.body}" for i, d in enumerate(docs))
    return f"{INSTRUCTION}\n\n{listed}"


def build(p: Params, rng: Rng, prefix: str = "rag") -> list[ChatRequest]:
    assert p.doc_tokens is not None
    popular, others = corpus(rng.fork("corpus"), p.doc_tokens)
    weights = zipf_weights(len(others), 1.0)

    def turn(draw: Rng) -> Turn:
        picked: list[Document] = []
        for _ in range(draw.between(1, 3)):  # retrieved by score: distinct, popular ones likelier
            choices = [d for d in others if d not in picked]
            picked.append(draw.weighted(choices, [w for d, w in zip(others, weights) if d not in picked]))
        docs = picked + [popular] if p.popular_last else [popular] + picked
        text = TextGen(draw, words.DOCS)
        answer = (f"According to Document {docs.index(popular) + 1}, "
                  + text.paragraphs(draw.lognormal_int(200, 0.4, 40, MAX_TOKENS - 60), 90))
        return Turn(system_message(docs), question(draw), answer)

    return single_turns(p, rng.fork("requests"), prefix, MAX_TOKENS, turn)
