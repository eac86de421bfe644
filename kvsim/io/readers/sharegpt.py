"""ShareGPT-style conversations: ``{"id": ..., "conversations": [{"from", "value"}, ...]}``.

Each assistant turn is one request whose prompt is the whole history before it (rendered
with the chat template) and whose known output is that turn's reply; the turns of a
conversation share a session id (the record's ``id``, else file:line).
"""
from __future__ import annotations

from typing import Any

from kvsim.io.tokenize.encode import PendingRequest
from kvsim.io.fields import BadRecord, common_fields, kind
from kvsim.io.readers.base import JsonRequestReader, LoadContext, message_text
from kvsim.io.source import Source

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant",
         "bard": "assistant", "bing": "assistant", "assistant": "assistant", "model": "assistant",
         "system": "system", "tool": "tool", "function": "tool", "observation": "tool"}


class ShareGPTReader(JsonRequestReader):
    name = "sharegpt"

    @classmethod
    def matches(cls, record: Any) -> bool:
        return isinstance(record, dict) and "conversations" in record

    def requests(self, rec: dict, line: int, src: Source, ctx: LoadContext) -> list[PendingRequest]:
        turns = rec.get("conversations")
        if turns is None:
            raise BadRecord("missing conversations")
        if not isinstance(turns, list):
            raise BadRecord(f"conversations must be a list, got {kind(turns)}")
        if not turns:
            raise BadRecord("conversations is empty")
        messages = []
        for i, t in enumerate(turns):
            where = f"conversations[{i}]"
            if not isinstance(t, dict):
                raise BadRecord(f"{where} must be an object, got {kind(t)}")
            who = t.get("from", t.get("role"))
            if not isinstance(who, str):
                raise BadRecord(f"{where} has no 'from'" if who is None else f"{where}.from must be a string")
            role = ROLES.get(who.lower())
            if role is None:
                raise BadRecord(f"{where}.from is {who!r}; expected human/gpt/system (or user/assistant)")
            messages.append((role, message_text(t.get("value", t.get("content")), where, ctx)))
        fields = common_fields(rec)
        conv = fields.request_id
        fields.request_id = None
        fields.session = fields.session or conv or f"{src.path.name}:{line}"
        out = []
        for k, (role, text) in enumerate(messages):
            if role != "assistant":
                continue
            if k == 0:
                ctx.count("ShareGPT conversations open with an assistant turn; that turn has no "
                          "prompt and was not made a request")
                continue
            fields.reply, fields.output_ids, fields.logged_output = text, None, None
            req = self.pending(fields, ctx, reply_eot=True, **self.chat_prompt(messages[:k], ctx))
            req.request_id = None if conv is None else f"{conv}:{k}"
            out.append(req)
        if not out:
            ctx.count("ShareGPT conversations have no assistant turn (no requests)")
        return out
