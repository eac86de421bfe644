"""WEKA / Claude Code traces from kv-cache-tester: one JSON object per file.

``{"id", "block_size": 64, "hash_id_scope": "local", "requests": [{"t", "type", "in", "out",
"hash_ids", ...}, ...]}``: ``floor(in / block_size)`` ids, so a partial last block has no id
(its tokens are synthesized to match nothing). One session per file. Sub-agent records
(``type: "subagent"``) nest their own ``requests``; they are skipped unless the reader
option ``subagents=True`` is given (their times are offset by the sub-agent's start).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from kvsim.errors import InputError
from kvsim.io.trace.builder import OUT_LOGGED, Part
from kvsim.io.fields import BadRecord, kind, length, require_object, timestamp
from kvsim.io.hashids import HashIdPrompts
from kvsim.io.readers.base import LoadContext, Reader
from kvsim.io.readers.mooncake import hash_id_list
from kvsim.io.source import Source
from kvsim.io.trace.columns import NONE


def _block_size(doc: dict) -> int:
    """A document's block size (its requests must be a list)."""
    B = length(doc.get("block_size"), "block_size", positive=True)
    reqs = doc.get("requests")
    if not isinstance(reqs, list):
        raise BadRecord("requests must be a list" if reqs is not None else "missing requests")
    return B


class KvcacheTesterReader(Reader):
    name = "kvcache-tester"

    @classmethod
    def matches(cls, record: Any) -> bool:
        return isinstance(record, dict) and "requests" in record and "block_size" in record

    def read(self, src: Source, ctx: LoadContext) -> None:
        subagents = bool(ctx.options.get("subagents", False))
        for line, (doc, B) in self.parsed(src, ctx, lambda doc, line: (doc, _block_size(doc)), until_full=False):
            self._read_doc(doc, B, src, line, ctx, subagents)

    def _read_doc(self, doc: dict, B: int, src: Source, line: int, ctx: LoadContext, subagents: bool) -> None:
        name = doc.get("id") if isinstance(doc.get("id"), str) else src.path.stem
        cols: dict[str, list] = {k: [] for k in ("in", "out", "t", "count", "session")}
        ids: list[int] = []
        skipped_sub = [0, 0]  # sub-agent records, their requests

        def walk(reqs: list, t0: float, session: str, where: str) -> None:
            for i, r in enumerate(reqs):
                if ctx.full():
                    return
                w = f"{where}[{i}]"
                try:
                    r = require_object(r)
                    if r.get("type") == "subagent":
                        inner = r.get("requests")
                        if not isinstance(inner, list):
                            raise BadRecord(f"{w}: sub-agent record without a requests list")
                        if not subagents:
                            skipped_sub[0] += 1
                            skipped_sub[1] += _count_requests(inner)
                            continue
                        agent = r.get("agent_id") if isinstance(r.get("agent_id"), str) else f"agent{i}"
                        walk(inner, t0 + _time(r, w), f"{session}/{agent}", f"{w}.requests")
                        continue
                    n_in = length(r.get("in"), f"{w}.in", positive=True)
                    n_out = length(r.get("out"), f"{w}.out")
                    h = hash_id_list(r.get("hash_ids"), f"{w}.hash_ids")
                    if len(h) != n_in // B:
                        raise BadRecord(f"{w}: {len(h)} hash_ids for in={n_in}, expected "
                                        f"floor({n_in}/{B}) = {n_in // B}")
                    t = t0 + _time(r, w)
                except BadRecord as e:
                    ctx.bad(InputError(src.path, str(e), line))
                    continue
                cols["in"].append(n_in)
                cols["out"].append(n_out)
                cols["t"].append(t)
                cols["count"].append(len(h))
                cols["session"].append(ctx.builder.categories["session"].code(session))
                ids.extend(h)
                ctx.requests += 1

        walk(doc["requests"], 0.0, name, "requests")
        if skipped_sub[0]:
            ctx.notes.append(f"{src.path.name}: {skipped_sub[0]} sub-agent record(s) with "
                             f"{skipped_sub[1]} nested request(s) skipped (reader option subagents=True "
                             "includes them)")
        ctx.hash_block_sizes.append(B)
        n = len(cols["in"])
        in_len = np.asarray(cols["in"], np.int64)
        ctx.builder.add(Part(
            source=ctx.source_index,
            prompt_lengths=in_len,
            output_lengths=np.asarray(cols["out"], np.int64),
            arrival=np.asarray(cols["t"], np.float64),
            synth=HashIdPrompts(B, in_len, np.asarray(cols["count"], np.int64),
                                np.asarray(ids, np.int64), tail_has_id=False),
            out_source=np.full(n, OUT_LOGGED, np.int8),
            codes={"session": np.asarray(cols["session"], np.int32).reshape(-1) if n
                   else np.full(0, NONE, np.int32)},
        ))


def _time(r: dict, where: str) -> float:
    t = r.get("t")
    if t is None:
        raise BadRecord(f"{where}: missing t")
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        raise BadRecord(f"{where}.t must be a number of seconds, got {kind(t)}")
    return timestamp(t, f"{where}.t")


def _count_requests(reqs: list) -> int:
    n = 0
    for r in reqs:
        if isinstance(r, dict) and r.get("type") == "subagent" and isinstance(r.get("requests"), list):
            n += _count_requests(r["requests"])
        else:
            n += 1
    return n
