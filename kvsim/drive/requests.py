"""Per-request token streams for replay: the prompt, and the output tokens the engine
will generate — the logged ones when known, otherwise synthesized ids that match nothing.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from kvsim.engines.base import Request, Workload
from kvsim.io.trace.columns import Trace


class Ragged(list):
    """Per-request arrays as a list of views of one flat array: request i is
    ``flat[offsets[i]:offsets[i+1]]``. Engines take it as the list it is; a compiled replay
    reads ``flat`` and ``offsets`` to key every request in one call, and keeps in ``keyed``
    what it computed from them once for every engine of the log (a fleet's block keys)."""

    def __init__(self, flat: np.ndarray, offsets: np.ndarray) -> None:
        bounds = offsets.tolist()
        super().__init__(flat[a:b] for a, b in zip(bounds, bounds[1:]))
        self.flat, self.offsets = flat, offsets
        self.keyed: dict = {}


def output_token_arrays(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Output tokens of every request, concatenated, with offsets (n+1,).

    Request i generates ``output_lengths[i]`` tokens (at least 1, as an engine always
    samples one). Logged output ids are used when known (cut or padded to that length);
    missing ids are synthesized as distinct negative integers, which never occur in a
    prompt and never repeat, so they match nothing in any cache.
    """
    n = len(trace)
    lengths = np.maximum(trace.output_lengths, 1)
    offsets = np.zeros(n + 1, np.int64)
    offsets[1:] = np.cumsum(lengths)
    total = int(offsets[-1])
    out = -(np.arange(total, dtype=np.int64) + 1)  # synthesized: unique negative ids
    known = np.flatnonzero(trace.output_known)
    for i in known:
        logged = trace.output_tokens[trace.output_offsets[i]:trace.output_offsets[i + 1]]
        k = min(len(logged), int(lengths[i]))
        out[offsets[i]:offsets[i] + k] = logged[:k]
    return out, offsets


def iter_requests(trace: Trace) -> Iterator[Request]:
    """The trace's requests as :class:`Request` objects (for the stepwise models)."""
    tokens = trace.require_tokens("replay")
    out, out_off = output_token_arrays(trace)
    for i in range(len(trace)):
        yield Request(
            request_id=trace.request_id(i),
            prompt=np.asarray(tokens[trace.offsets[i]:trace.offsets[i + 1]], dtype=np.int64),
            output=out[out_off[i]:out_off[i + 1]],
            lora=trace.name_of("lora", int(trace.lora[i])),
            cache_salt=trace.name_of("cache_salt", int(trace.cache_salt[i])),
            prompt_logprobs=bool(trace.prompt_logprobs[i]),
            logprob_start_len=int(trace.logprob_start_len[i]),
        )


def workload(trace: Trace) -> Workload:
    """The trace's requests as the flat arrays a sequential replay feeds an engine."""
    tokens = trace.require_tokens("replay")
    out, out_off = output_token_arrays(trace)
    n = len(trace)
    return Workload(
        prompt_tokens=tokens, prompt_offsets=trace.offsets, output_tokens=out, output_offsets=out_off,
        lora=trace.names("lora"),
        cache_salt=trace.names("cache_salt"),
        prompt_logprobs=trace.prompt_logprobs.astype(bool), logprob_start_len=trace.logprob_start_len,
        request_ids=[trace.request_id(i) for i in range(n)])
