"""The seed article's crude overlap heuristic, to print next to the real numbers.

``measure_prefix_overlap``: the share of prompts whose first 200 characters equal the
most common first 200 characters. It looks at characters, not tokens or blocks; it
counts a prompt as all-or-nothing, so partial sharing is invisible; and it sees only the
single most common opening, so a workload with several system prompts scores low.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import numpy as np

from kvsim.analyze import _kernels as K

Decoder = Callable[[np.ndarray], str]
CHARS_PER_TOKEN = 4  # the usual English BPE average, for the token proxy
WHY = ("it compares characters, not tokens or cache blocks, counts a prompt as all-or-nothing "
       "(partial sharing is invisible) and only sees the single most common opening "
       "(several system prompts score low)")


def seed_heuristic(tokens: np.ndarray, offsets: np.ndarray, chars: int = 200,
                   decode: Decoder | None = None) -> dict[str, Any]:
    """Section 8: the heuristic on decoded text, or on tokens when there is no text."""
    n = len(offsets) - 1
    if n == 0:
        return {"share": 0.0, "method": "no requests", "chars": chars, "why_misleading": WHY}
    lens = np.diff(offsets)
    take = np.minimum(lens, chars if decode is not None else max(1, chars // CHARS_PER_TOKEN))
    h = K.span_hashes(tokens, offsets[:-1].astype(np.int64), take.astype(np.int64))
    _, first, inv = np.unique(h, return_index=True, return_inverse=True)
    if decode is None:
        share = float(np.bincount(inv).max() / n)
        method = (f"token proxy: first {max(1, chars // CHARS_PER_TOKEN)} tokens (about {chars} characters; "
                  "the trace holds no text)")
    else:
        # decode one prompt per distinct token opening (at least `chars` characters when
        # the tokenizer gives >= 1 character per token), then compare the text
        texts = [decode(tokens[offsets[i]:offsets[i] + take[i]])[:chars] for i in first]
        counts = Counter()
        per = np.bincount(inv)
        for t, c in zip(texts, per):
            counts[t] += int(c)
        share = counts.most_common(1)[0][1] / n
        method = f"text: first {chars} characters of the decoded prompt"
    return {"share": float(share), "method": method, "chars": chars, "why_misleading": WHY}
