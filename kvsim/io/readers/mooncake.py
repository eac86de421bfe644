"""Mooncake hash-id traces: ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``.

``hash_ids`` has one id per block of ``--trace-block-size`` tokens (512 in the released
traces), ``ceil(input_length / B)`` ids: the partial last block has an id too. Tokens are
synthesized from the ids (see :mod:`kvsim.io.hashids`).
"""
from __future__ import annotations

import math
from array import array
from typing import Any

import numpy as np

from kvsim.io.trace.builder import OUT_LOGGED, Part
from kvsim.io.fields import BadRecord, kind, length, timestamp
from kvsim.io.hashids import HashIdPrompts
from kvsim.io.readers.base import LoadContext, Reader
from kvsim.io.source import Source


def hash_id_list(value: Any, name: str = "hash_ids") -> list[int]:
    if value is None:
        raise BadRecord(f"missing {name}")
    if not isinstance(value, list):
        raise BadRecord(f"{name} must be a list of integers, got {kind(value)}")
    if not all(type(x) is int for x in value):
        bad = next(x for x in value if type(x) is not int)
        raise BadRecord(f"{name} must hold integers only, found {kind(bad)}")
    if value and (min(value) < 0 or max(value) >= 2**63):
        raise BadRecord(f"{name} holds an id outside 0..2^63-1")
    return value


def _fields(rec: dict, B: int) -> tuple[int, int, list[int], float]:
    """A Mooncake record's input and output lengths, hash ids and timestamp (ms)."""
    n_in = length(rec.get("input_length"), "input_length", positive=True)
    n_out = length(rec.get("output_length"), "output_length")
    h = hash_id_list(rec.get("hash_ids"))
    want = math.ceil(n_in / B)
    if len(h) != want:
        raise BadRecord(f"{len(h)} hash_ids for input_length {n_in}, expected ceil({n_in}/{B}) = {want}"
                        " (is --trace-block-size right? Mooncake traces use 512)")
    return n_in, n_out, h, timestamp(rec.get("timestamp"))


class MooncakeReader(Reader):
    name = "mooncake"

    @classmethod
    def matches(cls, record: Any) -> bool:
        return isinstance(record, dict) and "hash_ids" in record and "input_length" in record

    def read(self, src: Source, ctx: LoadContext) -> None:
        B = ctx.block_size
        in_len, out_len, counts = array("q"), array("q"), array("q")
        arrival, ids = array("d"), array("q")
        for _, (n_in, n_out, h, t) in self.parsed(src, ctx, lambda rec, line: _fields(rec, B)):
            in_len.append(n_in)
            out_len.append(n_out)
            counts.append(len(h))
            arrival.append(t / 1000.0)  # milliseconds -> seconds
            ids.extend(h)
            ctx.requests += 1
        n = len(in_len)
        ctx.hash_block_sizes.append(B)
        ctx.builder.add(Part(
            source=ctx.source_index,
            prompt_lengths=np.frombuffer(in_len, np.int64).copy() if n else np.zeros(0, np.int64),
            output_lengths=np.frombuffer(out_len, np.int64).copy() if n else np.zeros(0, np.int64),
            arrival=np.frombuffer(arrival, np.float64).copy() if n else np.zeros(0),
            synth=HashIdPrompts(B, np.frombuffer(in_len, np.int64).copy() if n else np.zeros(0, np.int64),
                                np.frombuffer(counts, np.int64).copy() if n else np.zeros(0, np.int64),
                                np.frombuffer(ids, np.int64).copy() if len(ids) else np.zeros(0, np.int64),
                                tail_has_id=True),
            out_source=np.full(n, OUT_LOGGED, np.int8),
        ))
