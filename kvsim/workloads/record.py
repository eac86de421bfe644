"""One generated request, as a line of an OpenAI-style chat request log (format 1)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

# Key order of a written line; fields that are None are left out.
CHAT_FIELDS = ("messages", "model", "timestamp", "tenant", "cache_salt", "lora", "session_id",
               "request_id", "max_tokens", "output_length", "response")

DEFAULT_MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"


def msg(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


@dataclass
class ChatRequest:
    """A chat completion request with the reply the server gave to it.

    ``output_length`` is the reply's length in tokens as the server would log it (the
    ``response`` text is about that many cl100k tokens); ``timestamp`` is the arrival
    time in seconds from the start of the trace.
    """

    messages: list[dict[str, str]]
    response: str
    output_length: int
    max_tokens: int
    timestamp: float = 0.0
    request_id: str = ""
    session_id: str | None = None
    tenant: str | None = None
    cache_salt: str | None = None
    lora: str | None = None
    model: str = DEFAULT_MODEL

    def with_(self, **changes: Any) -> ChatRequest:
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """The log line as a dict with a fixed key order (``None`` fields omitted)."""
        out: dict[str, Any] = {}
        for name in CHAT_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


def round_time(t: float) -> float:
    """Timestamps are written with millisecond resolution."""
    return round(t, 3)


def finalize(requests: list[ChatRequest], prefix: str) -> list[ChatRequest]:
    """Requests in arrival order (ties keep generation order), times rounded to the
    millisecond, request ids ``<prefix>-00000``, ``<prefix>-00001``, ..."""
    for r in requests:
        r.timestamp = round_time(r.timestamp)
    ordered = sorted(requests, key=lambda r: r.timestamp)  # stable
    for i, r in enumerate(ordered):
        r.request_id = f"{prefix}-{i:05d}"
    return ordered
