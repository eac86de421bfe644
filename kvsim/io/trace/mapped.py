"""A :class:`Trace` as one file that is memory-mapped back (the trace cache's entries).

Layout: ``KVSIMTRC``, a little-endian u32 format version, a u64 header length, the header
(JSON: meta, name lists, and for every array its dtype, byte offset and length), then the
arrays' raw bytes, each at a 64-byte aligned offset. Reading maps the file copy-on-write:
the arrays are ordinary numpy arrays over the mapping (pages are read on first touch, and
writing to an array never changes the file). Request ids are stored as UTF-8 text plus
offsets.
"""
from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np

from kvsim.io.trace.columns import Trace, TraceMeta

MAGIC = b"KVSIMTRC"
VERSION = 2   # 2: arrival_step
_ALIGN = 64
_PREFIX = struct.Struct("<8sIQ")
ARRAYS = ("offsets", "tokens", "output_lengths", "arrival", "output_offsets", "output_tokens", "output_known",
          "tenant", "cache_salt", "lora", "session", "prompt_logprobs", "logprob_start_len", "arrival_step", "msg_offsets",
          "msg_starts", "msg_roles")
NAMES = ("tenant_names", "salt_names", "lora_names", "session_names", "role_names")


class TraceFileError(Exception):
    """The file is not a readable trace file of this version."""


def _columns(trace: Trace) -> dict[str, np.ndarray]:
    cols = {name: np.ascontiguousarray(getattr(trace, name)) for name in ARRAYS if getattr(trace, name) is not None}
    if trace.request_ids is not None:
        encoded = [str(r).encode("utf-8", "surrogatepass") for r in trace.request_ids]
        offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        cols["request_id_offsets"] = offsets
        cols["request_id_bytes"] = np.frombuffer(b"".join(encoded), np.uint8)
    return cols


def encode_trace(trace: Trace) -> tuple[bytes, list[np.ndarray]]:
    """``trace`` as a trace file's leading bytes (prefix, header, padding) and the arrays that
    follow them, in order (what :func:`write_encoded` writes)."""
    cols = _columns(trace)
    layout, pos = {}, 0
    for name, arr in cols.items():
        layout[name] = {"dtype": arr.dtype.str, "offset": pos, "length": int(arr.shape[0])}
        pos += -(-arr.nbytes // _ALIGN) * _ALIGN
    header = {"meta": asdict(trace.meta), "names": {n: getattr(trace, n) for n in NAMES},
              "has_tokens": trace.tokens is not None, "arrays": layout}
    raw = json.dumps(header, ensure_ascii=False).encode("utf-8", "surrogatepass")
    start = -(-(_PREFIX.size + len(raw)) // _ALIGN) * _ALIGN
    head = _PREFIX.pack(MAGIC, VERSION, len(raw)) + raw + b"\0" * (start - _PREFIX.size - len(raw))
    return head, list(cols.values())


def write_encoded(f, head: bytes, arrays: list[np.ndarray]) -> int:
    """Write an encoded trace (:func:`encode_trace`) to the open binary file ``f``; returns
    the bytes written."""
    f.write(head)
    written = len(head)
    for arr in arrays:
        f.write(memoryview(arr).cast("B"))
        pad = -(-arr.nbytes // _ALIGN) * _ALIGN - arr.nbytes
        f.write(b"\0" * pad)
        written += arr.nbytes + pad
    return written


def write_trace_file(trace: Trace, f) -> int:
    """Write ``trace`` to the open binary file ``f``; returns the bytes written."""
    return write_encoded(f, *encode_trace(trace))


def read_trace_file(path: str | Path) -> Trace:
    """Map a trace file back into a :class:`Trace` (no copy of the arrays)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < _PREFIX.size:
            raise TraceFileError("too short")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    magic, version, hlen = _PREFIX.unpack_from(buf, 0)
    if magic != MAGIC or version != VERSION or _PREFIX.size + hlen > size:
        raise TraceFileError("not a kvsim trace file of this version")
    try:
        header = json.loads(bytes(buf[_PREFIX.size:_PREFIX.size + hlen]).decode("utf-8", "surrogatepass"))
    except ValueError as e:
        raise TraceFileError(f"bad header ({e})") from None
    start = -(-(_PREFIX.size + hlen) // _ALIGN) * _ALIGN
    cols = {}
    for name, spec in header["arrays"].items():
        dtype = np.dtype(spec["dtype"])
        offset = start + spec["offset"]
        if offset + spec["length"] * dtype.itemsize > size:
            raise TraceFileError(f"array {name} runs past the end of the file")
        cols[name] = np.frombuffer(buf, dtype, spec["length"], offset)
    request_ids = None
    if "request_id_offsets" in cols:
        off, data = cols.pop("request_id_offsets"), cols.pop("request_id_bytes").tobytes()
        request_ids = np.empty(len(off) - 1, dtype=object)
        bounds = zip(off[:-1].tolist(), off[1:].tolist())
        request_ids[:] = [data[a:b].decode("utf-8", "surrogatepass") for a, b in bounds]
    known = {f.name for f in fields(TraceMeta)}
    meta = TraceMeta(**{k: v for k, v in header["meta"].items() if k in known})
    if not header["has_tokens"]:
        cols["tokens"] = None
    return Trace(**cols, request_ids=request_ids, meta=meta, **header["names"])
