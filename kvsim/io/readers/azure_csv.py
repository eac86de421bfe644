"""Azure LLM inference traces (CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``).

They hold only lengths and arrival times: no tokens and no hash ids, hence no prefix
information. The trace has ``tokens=None`` and is fit for length and arrival statistics only.
"""
from __future__ import annotations

import csv
from typing import Any

import numpy as np

from kvsim.errors import InputError
from kvsim.io.trace.builder import OUT_LOGGED, Part
from kvsim.io.fields import BadRecord, MAX_LENGTH, parse_iso_or_number
from kvsim.io.readers.base import LoadContext, Reader
from kvsim.io.source import Source

COLUMNS = ("timestamp", "contexttokens", "generatedtokens")
NO_PREFIX_NOTE = ("azure-csv traces carry NO prefix information (only lengths and arrival times): "
                  "use them for length/arrival statistics, not for cache hit rates")


def _header(text: str) -> list[str]:
    return [c.strip().lower() for c in next(csv.reader([text]))]


class AzureCsvReader(Reader):
    name = "azure-csv"
    jsonl = False

    @classmethod
    def sniff(cls, src: Source, first_line: str) -> bool:
        try:
            header = _header(first_line)
        except csv.Error:  # e.g. a carriage return inside the line: not a CSV header
            return False
        return all(c in header for c in COLUMNS[1:])

    def read(self, src: Source, ctx: LoadContext) -> None:
        in_len: list[int] = []
        out_len: list[int] = []
        arrival: list[float] = []
        cols: dict[str, int] | None = None
        for line, text in src.lines():
            if isinstance(text, InputError):
                if cols is None:
                    raise text
                ctx.bad(text)
                continue
            if cols is None:
                try:
                    header = _header(text)
                except csv.Error as e:   # e.g. a carriage return inside the line
                    raise InputError(src.path, f"not an Azure trace CSV: the header is not CSV ({e})", line) from None
                missing = [c for c in COLUMNS if c not in header]
                if missing:
                    raise InputError(src.path, "not an Azure trace CSV: the header lacks "
                                     + ", ".join(missing) + " (expected TIMESTAMP,ContextTokens,GeneratedTokens)",
                                     line)
                cols = {c: header.index(c) for c in COLUMNS}
                width = len(header)
                continue
            if ctx.full():
                break
            try:
                row = next(csv.reader([text]))
                if len(row) != width:
                    raise BadRecord(f"expected {width} columns, got {len(row)}")
                n_in = _int(row[cols["contexttokens"]], "ContextTokens")
                n_out = _int(row[cols["generatedtokens"]], "GeneratedTokens")
                t = parse_iso_or_number(row[cols["timestamp"]])
                if t is None:
                    raise BadRecord(f"TIMESTAMP is not a time ({row[cols['timestamp']][:40]!r})")
            except (BadRecord, csv.Error) as e:
                ctx.bad(InputError(src.path, str(e), line))
                continue
            in_len.append(n_in)
            out_len.append(n_out)
            arrival.append(t)
            ctx.requests += 1
        if cols is None:
            raise InputError(src.path, "file is empty")
        ctx.notes.append(f"{src.path.name}: {NO_PREFIX_NOTE}")
        n = len(in_len)
        ctx.builder.add(Part(
            source=ctx.source_index,
            prompt_lengths=np.asarray(in_len, np.int64),
            output_lengths=np.asarray(out_len, np.int64),
            arrival=np.asarray(arrival, np.float64),
            out_source=np.full(n, OUT_LOGGED, np.int8),
        ))


def _int(text: Any, name: str) -> int:
    try:
        v = int(text.strip())
    except ValueError:
        raise BadRecord(f"{name} is not an integer ({text.strip()[:20]!r})") from None
    if v < 0:
        raise BadRecord(f"{name} is negative ({v})")
    if v > MAX_LENGTH:
        raise BadRecord(f"{name} is implausibly large ({v})")
    return v
