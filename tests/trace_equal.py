"""Test helper: two traces hold the same requests, column for column."""
from __future__ import annotations

import numpy as np

from kvsim.io.trace.columns import Trace

ARRAYS = ("offsets", "tokens", "output_lengths", "arrival", "output_offsets", "output_tokens", "output_known",
          "tenant", "cache_salt", "lora", "session", "prompt_logprobs", "logprob_start_len", "arrival_step", "request_ids",
          "msg_offsets", "msg_starts", "msg_roles")
NAMES = ("tenant_names", "salt_names", "lora_names", "session_names", "role_names")
META = ("tokenizer", "chat_template", "hash_block_size", "skipped_lines", "notes", "source_requests",
        "source_skipped")


def assert_same_trace(a: Trace, b: Trace, *, dtypes: bool = True, meta: bool = True, skip=()) -> None:
    """Every column equal (NaN equal to NaN), and with ``dtypes`` the same integer types."""
    for name in ARRAYS:
        if name in skip:
            continue
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, f"{name}: {x!r} vs {y!r}"
            continue
        assert len(x) == len(y), f"{name}: {len(x)} vs {len(y)} values"
        if x.dtype == object or y.dtype == object:
            assert list(x) == list(y), name
        else:
            assert np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), name
        if dtypes:
            assert x.dtype == y.dtype, f"{name}: {x.dtype} vs {y.dtype}"
    for name in NAMES:
        if name in skip:
            continue
        assert getattr(a, name) == getattr(b, name), name
    if meta:
        for name in META:
            assert getattr(a.meta, name) == getattr(b.meta, name), name
