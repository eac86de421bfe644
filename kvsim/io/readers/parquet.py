"""Parquet traces (``kvsim convert`` writes them; see :mod:`kvsim.io.trace.parquet` for the columns)."""
from __future__ import annotations

import numpy as np

from kvsim.io.trace.builder import OUT_DEFAULT, OUT_KNOWN_IDS, OUT_LOGGED, Part
from kvsim.io.trace.parquet import CATEGORICAL, ParquetColumns, is_parquet
from kvsim.io.readers.base import LoadContext, Reader
from kvsim.io.source import Source
from kvsim.errors import InputError
from kvsim.io.fields import MAX_LENGTH
from kvsim.io.trace.columns import narrow_tokens


class ParquetReader(Reader):
    name = "parquet"
    jsonl = False

    @classmethod
    def sniff(cls, src: Source, first_line: str) -> bool:
        return is_parquet(src.path)

    def read(self, src: Source, ctx: LoadContext) -> None:
        cols = ParquetColumns(src.path)
        room = ctx.room()
        n = cols.n if room is None else min(cols.n, room)
        offsets, tokens = cols.offsets[:n + 1], cols.tokens[:int(cols.offsets[n])]
        out_off, out_tokens, known = (cols.id_lists("output_token_ids") if "output_token_ids" in cols.table.column_names
                                      else (np.zeros(cols.n + 1, np.int64), np.zeros(0, np.int64),
                                            np.zeros(cols.n, bool)))
        out_len = np.diff(out_off)[:n]
        logged = cols.column("output_length", "int")
        source = np.where(known[:n], OUT_KNOWN_IDS, OUT_DEFAULT).astype(np.int8)
        if logged is not None:
            output_lengths, source[:] = logged[:n], OUT_LOGGED
        else:
            output_lengths = np.where(known[:n], out_len, 1)
        arrival = cols.column("arrival", "float")
        stored = cols.stored.get("names", {})
        part = Part(
            source=ctx.source_index,
            prompt_lengths=np.diff(offsets),
            output_lengths=np.asarray(output_lengths, np.int64),
            arrival=np.full(n, np.nan) if arrival is None else arrival[:n],
            tokens=narrow_tokens(np.asarray(tokens)),
            out_lengths=out_len.astype(np.int64),
            out_tokens=narrow_tokens(np.asarray(out_tokens[:int(out_off[n])])),
            out_known=known[:n].copy(),
            out_source=source,
        )
        logprobs = cols.column("prompt_logprobs", "bool")
        part.prompt_logprobs = np.zeros(n, bool) if logprobs is None else logprobs[:n]
        start = cols.column("logprob_start_len", "float")  # nulls: none
        part.logprob_start_len = (np.where(part.prompt_logprobs, 0, -1) if start is None  # as a log's default
                                  else np.where(np.isnan(start[:n]), -1, start[:n]).astype(np.int64))
        step = cols.column("arrival_step", "float")  # nulls: none
        if step is not None:
            part.arrival_step = arrival_steps(step[:n], src)
        for column, names in CATEGORICAL.items():
            cats = ctx.builder.categories[column]
            for name in stored.get(names, []):  # the stored order of the names, used or not
                cats.code(name)
            values = cols.strings(column)
            if values is not None:
                part.codes[column] = np.fromiter((cats.code(v) for v in values[:n]), np.int32, count=n)
        ids = cols.strings("request_id")
        if ids is not None:
            part.request_ids = ids[:n]
        msgs = cols.role_lists()
        if msgs is not None:
            m_off, starts, roles = msgs
            for name in stored.get("role_names", []):
                ctx.builder.roles.code(name)
            part.msg_counts = np.diff(m_off)[:n]
            part.msg_starts = starts[:int(m_off[n])]
            part.msg_roles = np.fromiter((ctx.builder.roles.code(r) for r in roles[:int(m_off[n])]), np.int32)
        ctx.requests += n
        if ctx.recorded is None:
            ctx.recorded = cols.stored.get("meta") or {}
        ctx.builder.add(part)


def arrival_steps(values: np.ndarray, src: Source) -> np.ndarray:
    """The ``arrival_step`` column (nulls: none); a value that is no integer >= 0 is an error."""
    known = ~np.isnan(values)
    bad = known & ((values < 0) | (values != np.floor(values)) | (values > MAX_LENGTH))
    if bad.any():
        row = int(np.argmax(bad))
        raise InputError(src.path, f"row {row + 1}: arrival_step must be an integer >= 0, got {values[row]!r}")
    return np.where(known, values, -1).astype(np.int64)
