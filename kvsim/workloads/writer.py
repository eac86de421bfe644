"""Writing generated requests as JSONL: chat request logs (format 1) or the same log
pre-tokenized (format 3), plain or gzip, byte-identical for the same input."""
from __future__ import annotations

import gzip
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator, Sequence

from kvsim.errors import ConfigError, KvsimError
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


def token_lines(requests: Sequence[ChatRequest], tokenizer: str = "cl100k_base",
                chat_template: str = "llama3") -> Iterator[str]:
    """Format 3: each request's messages rendered with ``chat_template`` (generation prompt
    included) and tokenized with ``tokenizer``, as the server would prefill them; the reply
    tokenized and ended with the template's end-of-turn token, as the server generated it."""
    from kvsim.io.templates import get_template
    from kvsim.io.tokenizers import get_tokenizer

    template = get_template(chat_template)
    tok = get_tokenizer(tokenizer, template.special_tokens)
    for start in range(0, len(requests), _BATCH):
        batch = requests[start:start + _BATCH]
        prompts = tok.encode_batch([template.render(
            [(m["role"], m["content"]) for m in r.messages]).text for r in batch])
        outputs = tok.encode_batch([r.response + template.eot for r in batch])
        for r, prompt, output in zip(batch, prompts, outputs):
            rec: dict[str, Any] = {"prompt_token_ids": prompt, "output_token_ids": output}
            full = {**r.to_json(), "output_length": len(output)}
            rec.update((k, full[k]) for k in TOKEN_FIELDS if k in full)
            yield _dumps(rec)


def _open_target(raw: IO[bytes], gz: bool) -> IO[bytes]:
    # mtime=0 and no file name in the gzip header keep .gz output byte-identical.
    return gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) if gz else raw


def write_requests(requests: Sequence[ChatRequest], path: str | Path, *, fmt: str = "chat",
                   tokenizer: str = "cl100k_base", chat_template: str = "llama3",
                   force: bool = False) -> WriteSummary:
    """Write ``requests`` to ``path`` (gzip when it ends in ``.gz``).

    Refuses to replace an existing file unless ``force``; writes to a temporary file in
    the same folder and renames it, so a failure never leaves a half-written file.
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise ConfigError(f"unknown output format {fmt!r}; use chat or tokens")
    if path.exists() and not force:
        raise KvsimError(f"{path} already exists; pass --force to overwrite it")
    if path.exists() and not path.is_file():
        raise KvsimError(f"{path} exists and is not a file")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KvsimError(f"cannot create folder {path.parent}: {e.strerror}") from None
    lines = chat_lines(requests) if fmt == "chat" else token_lines(requests, tokenizer, chat_template)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            out = _open_target(raw, path.name.endswith(".gz"))
            for line in lines:
                out.write(line.encode("utf-8") + b"\n")
            if out is not raw:
                out.close()
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return WriteSummary(path=path, requests=len(requests), format=fmt, bytes=path.stat().st_size,
                        tokenizer=tokenizer if fmt == "tokens" else None,
                        chat_template=chat_template if fmt == "tokens" else None)
