"""Pre-tokenized logs: ``{"prompt_token_ids": [...], "output_token_ids": [...], ...}``
(what ``kvsim inspect --export`` writes).

Large files take a fast path: a compiled scanner (:mod:`kvsim.io.readers.token_scan`) reads the two id
arrays of each line straight into integer arrays, and only the rest of the line (the arrays
cut out) goes through the JSON parser and the usual field validation. A line the scanner
does not fully understand, or whose rest is not valid, is read by the general reader, which
also writes the error: both paths give the same trace, or the same error, on the same bytes.
"""
from __future__ import annotations

from typing import Any, ClassVar

from kvsim.io.tokenize.encode import PendingRequest
from kvsim.io.fields import BadRecord, common_fields, token_ids
from kvsim.io.readers.base import JsonRequestReader, LoadContext
from kvsim.io.source import UTF8_BOM, Source, parse_json


class TokensReader(JsonRequestReader):
    name = "tokens"
    batch_requests = 16384
    #: files at least this large (bytes on disk) take the compiled fast path
    fast_min_bytes: ClassVar[int] = 1 << 20

    @classmethod
    def matches(cls, record: Any) -> bool:
        return isinstance(record, dict) and "prompt_token_ids" in record

    def requests(self, rec: dict, line: int, src: Source, ctx: LoadContext) -> list[PendingRequest]:
        if rec.get("prompt_token_ids") is None:
            raise BadRecord("missing prompt_token_ids")
        ids = token_ids(rec["prompt_token_ids"], "prompt_token_ids")
        return [self.pending(common_fields(rec), ctx, prompt_ids=ids)]

    def read(self, src: Source, ctx: LoadContext) -> None:
        if src.size < self.fast_min_bytes or src.first_char() != "{":
            super().read(src, ctx)
        elif not self._read_fast(src, ctx):
            super().read(src, ctx)

    # -- the fast path --------------------------------------------------------------------
    def _read_fast(self, src: Source, ctx: LoadContext) -> bool:
        """Read ``src`` with the scanner (False: the general reader must read the whole file)."""
        from kvsim.io.readers.token_scan import Scratch, ScannedBlock

        scratch = Scratch()
        return self.read_scanned(src, ctx, lambda block: ScannedBlock(block, scratch), self._fast_requests)

    def _fast_requests(self, block, scan, k: int, line: int, ctx: LoadContext) -> list[PendingRequest] | None:
        """The request of a scanned line, or None if the general reader must read it."""
        a, b = int(scan.bounds[k]), int(scan.bounds[k + 1])
        ps, pe, os_, oe = (int(x) for x in scan.spans[k])
        cuts = sorted((s, e) for s, e in ((ps, pe), (os_, oe)) if s >= 0)
        pieces, pos = [], a
        for s, e in cuts:  # the line with each id array replaced by a 0
            pieces.append(block[pos:s].tobytes())
            pieces.append(b"0")
            pos = e
        pieces.append(block[pos:b].tobytes())
        rest = b"".join(pieces)
        if line == 1 and rest.startswith(UTF8_BOM):
            return None
        try:
            rec = parse_json(rest.decode("utf-8"))
            if not isinstance(rec, dict):
                return None
            if os_ >= 0:
                rec["output_token_ids"] = None  # read by the scanner
            fields = common_fields(rec)
        except (UnicodeDecodeError, BadRecord):
            return None  # the general reader reports it
        if os_ >= 0:
            fields.output_ids = scan.outputs[scan.output_offsets[k]:scan.output_offsets[k + 1]]
        prompt = scan.tokens[scan.token_offsets[k]:scan.token_offsets[k + 1]]
        return [self.pending(fields, ctx, prompt_ids=prompt)]
