"""Traces as Parquet files (``kvsim convert``, and any ``.parquet`` input).

One row per request:

| column | type | |
|---|---|---|
| ``prompt_token_ids`` | list of int32 (int64 if an id needs it) | required |
| ``output_token_ids`` | list, null where the reply's ids are unknown | |
| ``output_length`` | int64 | tokens generated |
| ``arrival`` | float64 seconds, null where unknown | |
| ``tenant``, ``cache_salt``, ``lora``, ``session``, ``request_id`` | string, null for none | |
| ``prompt_logprobs`` | bool | vLLM: the request asks for prompt logprobs |
| ``logprob_start_len`` | int64, null for none | SGLang: where the request's logprobs start |
| ``arrival_step`` | int64, null for none | the engine step the request arrives at (``--replay steps``) |
| ``msg_starts``, ``msg_roles`` | list of int64 / string: token offset and role of each chat message | |

The schema metadata ``kvsim`` (JSON) keeps what the rows do not: how the tokens were made
(tokenizer, chat template, hash-id block size), the notes, and the order of the names, so
that writing and reading back is lossless. A Parquet file made elsewhere needs only
``prompt_token_ids``; a missing ``output_length`` is the number of output ids, else 1.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.errors import ConfigError, InputError
from kvsim.io.trace.columns import NONE, Trace

PARQUET_MAGIC = b"PAR1"
METADATA_KEY = b"kvsim"
VERSION = 1
CATEGORICAL = {"tenant": "tenant_names", "cache_salt": "salt_names", "lora": "lora_names",
               "session": "session_names"}


def pyarrow():
    try:
        import pyarrow as pa
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise ConfigError("Parquet traces need the optional package 'pyarrow' "
                          "(pip install 'kvsim[parquet]')") from None
    return pa


#: numpy's names of the Arrow floating types (the others are spelt alike)
_NUMPY_NAMES = {"double": "float64", "float": "float32", "halffloat": "float16"}


def numpy_of(values) -> tuple[np.ndarray, np.ndarray | None]:
    """A fixed-width Arrow array (or chunked array) as numpy, read from its buffers, and where
    it is null (None: nowhere). pyarrow's own ``to_numpy`` imports pandas, about 0.15 s of a
    command that reads a Parquet trace."""
    pa = pyarrow()
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    n, off = len(values), values.offset
    if pa.types.is_null(values.type):   # a column of nulls only
        return np.zeros(n), np.ones(n, bool)
    validity, data = values.buffers()[:2]

    def bits(buf) -> np.ndarray:
        return np.unpackbits(np.frombuffer(buf, np.uint8), bitorder="little")[off:off + n].astype(bool)
    null = ~bits(validity) if values.null_count else None
    if pa.types.is_boolean(values.type):
        return (bits(data) if n else np.zeros(0, bool)), null
    dtype = np.dtype(_NUMPY_NAMES.get(str(values.type), str(values.type)))
    out = np.frombuffer(data, dtype, count=n, offset=off * dtype.itemsize) if n else np.zeros(0, dtype)
    return out, null


def is_parquet(path: Path) -> bool:
    """Does the file start and end with Parquet's magic bytes?"""
    try:
        with open(path, "rb") as f:
            if f.read(4) != PARQUET_MAGIC:
                return False
            f.seek(-4, os.SEEK_END)
            return f.read(4) == PARQUET_MAGIC
    except OSError:
        return False


# -- writing ---------------------------------------------------------------------------------
def trace_table(trace: Trace):
    """The trace as a pyarrow Table (zero-copy for the token arrays)."""
    pa = pyarrow()
    tokens = trace.require_tokens("Parquet output")
    n = len(trace)
    known = np.asarray(trace.output_known, bool)
    cols: dict[str, Any] = {
        "prompt_token_ids": pa.LargeListArray.from_arrays(pa.array(trace.offsets), pa.array(tokens)),
        "output_token_ids": pa.LargeListArray.from_arrays(pa.array(trace.output_offsets),
                                                          pa.array(trace.output_tokens), mask=pa.array(~known)),
        "output_length": pa.array(trace.output_lengths),
        "arrival": pa.array(trace.arrival, mask=np.isnan(trace.arrival)),
    }
    for column, names in CATEGORICAL.items():
        codes = getattr(trace, column)
        cols[column] = _strings(pa, codes, getattr(trace, names), column)
    if trace.request_ids is not None:
        cols["request_id"] = _text(pa, [str(r) for r in trace.request_ids], "request_id")
    cols["prompt_logprobs"] = pa.array(np.asarray(trace.prompt_logprobs, bool))
    start = np.asarray(trace.logprob_start_len, np.int64)
    cols["logprob_start_len"] = pa.array(start, mask=start < 0)
    step = np.asarray(trace.arrival_step, np.int64)
    if (step >= 0).any():
        cols["arrival_step"] = pa.array(step, mask=step < 0)
    if trace.msg_offsets is not None:
        cols["msg_starts"] = pa.LargeListArray.from_arrays(pa.array(trace.msg_offsets), pa.array(trace.msg_starts))
        roles = _strings(pa, trace.msg_roles, trace.role_names, "msg_roles").cast(pa.string())
        cols["msg_roles"] = pa.LargeListArray.from_arrays(pa.array(trace.msg_offsets), roles)
    meta = {"version": VERSION, "meta": asdict(trace.meta), "requests": n,
            "names": {names: getattr(trace, names) for names in (*CATEGORICAL.values(), "role_names")}}
    table = pa.table(cols)
    return table.replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode("utf-8", "surrogatepass")})


def _strings(pa, codes: np.ndarray, names: list[str], column: str):
    codes = np.asarray(codes, np.int32)
    missing = codes == NONE
    dictionary = _text(pa, names, column)
    return pa.DictionaryArray.from_arrays(pa.array(np.where(missing, 0, codes), pa.int32(), mask=missing), dictionary)


def _text(pa, values: list[str], column: str):
    try:
        return pa.array(values, pa.string())
    except (UnicodeEncodeError, pa.ArrowException):
        raise ConfigError(f"cannot write column {column} to Parquet: a value is not valid Unicode text "
                          "(a lone surrogate from a \\ud800-style escape); Parquet strings are UTF-8") from None


def write_parquet(trace: Trace, path: str | Path) -> int:
    """Write ``trace`` to ``path`` (via a temporary file renamed into place); returns rows."""
    import pyarrow.parquet as pq

    from kvsim.outputs import atomic_path

    table = trace_table(trace)
    with atomic_path(Path(path)) as tmp:
        pq.write_table(table, str(tmp), compression="zstd")
    return len(trace)


# -- reading ---------------------------------------------------------------------------------
class ParquetColumns:
    """The columns of a Parquet trace as numpy arrays and names, checked."""

    def __init__(self, path: Path) -> None:
        pa = pyarrow()
        import pyarrow.parquet as pq

        self.path = path
        try:
            table = pq.ParquetFile(path).read()   # (read_table goes through pyarrow.dataset, which imports pandas)
        except (OSError, pa.ArrowException) as e:
            raise InputError(path, f"cannot read Parquet file ({_short(e)})") from None
        raw = (table.schema.metadata or {}).get(METADATA_KEY)
        try:
            self.stored = json.loads(raw.decode("utf-8", "surrogatepass")) if raw else {}
        except ValueError:
            self.stored = {}
        self.table = table
        self.n = table.num_rows
        if "prompt_token_ids" not in table.column_names:
            raise InputError(path, "a Parquet trace needs a prompt_token_ids column (a list of token ids per row)")
        self.offsets, self.tokens, _ = self.id_lists("prompt_token_ids", required=True)

    def id_lists(self, name: str, required: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(offsets, values, present) of a list-of-integers column; null rows are empty."""
        pa = pyarrow()
        col = self.table.column(name)
        if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)) \
                or not pa.types.is_integer(col.type.value_type):
            raise InputError(self.path, f"column {name} must hold lists of integer token ids, not {col.type}")
        arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        if pa.types.is_list(arr.type):
            arr = arr.cast(pa.large_list(arr.type.value_type))  # 64-bit offsets
        null = numpy_of(arr.is_null())[0]
        present = ~null
        if required and not present.all():
            raise InputError(self.path, f"row {int(np.flatnonzero(null)[0])}: {name} is null")
        # a null row may still span values: rebuild the offsets with those rows empty
        offsets = np.asarray(numpy_of(arr.offsets)[0], np.int64)
        lengths = np.where(present, np.diff(offsets), 0)
        values, null_ids = numpy_of(arr.values)
        if null_ids is not None and null_ids[offsets[0]:offsets[-1]][np.repeat(present, np.diff(offsets))].any():
            raise InputError(self.path, f"{name} holds a null id")
        if not present.all():
            keep = np.repeat(present, np.diff(offsets))
            values = values[keep]
        elif offsets[0] != 0 or offsets[-1] != len(values):
            values = values[offsets[0]:offsets[-1]]
        new = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=new[1:])
        if values.size and int(values.min()) < 0:
            raise InputError(self.path, f"{name} holds a negative id ({int(values.min())})")
        if values.dtype == np.uint64:
            if values.size and int(values.max()) >= 2**63:
                raise InputError(self.path, f"{name} holds an id too large for 64 bits")
            values = values.astype(np.int64)
        return new, values, present

    def column(self, name: str, kind: str) -> np.ndarray | None:
        if name not in self.table.column_names:
            return None
        col = self.table.column(name)
        try:
            if kind == "float":
                values, null = numpy_of(col.cast(pyarrow().float64()))
                return values if null is None else np.where(null, np.nan, values)
            if kind == "int":
                values, null = numpy_of(col)
                if null is not None:
                    raise ValueError("null values")
                return np.asarray(values, np.int64)
            if kind == "bool":
                values, null = numpy_of(col)
                return np.asarray(values if null is None else values & ~null, bool)
        except (ValueError, TypeError, pyarrow().ArrowException) as e:
            raise InputError(self.path, f"column {name} ({col.type}) is not {kind} ({_short(e)})") from None
        raise AssertionError(kind)

    def strings(self, name: str) -> list[str | None] | None:
        """A string (or integer) column as Python strings, None for nulls."""
        if name not in self.table.column_names:
            return None
        col = self.table.column(name)
        pa = pyarrow()
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_integer(col.type)):
            raise InputError(self.path, f"column {name} must hold strings, not {col.type}")
        return [None if v is None else str(v) for v in col.to_pylist()]

    def role_lists(self) -> tuple[np.ndarray, np.ndarray, list[str]] | None:
        if "msg_starts" not in self.table.column_names or "msg_roles" not in self.table.column_names:
            return None
        offsets, starts, _ = self.id_lists("msg_starts")
        roles = self.table.column("msg_roles").combine_chunks()
        flat = roles.flatten()
        if len(flat) != len(starts):
            raise InputError(self.path, "msg_starts and msg_roles differ in length")
        return offsets, starts, [str(r) for r in flat.to_pylist()]


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 160 else text[:157] + "..."
