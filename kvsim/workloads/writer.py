"""Writing generated requests as JSONL: chat request logs (format 1) or the same log
pre-tokenized (format 3), plain or gzip, byte-identical for the same input."""
from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvsim.errors import ConfigError
from kvsim.workloads.record import ChatRequest

FORMATS = ("chat", "tokens")
TOKEN_FIELDS = ("output_length", "timestamp", "cache_salt", "lora", "tenant", "session_id",
                "request_id")
_BATCH = 256


@dataclass(frozen=True)
class WriteSummary:
    path: Path
    requests: int
    format: str
    bytes: int
    tokenizer: str | None = None
    chat_template: str | None = None


def _dumps(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def chat_lines(requests: Sequence[ChatRequest]) -> Iterator[str]:
    """Format 1: one OpenAI-style chat request (with its reply) per line."""
    for r in requests:
        yield _dumps(r.to_json())


class Encoder:
    """The server's view of a request: a chat template and a tokenizer (kvsim.io's)."""

    def __init__(self, tokenizer: str = "cl100k_base", chat_template: str = "llama3") -> None:
        from kvsim.io.tokenize.templates import get_template
        from kvsim.io.tokenize.tokenizers import get_tokenizer

        self.template = get_template(chat_template)
        self.tokenizer = get_tokenizer(tokenizer, self.template.special_tokens)

    def outputs(self, requests: Sequence[ChatRequest]) -> list[list[int]]:
        """The generated tokens: the reply, then the end-of-turn token the model stopped on."""
        return self.tokenizer.encode_batch([r.response + self.template.eot for r in requests])

    def prompts(self, requests: Sequence[ChatRequest]) -> list[list[int]]:
        """The prefilled tokens: messages rendered with the generation prompt, tokenized."""
        return self.tokenizer.encode_batch([self.template.render(
            [(m["role"], m["content"]) for m in r.messages]).text for r in requests])


def count_outputs(requests: Sequence[ChatRequest], encoder: Encoder) -> list[ChatRequest]:
    """Copies of ``requests`` whose ``output_length`` is the exact number of generated
    tokens (reply + end-of-turn) under ``encoder``, as a server logs it."""
    out: list[ChatRequest] = []
    for start in range(0, len(requests), _BATCH):
        batch = requests[start:start + _BATCH]
        out += [r.with_(output_length=len(o)) for r, o in zip(batch, encoder.outputs(batch))]
    return out


def token_lines(requests: Sequence[ChatRequest], encoder: Encoder) -> Iterator[str]:
    """Format 3: each request's messages rendered with the chat template (generation prompt
    included) and tokenized, as the server would prefill them; the reply tokenized and
    ended with the template's end-of-turn token, as the server generated it."""
    for start in range(0, len(requests), _BATCH):
        batch = requests[start:start + _BATCH]
        for r, prompt, output in zip(batch, encoder.prompts(batch), encoder.outputs(batch)):
            rec: dict[str, Any] = {"prompt_token_ids": prompt, "output_token_ids": output}
            full = {**r.to_json(), "output_length": len(output)}
            rec.update((k, full[k]) for k in TOKEN_FIELDS if k in full)
            yield _dumps(rec)


def write_requests(requests: Sequence[ChatRequest], path: str | Path, *, fmt: str = "chat",
                   tokenizer: str = "cl100k_base", chat_template: str = "llama3",
                   force: bool = False) -> WriteSummary:
    """Write ``requests`` to ``path`` (gzip when it ends in ``.gz``).

    Each ``output_length`` is the exact count of generated tokens (reply + end-of-turn)
    with ``tokenizer`` and ``chat_template``, in both formats.

    Refuses to replace an existing file unless ``force``; writes to a temporary file in
    the same folder and renames it, so a failure never leaves a half-written file.
    """
    from kvsim.outputs import check_output_path, write_lines_atomic

    path = Path(path)
    if fmt not in FORMATS:
        raise ConfigError(f"unknown output format {fmt!r}; use chat or tokens")
    check_output_path(path, force=force)   # a missing folder is created when the file is written
    encoder = Encoder(tokenizer, chat_template)
    if fmt == "chat":
        lines = chat_lines(count_outputs(requests, encoder))
    else:
        lines = token_lines(requests, encoder)
    write_lines_atomic(path, (line + "\n" for line in lines))
    return WriteSummary(path=path, requests=len(requests), format=fmt, bytes=path.stat().st_size,
                        tokenizer=encoder.tokenizer.name, chat_template=chat_template)
