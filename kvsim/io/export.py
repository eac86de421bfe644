"""Write a trace as pre-tokenized JSON Lines (the ``tokens`` input format): token ids,
lengths and ids only, never raw text."""
from __future__ import annotations

import json
import math
from pathlib import Path

from kvsim.io.trace.columns import Trace


def write_tokens_jsonl(trace: Trace, path: str | Path) -> int:
    """Write ``trace`` to ``path`` (gzip when it ends in .gz); returns the number of lines.

    The file is written beside the target and renamed into place, so a failure never
    leaves a half-written file under the final name.
    """
    from kvsim.outputs import write_lines_atomic

    tokens = trace.require_tokens("--export")
    write_lines_atomic(Path(path), (_line(trace, tokens, i) for i in range(len(trace))))
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
    step = int(trace.arrival_step[i])
    if step >= 0:
        parts.append(f'"arrival_step":{step}')
    return "{" + ",".join(parts) + "}\n"
