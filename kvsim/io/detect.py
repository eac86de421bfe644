"""Auto-detect a file's input format from its first valid record."""
from __future__ import annotations

from kvsim.errors import InputError
from kvsim.io.trace.parquet import is_parquet
from kvsim.io.readers import READERS
from kvsim.io.source import Source

#: records examined (with --on-error skip) before giving up on detection
MAX_PROBE = 10_000
_KEYS_HINT = ("messages (chat), prompt (completion), prompt_token_ids (tokens), hash_ids + input_length "
              "(mooncake), conversations (sharegpt), requests + block_size (kvcache-tester)")


def detect_format(src: Source, on_error: str = "fail") -> str:
    """The format name of ``src``. Bad lines before the first valid record fail (or are
    passed over with ``on_error="skip"``; the reader counts them when it reads the file)."""
    if is_parquet(src.path):
        return "parquet"
    first = _first_line(src)
    if first is None:
        raise InputError(src.path, "file holds no data (only blank lines)")
    if isinstance(first, InputError):
        if on_error == "fail":
            raise first
    elif first.lstrip()[:1] not in ("{", "["):
        for reader in READERS.values():
            if not reader.jsonl and reader.sniff(src, first):
                return reader.name
        if ".csv" in src.path.suffixes:
            raise InputError(src.path, "not a known CSV trace (an Azure trace CSV starts with "
                             "TIMESTAMP,ContextTokens,GeneratedTokens)", 1)
    for probed, (line, rec) in enumerate(src.records()):
        if probed >= MAX_PROBE:
            break
        problem: InputError | None = None
        if isinstance(rec, InputError):
            problem = rec
        elif not isinstance(rec, dict):
            problem = InputError(src.path, f"expected a JSON object per line, got {type(rec).__name__}", line)
        else:
            for reader in READERS.values():
                if reader.jsonl and reader.matches(rec):
                    return reader.name
            keys = ", ".join(sorted(map(str, rec))[:8]) or "none"
            problem = InputError(src.path, f"cannot tell the input format from this record's keys ({keys}); "
                                 f"expected {_KEYS_HINT}, or give --format", line)
        if on_error == "fail":
            raise problem
    raise InputError(src.path, "no valid record to detect the format from; give --format")


def _first_line(src: Source) -> str | InputError | None:
    for _, text in src.lines():
        return text
    return None
