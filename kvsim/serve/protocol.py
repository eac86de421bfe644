"""Request bodies of ``/v1/chat/completions`` and ``/v1/completions``, validated as vLLM
0.33's OpenAI server validates them (``entrypoints/openai/*/protocol.py``,
``sampling_params.py``): the same field types (pydantic, extra fields allowed), the same
``mode="before"`` checks and the same messages and parameter names.

What kvsim serve cannot honour is refused with a 400 naming the field (``n`` > 1, beam
search, ``echo``, a per-request ``chat_template``); sampling settings that only change the
text (temperature, top_p, stop, ...) are checked and otherwise ignored: the reply is
synthetic.
"""
from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from kvsim.serve.errors import ApiError, validation_error

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")
_MAX_CACHE_SALT = 128


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class _Request(BaseModel):
    """Fields shared by chat and completion requests."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = None
    n: int | None = 1
    seed: int | None = Field(None, ge=_INT64_MIN, le=_INT64_MAX)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    use_beam_search: bool = False
    user: str | None = None
    request_id: str | None = None
    cache_salt: str | None = None
    prompt_logprobs: int | None = None
    return_token_ids: bool | None = False
    lora_path: str | None = None          # SGLang: the adapter, when not named in ``model``
    logprob_start_len: int | None = None  # SGLang: where a logprob request's logprobs start
    return_logprob: bool | None = None    # SGLang
    session_id: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _before(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        _check_cache_salt(data.get("cache_salt"))
        if data.get("stream_options") and not data.get("stream"):
            raise ApiError("Stream options can only be defined when `stream=True`.", param="stream_options")
        value = data.get("prompt_logprobs")
        if value is not None:
            if not isinstance(value, (int, float)):
                raise ApiError("`prompt_logprobs` must be an integer.", param="prompt_logprobs")
            if data.get("stream") and (value > 0 or value == -1):
                raise ApiError("`prompt_logprobs` are not available when `stream=True`.", param="prompt_logprobs")
            if value < 0 and value != -1:
                raise ApiError("`prompt_logprobs` must be a positive value or -1.", param="prompt_logprobs")
        return data

    def requested_max_tokens(self) -> tuple[int | None, str]:
        """The client's output budget and the name of the field that gave it."""
        return self.max_tokens, "max_tokens"

    def check_sampling(self) -> None:
        """SamplingParams._verify_args, for the fields a client sends (messages as vLLM's)."""
        n = 1 if self.n is None else self.n
        if n < 1:
            raise ApiError(f"n must be at least 1, got {n}.", param="n")
        if n != 1:
            raise ApiError(f"kvsim serve returns one synthetic reply per request: n must be 1, got {n}.",
                           param="n")
        if self.use_beam_search:
            raise ApiError("kvsim serve does not model beam search (use_beam_search must be false).",
                           param="use_beam_search")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if v is not None and not -2.0 <= v <= 2.0:
                raise ApiError(f"{name} must be in [-2, 2], got {v}.", param=name)
        if self.repetition_penalty is not None and (not math.isfinite(self.repetition_penalty)
                                                    or self.repetition_penalty <= 0.0):
            raise ApiError(f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.",
                           param="repetition_penalty")
        t = self.temperature
        if t is not None:
            if not math.isfinite(t):
                raise ApiError(f"temperature must be a finite number, got {t}.", param="temperature")
            if t < 0.0:
                raise ApiError(f"temperature must be non-negative, got {t}.", param="temperature")
            if t > 2.0:
                raise ApiError(f"temperature must be in [0, 2], got {t}.", param="temperature")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ApiError(f"top_p must be in (0, 1], got {self.top_p}.", param="top_p")
        if self.top_k is not None and self.top_k < -1:
            raise ApiError(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.", param="top_k")
        if self.min_p is not None and not 0.0 <= self.min_p <= 1.0:
            raise ApiError(f"min_p must be in [0, 1], got {self.min_p}.", param="min_p")
        if self.min_tokens < 0:
            raise ApiError(f"min_tokens must be greater than or equal to 0, got {self.min_tokens}.",
                           param="min_tokens")
        value, name = self.requested_max_tokens()
        if value is not None and value < 1:
            raise ApiError(f"max_tokens must be at least 1, got {value}.", param=name)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return self.include_usage and bool(self.stream_options.continuous_usage_stats)


class ChatCompletionRequest(_Request):
    """``POST /v1/chat/completions``."""

    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    echo: bool = False
    chat_template: str | None = None
    tools: list[dict[str, Any]] | None = None

    @model_validator(mode="before")
    @classmethod
    def _chat_before(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        top = data.get("top_logprobs")
        if top is not None:
            if isinstance(top, bool) or not isinstance(top, (int, float)):
                raise ApiError("`top_logprobs` must be an integer.", param="top_logprobs")
            if top < 0 and top != -1:
                raise ApiError("`top_logprobs` must be a positive value or -1.", param="top_logprobs")
            if (top == -1 or top > 0) and not data.get("logprobs"):
                raise ApiError("when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
        if data.get("continue_final_message") and data.get("add_generation_prompt"):
            raise ApiError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        return data

    def requested_max_tokens(self) -> tuple[int | None, str]:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"

    def check_supported(self) -> None:
        """What the chat templates of kvsim cannot render is refused, not guessed."""
        if not self.add_generation_prompt or self.continue_final_message:
            raise ApiError("kvsim serve renders chat prompts with add_generation_prompt=true only.",
                           param="add_generation_prompt")
        if self.echo:
            raise ApiError("kvsim serve does not support echo.", param="echo")
        if self.chat_template is not None:
            raise ApiError("kvsim serve renders with its --chat-template; a per-request chat_template "
                           "is not supported.", param="chat_template")


PromptTokens = list[Annotated[int, Field(ge=0)]]


class CompletionRequest(_Request):
    """``POST /v1/completions`` (``max_tokens`` defaults to 16, as in vLLM)."""

    prompt: PromptTokens | list[PromptTokens] | str | list[str] | None = None
    max_tokens: int | None = 16
    echo: bool | None = False
    suffix: str | None = None
    logprobs: int | None = None
    best_of: int | None = None

    def check_supported(self) -> None:
        if self.echo:
            raise ApiError("kvsim serve does not support echo.", param="echo")
        if self.suffix:
            raise ApiError("kvsim serve does not support suffix.", param="suffix")
        if self.best_of not in (None, 1):
            raise ApiError(f"kvsim serve returns one synthetic reply per request: best_of must be 1, "
                           f"got {self.best_of}.", param="best_of")


def _check_cache_salt(salt: Any) -> None:
    """vLLM ``validate_cache_salt``."""
    if salt is None:
        return
    if not isinstance(salt, str) or not salt:
        raise ApiError("Parameter 'cache_salt' must be a non-empty string if provided.", param="cache_salt")
    if len(salt) > _MAX_CACHE_SALT or any(c in _CACHE_SALT_FORBIDDEN for c in salt):
        raise ApiError("Parameter 'cache_salt' must be at most 128 characters and must not contain "
                       "'@', '/', '\\\\', or NUL.", param="cache_salt")


Kind = Literal["chat", "completion"]
_MODELS: dict[str, type[_Request]] = {"chat": ChatCompletionRequest, "completion": CompletionRequest}


def parse_request(kind: Kind, body: bytes, strict: bool = True) -> _Request:
    """Parse and validate a request body; every problem is an :class:`ApiError` (400).

    ``strict=False`` (proxy mode) checks only what reading the prompt needs: the real
    server judges the rest."""
    try:
        req = _MODELS[kind].model_validate_json(body)  # an ApiError from a validator passes through
    except ValidationError as e:
        raise validation_error(e.errors(include_url=False, include_context=False)) from None
    if strict:
        req.check_sampling()
        req.check_supported()
    return req
