"""Write a trace as pre-tokenized JSON Lines (the ``tokens`` input format): token ids,
lengths and ids only, never raw text."""
from __future__ import annotations

import gzip
import json
import math
import os
import tempfile
from pathlib import Path
from typing import IO, Sequence

from kvsim.errors import ConfigError
from kvsim.io.trace import Trace


def check_output_path(path: Path, inputs: Sequence[str | Path], force: bool = False) -> None:
    """Refuse to write onto an input file, or onto an existing file without ``force``."""
    target = path.expanduser().resolve()
    for inp in inputs:
        p = Path(inp).expanduser()
        if p.exists() and (p.resolve() == target or (target.exists() and os.path.samefile(p, target))):
            raise ConfigError(f"refusing to write {path}: it is an input file")
    if target.is_dir():
        raise ConfigError(f"cannot write {path}: it is a directory")
    if target.exists() and not force:
        raise ConfigError(f"{path} exists; pass --force to overwrite it")
    if not target.parent.is_dir():
        raise ConfigError(f"cannot write {path}: folder {target.parent} does not exist")


def write_tokens_jsonl(trace: Trace, path: str | Path) -> int:
    """Write ``trace`` to ``path`` (gzip when it ends in .gz); returns the number of lines.

    The file is written beside the target and renamed into place, so a failure never
    leaves a half-written file under the final name.
    """
    tokens = trace.require_tokens("--export")
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            out: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=6) if path.suffix == ".gz" else raw
            for i in range(len(trace)):
                out.write(_line(trace, tokens, i).encode("utf-8"))
            if out is not raw:
                out.close()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(trace)


def _ids(arr) -> str:
    return "[" + ",".join(map(str, arr.tolist())) + "]"


def _line(trace: Trace, tokens, i: int) -> str:
    parts = [f'"prompt_token_ids":{_ids(tokens[trace.offsets[i]:trace.offsets[i + 1]])}']
    out = trace.output(i)
    if out is not None:
        parts.append(f'"output_token_ids":{_ids(out)}')
    parts.append(f'"output_length":{int(trace.output_lengths[i])}')
    t = float(trace.arrival[i])
    if not math.isnan(t):
        parts.append(f'"timestamp":{json.dumps(t)}')
    for key, col in (("cache_salt", "cache_salt"), ("lora", "lora"), ("tenant", "tenant"),
                     ("session_id", "session")):
        name = trace.name_of(col, int(getattr(trace, col)[i]))
        if name is not None:
            parts.append(f'"{key}":{json.dumps(name)}')
    if trace.request_ids is not None:
        parts.append(f'"request_id":{json.dumps(trace.request_id(i))}')
    if trace.prompt_logprobs[i]:
        parts.append('"prompt_logprobs":true')
    start = int(trace.logprob_start_len[i])
    if start != (0 if trace.prompt_logprobs[i] else -1):  # not what prompt_logprobs alone implies
        parts.append(f'"logprob_start_len":{start}')
    return "{" + ",".join(parts) + "}\n"
