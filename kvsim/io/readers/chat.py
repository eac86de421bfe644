"""OpenAI chat request logs: ``{"messages": [{"role", "content"}, ...], ...}``.

The messages are rendered with the chat template (generation prompt appended) and the text
is tokenized; the logged reply, when present, becomes the known output tokens.
"""
from __future__ import annotations

from typing import Any

from kvsim.io.encode import PendingRequest
from kvsim.io.fields import BadRecord, common_fields, kind
from kvsim.io.readers.base import JsonRequestReader, LoadContext, message_text
from kvsim.io.source import Source


def parse_messages(value: Any, ctx: LoadContext, key: str = "messages") -> list[tuple[str, str]]:
    """Validate OpenAI-style messages into (role, content) pairs."""
    if value is None:
        raise BadRecord(f"missing {key}")
    if not isinstance(value, list):
        raise BadRecord(f"{key} must be a list, got {kind(value)}")
    if not value:
        raise BadRecord(f"{key} is empty")
    out = []
    for i, m in enumerate(value):
        if type(m) is dict:  # the common case, checked without building the error context
            role, content = m.get("role"), m.get("content")
            if type(role) is str and role and type(content) is str and not m.get("tool_calls"):
                out.append((role, content))
                continue
        out.append(_message(m, f"{key}[{i}]", ctx))
    return out


def _message(m: Any, where: str, ctx: LoadContext) -> tuple[str, str]:
    if not isinstance(m, dict):
        raise BadRecord(f"{where} must be an object, got {kind(m)}")
    role = m.get("role")
    if not isinstance(role, str) or not role:
        raise BadRecord(f"{where} has no role" if role is None else f"{where}.role must be a string")
    if "content" not in m and not m.get("tool_calls"):
        raise BadRecord(f"{where} has no content")
    if m.get("tool_calls"):
        ctx.count("assistant tool calls are not rendered (only message text is)")
    return role, message_text(m.get("content"), where, ctx)


class ChatReader(JsonRequestReader):
    name = "chat"

    @classmethod
    def matches(cls, record: Any) -> bool:
        return isinstance(record, dict) and "messages" in record

    def requests(self, rec: dict, line: int, src: Source, ctx: LoadContext) -> list[PendingRequest]:
        messages = parse_messages(rec.get("messages"), ctx)
        fields = common_fields(rec)
        return [self.pending(fields, ctx, reply_eot=True, **self.chat_prompt(messages, ctx))]
