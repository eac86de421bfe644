"""Validation of the fields a log record may carry. Each helper returns the clean value or
raises :class:`BadRecord` with a short description; readers add the file and line."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np

MAX_LENGTH = 2**31 - 1  # longest prompt or output we accept, in tokens


class BadRecord(Exception):
    """A record that cannot be used; the message says why (no file or line yet)."""


def kind(value: Any) -> str:
    """The JSON type name of a value, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def require_object(value: Any) -> dict:
    if not isinstance(value, dict):
        raise BadRecord(f"expected a JSON object, got {kind(value)}")
    return value


def length(value: Any, name: str, *, positive: bool = False) -> int:
    """A non-negative (or positive) integer length; integral floats such as 12.0 are accepted."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if value is None:
            raise BadRecord(f"missing {name}")
        raise BadRecord(f"{name} must be an integer, got {kind(value)}")
    if isinstance(value, float):
        if not value.is_integer():
            raise BadRecord(f"{name} must be an integer, got {value!r}")
        value = int(value)
    if value < 0:
        raise BadRecord(f"{name} is negative ({value})")
    if positive and value == 0:
        raise BadRecord(f"{name} is 0")
    if value > MAX_LENGTH:
        raise BadRecord(f"{name} is implausibly large ({value})")
    return value


def optional_length(rec: dict, *names: str) -> int | None:
    """The first of ``names`` present (not null) in ``rec``, as a length."""
    for name in names:
        value = rec.get(name)
        if value is not None:
            return length(value, name)
    return None


def optional_name(rec: dict, *names: str) -> str | None:
    """An identifier field (tenant, session, ...): a string or an integer, as a string."""
    for name in names:
        value = rec.get(name)
        if value is None or value == "":
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise BadRecord(f"{name} must be a string, got {kind(value)}")
        return str(value)
    return None


def token_ids(value: Any, name: str, *, allow_empty: bool = False) -> np.ndarray:
    """A list of non-negative integer token ids as an int64 array."""
    if not isinstance(value, list):
        raise BadRecord(f"{name} must be a list of integers, got {kind(value)}")
    if not value:
        if allow_empty:
            return np.zeros(0, np.int64)
        raise BadRecord(f"{name} is empty")
    if not all(type(x) is int for x in value):
        bad = next(x for x in value if type(x) is not int)
        raise BadRecord(f"{name} must hold integers only, found {kind(bad)}")
    lo, hi = min(value), max(value)
    if lo < 0:
        raise BadRecord(f"{name} holds a negative id ({lo})")
    if hi >= 2**63:
        raise BadRecord(f"{name} holds an id too large for 64 bits")
    return np.asarray(value, dtype=np.int64)


_FRACTION = re.compile(r"(\.\d{6})\d+")


def timestamp(value: Any, name: str = "timestamp") -> float:
    """Arrival time in seconds: a number of seconds, or an ISO-8601 string (naive = UTC)."""
    if value is None:
        return math.nan
    if isinstance(value, bool):
        raise BadRecord(f"{name} must be seconds or an ISO-8601 string, got a boolean")
    if isinstance(value, (int, float)):
        try:
            t = float(value)
        except OverflowError:
            raise BadRecord(f"{name} is out of range") from None
    elif isinstance(value, str):
        t = parse_iso_or_number(value)
        if t is None:
            raise BadRecord(f"{name} is neither a number nor an ISO-8601 time ({_short(value)})")
    else:
        raise BadRecord(f"{name} must be seconds or an ISO-8601 string, got {kind(value)}")
    if not math.isfinite(t):
        raise BadRecord(f"{name} is not finite ({value!r})")
    return t


def parse_iso_or_number(text: str) -> float | None:
    """Seconds from a numeric string or an ISO-8601 time (more than 6 fraction digits allowed)."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    iso = _FRACTION.sub(r"\1", text)
    if iso.endswith(("Z", "z")):
        iso = iso[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(iso)
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def _short(text: str, n: int = 40) -> str:
    return repr(text if len(text) <= n else text[:n] + "...")


@dataclass(slots=True)
class CommonFields:
    """The optional fields shared by the chat, completion, tokens and ShareGPT formats."""

    arrival: float = math.nan
    tenant: str | None = None
    cache_salt: str | None = None
    lora: str | None = None
    session: str | None = None
    request_id: str | None = None
    max_tokens: int | None = None
    logged_output: int | None = None          # output_tokens / output_length / usage.completion_tokens
    output_ids: np.ndarray | None = None      # logged output token ids
    reply: str | None = None                  # logged reply text
    prompt_logprobs: bool = False             # vLLM: asks for prompt logprobs (skips the cache read)
    logprob_start_len: int = -1               # SGLang: logprob start (-1: none); caps its prefix match
    arrival_step: int = -1                    # engine step the request arrives at (-1: none)
    model: str | None = None


#: the keys :func:`_plain_fields` reads; a record with any other key takes the full path
_PLAIN_KEYS = frozenset({"messages", "prompt", "prompt_token_ids", "model", "timestamp", "session_id",
                         "request_id", "max_tokens", "output_length", "response"})


def common_fields(rec: dict) -> CommonFields:
    """Parse the optional fields of a request record (see the README's input formats)."""
    if rec.keys() <= _PLAIN_KEYS:
        f = _plain_fields(rec)
        if f is not None:
            return f
    return _all_fields(rec)


def _plain_fields(rec: dict) -> CommonFields | None:
    """What :func:`_all_fields` gives for the common record (only the keys above, each of the
    plain type: a finite number, non-empty strings, in-range integer lengths, a reply string),
    with fewer checks; None for anything else."""
    get = rec.get
    return plain_fields(get("timestamp"), get("session_id"), get("request_id"), get("model"), get("max_tokens"),
                        get("output_length"), get("response"))


def plain_fields(t: Any, session: Any, request_id: Any, model: Any, max_tokens: Any, output_length: Any,
                 reply: Any) -> CommonFields | None:
    """:func:`_plain_fields` of a record holding these values (None: absent or null)."""
    f = CommonFields()
    if t is not None:
        if type(t) is not float and type(t) is not int:
            return None
        try:
            t = float(t)
        except OverflowError:
            return None
        if not math.isfinite(t):
            return None
        f.arrival = t
    for v in (session, request_id, model):
        if v is not None and (type(v) is not str or not v):
            return None
    f.session, f.request_id, f.model = session, request_id, model
    for v in (max_tokens, output_length):
        if v is not None and (type(v) is not int or not 0 <= v <= MAX_LENGTH):
            return None
    f.max_tokens, f.logged_output = max_tokens, output_length
    if reply is not None and type(reply) is not str:
        return None
    f.reply = reply
    return f


def _all_fields(rec: dict) -> CommonFields:
    f = CommonFields()
    f.arrival = timestamp(rec.get("timestamp"))
    f.tenant = optional_name(rec, "tenant", "user")
    f.cache_salt = optional_name(rec, "cache_salt")
    f.lora = _lora(rec)
    f.session = optional_name(rec, "session_id")
    f.request_id = optional_name(rec, "request_id", "id")
    f.max_tokens = optional_length(rec, "max_tokens", "max_completion_tokens")
    f.model = optional_name(rec, "model")
    out = rec.get("output_tokens")
    if isinstance(out, list):  # some logs put the generated ids here
        f.output_ids = token_ids(out, "output_tokens", allow_empty=True)
        out = None
    f.logged_output = None if out is None else length(out, "output_tokens")
    if f.logged_output is None:
        f.logged_output = optional_length(rec, "output_length")
    if rec.get("output_token_ids") is not None:
        f.output_ids = token_ids(rec["output_token_ids"], "output_token_ids", allow_empty=True)
    usage = rec.get("usage")
    for name in ("response", "output"):
        value = rec.get(name)
        if value is None:
            continue
        if isinstance(value, str):
            f.reply = value
        elif isinstance(value, dict):
            f.reply, usage = _response_object(value, name, usage)
        else:
            raise BadRecord(f"{name} must be the reply text or an OpenAI response object, got {kind(value)}")
        break
    if f.logged_output is None and usage is not None:
        if not isinstance(usage, dict):
            raise BadRecord(f"usage must be an object, got {kind(usage)}")
        if usage.get("completion_tokens") is not None:
            f.logged_output = length(usage["completion_tokens"], "usage.completion_tokens")
    f.prompt_logprobs, f.logprob_start_len = logprob_fields(rec)
    f.arrival_step = arrival_step(rec)
    return f


def arrival_step(rec: dict) -> int:
    """The optional ``arrival_step``: the engine step a request arrives at (``--replay steps``)."""
    step = rec.get("arrival_step")
    if step is None:
        return -1
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise BadRecord(f"arrival_step must be an integer >= 0, got {step!r}")
    if step > MAX_LENGTH:
        raise BadRecord(f"arrival_step is implausibly large ({step})")
    return step


def logprob_fields(rec: dict) -> tuple[bool, int]:
    """What a record asks of each engine's logprobs: (vLLM prompt logprobs, SGLang start).

    vLLM skips reading the prefix cache when ``prompt_logprobs`` is set (any integer, 0
    included; ``true`` is accepted) or when ``echo`` comes with ``logprobs`` (completions)
    / ``top_logprobs`` (chat). SGLang caps a logprob request's prefix match at its
    ``logprob_start_len`` (``docs/engines/radix.md §2.1``): an explicit value (ignored with
    ``return_logprob: false``, as SGLang ignores it), else 0 for the request that asks for
    prompt logprobs (``prompt_logprobs``, or a completion's ``echo`` with ``logprobs``).
    """
    pl = rec.get("prompt_logprobs")
    if pl is not None and not isinstance(pl, (bool, int)):
        raise BadRecord(f"prompt_logprobs must be a boolean or an integer, got {kind(pl)}")
    asked = pl is not None and pl is not False
    chat = "messages" in rec
    echo = rec.get("echo") is True
    echo_logprobs = rec.get("top_logprobs" if chat else "logprobs")
    vllm = asked or (echo and echo_logprobs is not None and echo_logprobs is not False)
    start = rec.get("logprob_start_len")
    if start is not None:
        if isinstance(start, bool) or not isinstance(start, int) or start < -1:
            raise BadRecord(f"logprob_start_len must be an integer >= -1, got {start!r}")
        if start > MAX_LENGTH:
            raise BadRecord(f"logprob_start_len is implausibly large ({start})")
        if rec.get("return_logprob") is False:
            start = -1
    elif asked or (echo and not chat and bool(echo_logprobs)):
        start = 0
    else:
        start = -1
    return vllm, start


def _lora(rec: dict) -> str | None:
    value = rec.get("lora")
    if isinstance(value, dict):
        return optional_name(value, "lora_name", "name")
    name = optional_name(rec, "lora", "lora_name")
    if name is not None:
        return name
    req = rec.get("lora_request")
    if req is None:
        return None
    if not isinstance(req, dict):
        raise BadRecord(f"lora_request must be an object, got {kind(req)}")
    return optional_name(req, "lora_name")


def _response_object(obj: dict, name: str, usage: Any) -> tuple[str | None, Any]:
    """Reply text and usage of an OpenAI chat/completion response object."""
    if obj.get("usage") is not None:
        usage = obj["usage"]
    choices = obj.get("choices")
    if choices is None:
        return None, usage
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise BadRecord(f"{name}.choices must be a non-empty list of objects")
    choice = choices[0]
    msg = choice.get("message")
    if isinstance(msg, dict):
        content = msg.get("content")
    else:
        content = choice.get("text")
    if content is not None and not isinstance(content, str):
        raise BadRecord(f"{name}.choices[0] content must be a string, got {kind(content)}")
    return content, usage
