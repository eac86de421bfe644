"""Response bodies and server-sent event streams, shaped as vLLM's OpenAI server shapes
them (``chat_completion/protocol.py``, ``completion/protocol.py``): the same objects and
fields, ``usage.prompt_tokens_details.cached_tokens`` always filled in, one SSE chunk per
generated token, then the usage chunk (``choices: []``) when ``stream_options.include_usage``
asks for it, then ``data: [DONE]``."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Iterator

from kvsim.serve.replies import Reply


@dataclass(frozen=True)
class Answer:
    """One request's answer: who asked, what was generated, what the cache reused."""

    kind: str                 # "chat" or "completion"
    request_id: str
    model: str
    prompt_ids: list[int]
    reply: Reply
    cached_tokens: int
    return_token_ids: bool = False
    created: int = 0

    def usage(self, completion_tokens: int | None = None) -> dict[str, Any]:
        k = len(self.reply.token_ids) if completion_tokens is None else completion_tokens
        n = len(self.prompt_ids)
        return {"prompt_tokens": n, "total_tokens": n + k, "completion_tokens": k,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


def response_body(a: Answer) -> dict[str, Any]:
    """The non-streaming response object."""
    created = a.created or int(time.time())
    if a.kind == "chat":
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": a.reply.text, "refusal": None, "annotations": None,
                        "audio": None, "function_call": None, "tool_calls": [], "reasoning": None},
            "logprobs": None, "finish_reason": a.reply.finish_reason, "stop_reason": None,
        }
        body: dict[str, Any] = {"id": a.request_id, "object": "chat.completion", "created": created,
                                "model": a.model, "choices": [choice], "service_tier": None,
                                "system_fingerprint": None, "usage": a.usage(), "prompt_logprobs": None}
    else:
        choice = {"index": 0, "text": a.reply.text, "logprobs": None, "finish_reason": a.reply.finish_reason,
                  "stop_reason": None, "prompt_logprobs": None}
        body = {"id": a.request_id, "object": "text_completion", "created": created, "model": a.model,
                "choices": [choice], "service_tier": None, "system_fingerprint": None, "usage": a.usage()}
    if a.return_token_ids:
        choice["token_ids"] = list(a.reply.token_ids)
        body["prompt_token_ids"] = list(a.prompt_ids)
    return body


def sse_events(a: Answer, include_usage: bool, continuous_usage: bool) -> Iterator[str]:
    """The SSE stream of an answer, one ``data:`` event per string."""
    created = a.created or int(time.time())
    chat = a.kind == "chat"
    head = {"id": a.request_id, "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created, "model": a.model}
    pieces = a.reply.pieces
    last = len(pieces) - 1

    def event(choices: list, generated: int | None = None, **extra: Any) -> str:
        chunk = {**head, "choices": choices, **extra}
        if continuous_usage and generated is not None:
            chunk["usage"] = a.usage(generated)
        return "data: " + json.dumps(chunk, ensure_ascii=False, separators=(",", ":")) + "\n\n"

    if chat:
        first: dict[str, Any] = {"role": "assistant", "content": ""}
        yield event([{"index": 0, "delta": first, "logprobs": None, "finish_reason": None}], 0,
                    **({"prompt_token_ids": list(a.prompt_ids)} if a.return_token_ids else {}))
    for i, piece in enumerate(pieces):
        finish = a.reply.finish_reason if i == last else None
        if chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": piece}, "logprobs": None,
                                      "finish_reason": finish}
        else:
            choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}
        if a.return_token_ids:
            choice["token_ids"] = [a.reply.token_ids[i]]
        if finish is not None:
            choice["stop_reason"] = None
        extra = {"prompt_token_ids": list(a.prompt_ids)} if a.return_token_ids and not chat and i == 0 else {}
        yield event([choice], i + 1, **extra)
    if include_usage:
        yield "data: " + json.dumps({**head, "choices": [], "usage": a.usage()}, separators=(",", ":")) + "\n\n"
    yield "data: [DONE]\n\n"
