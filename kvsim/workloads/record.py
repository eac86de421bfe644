"""One generated request, as a line of an OpenAI-style chat request log (format 1), and
the stream of single-turn requests that several scenarios share."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from kvsim.workloads.arrivals import poisson_stream
from kvsim.workloads.rng import Rng
from kvsim.workloads.text import approx_tokens

if TYPE_CHECKING:
    from kvsim.workloads.registry import Params

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


def answered(messages: list[dict[str, str]], reply: str, *, max_tokens: int, timestamp: float,
             model: str, **labels: str) -> ChatRequest:
    """The request ``messages`` as logged with its ``reply`` (``output_length``: the
    reply's approximate token count); ``labels`` are the optional fields (``session_id``,
    ``tenant``, ``cache_salt``, ``lora``)."""
    return ChatRequest(messages=messages, response=reply, output_length=approx_tokens(reply),
                       max_tokens=max_tokens, timestamp=timestamp, model=model, **labels)


class Turn(NamedTuple):
    """One single-turn exchange: the system prompt, the user's message, the reply and the
    request's labels (``tenant``, ``cache_salt``, ``lora``)."""

    system: str
    user: str
    reply: str
    labels: Mapping[str, str] = {}


def single_turns(p: Params, draw: Rng, prefix: str, max_tokens: int,
                 turn: Callable[[Rng], Turn]) -> list[ChatRequest]:
    """``p.requests`` single-turn requests arriving as a Poisson stream at ``p.rate``, in
    arrival order; ``turn(draw)`` draws each one's content right after its arrival time."""
    assert p.requests is not None and p.rate is not None
    out = []
    for t in poisson_stream(draw, p.requests, p.rate):
        system, user, reply, labels = turn(draw)
        out.append(answered([msg("system", system), msg("user", user)], reply,
                            max_tokens=max_tokens, timestamp=t, model=p.model, **labels))
    return finalize(out, prefix)


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
