"""Pre-tokenized logs: ``{"prompt_token_ids": [...], "output_token_ids": [...], ...}``
(what ``kvsim inspect --export`` writes)."""
from __future__ import annotations

from typing import Any

from kvsim.io.encode import PendingRequest
from kvsim.io.fields import BadRecord, common_fields, token_ids
from kvsim.io.readers.base import JsonRequestReader, LoadContext
from kvsim.io.source import Source


class TokensReader(JsonRequestReader):
    name = "tokens"
    batch_requests = 16384

    @classmethod
    def matches(cls, record: Any) -> bool:
        return isinstance(record, dict) and "prompt_token_ids" in record

    def requests(self, rec: dict, line: int, src: Source, ctx: LoadContext) -> list[PendingRequest]:
        if rec.get("prompt_token_ids") is None:
            raise BadRecord("missing prompt_token_ids")
        ids = token_ids(rec["prompt_token_ids"], "prompt_token_ids")
        return [self.pending(common_fields(rec), ctx, prompt_ids=ids)]
