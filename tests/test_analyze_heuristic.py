"""The seed article's heuristic, printed next to the real numbers."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from kvsim.analyze import analyze
from kvsim.analyze.heuristic import seed_heuristic
from kvsim.io.trace.columns import Trace


def measure_prefix_overlap(prompts: list[str], prefix_len: int = 200) -> float:
    """The seed article's function, verbatim."""
    prefixes = [p[:prefix_len] for p in prompts]
    most_common_count = Counter(prefixes).most_common(1)[0][1]
    return most_common_count / len(prompts)


def test_same_answer_as_the_seed_on_decoded_text():
    rng = np.random.default_rng(0)
    texts = []
    for i in range(30):
        head = "You are a helpful assistant. " * 6 if i % 3 else "You are a terse assistant. " * 6
        texts.append(head + "".join(rng.choice(list("abcdef "), 50)))
    tokens = [[ord(c) for c in t] for t in texts]     # one token per character
    trace = Trace.from_prompts(tokens)
    got = seed_heuristic(trace.tokens, trace.offsets, 200, lambda ids: "".join(chr(int(x)) for x in ids))
    assert got["share"] == pytest.approx(measure_prefix_overlap(texts))
    assert got["method"].startswith("text")


def test_misleads_with_two_system_prompts():
    """Two equally used system prompts: the heuristic says 50%, the real bound is ~all of them."""
    s1, s2 = list(range(1000, 1400)), list(range(2000, 2400))
    prompts = [(s1 if i % 2 else s2) + [90_000 + i] for i in range(20)]
    report = analyze(Trace.from_prompts(prompts))
    assert report.heuristic["share"] == pytest.approx(0.5)
    assert report.heuristic["method"].startswith("token proxy")
    assert report.bound["token"] > 0.85
    assert "single most common opening" in report.heuristic["why_misleading"]
