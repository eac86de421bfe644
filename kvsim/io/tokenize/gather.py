"""Compiled assembly of chat prompts from their pieces' token ids (large batches).

:meth:`kvsim.io.tokenize.message_tokens.MessageTokens._pack` gathers a batch's prompts with numpy; a
batch of many tokens is gathered here instead, in one pass that holds no lock (the reading
thread parses the next lines meanwhile). Both give the same arrays
(``tests/test_io_message_tokens.py``).
"""
from __future__ import annotations

import numpy as np

from kvsim.kernels.jit import njit


@njit(cache=True, nogil=True)
def gather_pieces(flat, starts, handles, counts, first, tokens, lengths, msg_starts):
    """Prompt i is the pieces ``handles[q:q + counts[i]]`` (q: the counts before it); piece h's
    ids are ``flat[starts[h]:starts[h + 1]]``. Writes the prompts' ids one after another into
    ``tokens``, each prompt's length into ``lengths`` and, for the pieces from index ``first``
    to the one before the last (the messages), the token offset where each starts in its
    prompt (0 for the first message: the head before it belongs to it)."""
    pos = 0
    q = 0
    m = 0
    for i in range(len(counts)):
        n = counts[i]
        base = pos
        for k in range(n):
            h = handles[q + k]
            a = starts[h]
            b = starts[h + 1]
            if first <= k < n - 1:
                msg_starts[m] = 0 if k == first else pos - base
                m += 1
            tokens[pos:pos + b - a] = flat[a:b]
            pos += b - a
        lengths[i] = pos - base
        q += n
