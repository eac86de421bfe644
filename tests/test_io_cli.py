"""kvsim inspect: the per-file summary, and --export to pre-tokenized JSONL that reads back equal."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

import kvsim
from kvsim.cli import run

PUBLIC = Path(__file__).resolve().parents[1] / "traces" / "public"
CHAT = [
    {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "secret question"}],
     "response": "secret answer", "timestamp": 5, "user": "t1", "cache_salt": "x", "lora": "a",
     "session_id": "s", "request_id": "r1", "prompt_logprobs": True},
    {"messages": [{"role": "user", "content": "another"}], "max_tokens": 7, "logprob_start_len": 1},
]


def write_chat(tmp_path: Path) -> Path:
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in CHAT))
    return path


def test_inspect_summary(tmp_path, capsys):
    chat = write_chat(tmp_path)
    moon = PUBLIC / "synthetic_trace.jsonl"
    assert run(["inspect", str(chat), str(moon), "--limit", "102"]) == 0
    out = capsys.readouterr().out
    for text in ("chat.jsonl", "synthetic_trace.jsonl", "chat", "mooncake", "requests", "102",
                 "cl100k_base", "llama3", "hash-id block size: 512", "sessions", "LoRA adapters"):
        assert text in out, text
    assert "secret" not in out  # never raw text


def test_inspect_azure_says_no_prefix_information(capsys):
    assert run(["inspect", str(PUBLIC / "AzureLLMInferenceTrace_conv.csv")]) == 0
    out = capsys.readouterr().out
    assert "19,366" in out and "prefix information: NONE" in out and "NO prefix" in out


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_export_round_trip(tmp_path, capsys, suffix):
    chat = write_chat(tmp_path)
    kv = PUBLIC / "kv-cache-tester" / "trace_0002.json"
    out = tmp_path / f"export{suffix}"
    assert run(["inspect", str(chat), str(kv), "--export", str(out)]) == 0
    raw = gzip.decompress(out.read_bytes()) if suffix.endswith(".gz") else out.read_bytes()
    assert b"secret" not in raw
    first = json.loads(raw.splitlines()[0])
    assert set(first) == {"prompt_token_ids", "output_token_ids", "output_length", "timestamp", "cache_salt",
                          "lora", "tenant", "session_id", "request_id", "prompt_logprobs"}
    a = kvsim.load_trace([chat, kv])
    b = kvsim.load_trace(out)
    assert b.meta.formats == ["tokens"]
    assert np.array_equal(a.offsets, b.offsets) and np.array_equal(a.tokens, b.tokens)
    assert np.array_equal(a.output_lengths, b.output_lengths)
    assert np.array_equal(a.output_known, b.output_known)
    assert np.array_equal(a.output_tokens, b.output_tokens)
    assert np.array_equal(a.arrival, b.arrival, equal_nan=True)
    assert np.array_equal(a.prompt_logprobs, b.prompt_logprobs)
    assert np.array_equal(a.logprob_start_len, b.logprob_start_len) and a.logprob_start_len[:2].tolist() == [0, 1]
    for col in ("tenant", "cache_salt", "lora", "session"):
        assert [a.name_of(col, c) for c in getattr(a, col)] == [b.name_of(col, c) for c in getattr(b, col)]
    assert [a.request_id(i) for i in range(len(a))] == [b.request_id(i) for i in range(len(b))]
