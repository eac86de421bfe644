"""``arrival_step``: read from token-id and chat logs (both token readers), kept by Parquet and
the trace cache, and refused with file and line when it is not an integer >= 0."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import kvsim
from kvsim.cli import run
from kvsim.errors import InputError
from test_io_fast_tokens import fast_path


def write(path: Path, recs) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


TOKENS = [{"prompt_token_ids": [1, 2, 3], "arrival_step": 0},
          {"prompt_token_ids": [1, 2, 4]},
          {"prompt_token_ids": [5], "output_token_ids": [6], "arrival_step": 7}]


@pytest.mark.parametrize("fast", [False, True])
def test_token_log_steps(tmp_path, fast):
    """Both token readers give the logged steps, -1 where a line has none."""
    with fast_path(fast):
        t = kvsim.load_trace(write(tmp_path / "t.jsonl", TOKENS), tokenizer="bytes")
    assert t.arrival_step.tolist() == [0, -1, 7]


def test_chat_log_steps(tmp_path):
    msg = [{"role": "user", "content": "hi"}]
    t = kvsim.load_trace(write(tmp_path / "c.jsonl", [{"messages": msg, "arrival_step": 3}, {"messages": msg}]),
                         tokenizer="bytes")
    assert t.arrival_step.tolist() == [3, -1]


@pytest.mark.parametrize("fast", [False, True])
@pytest.mark.parametrize("bad", [-1, 1.5, "2", True, 2**40])
def test_bad_step_names_file_and_line(tmp_path, fast, bad):
    path = write(tmp_path / "bad.jsonl", [TOKENS[0], {"prompt_token_ids": [1, 2], "arrival_step": bad}])
    with fast_path(fast), pytest.raises(InputError, match=r"bad\.jsonl:2: .*arrival_step"):
        kvsim.load_trace(path, tokenizer="bytes")


def test_parquet_and_export_keep_steps(tmp_path):
    pytest.importorskip("pyarrow")
    log = write(tmp_path / "t.jsonl", TOKENS)
    out = tmp_path / "t.parquet"
    assert run(["convert", str(log), "-o", str(out)]) == 0
    assert kvsim.load_trace(out).arrival_step.tolist() == [0, -1, 7]
    back = tmp_path / "back.jsonl"
    assert run(["convert", str(out), "-o", str(back)]) == 0
    assert kvsim.load_trace(back, tokenizer="bytes").arrival_step.tolist() == [0, -1, 7]


def test_bad_parquet_step(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"prompt_token_ids": [[1, 2], [3]], "arrival_step": [0, -4]}), path)
    with pytest.raises(InputError, match=r"bad\.parquet.*row 2: arrival_step must be an integer >= 0"):
        kvsim.load_trace(path)


def test_trace_cache_serves_steps(tmp_path, monkeypatch):
    """A cached trace carries arrival_step (the cache format changed with it)."""
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "cache"))
    log = write(tmp_path / "t.jsonl", TOKENS)
    first = kvsim.load_trace(log, tokenizer="bytes", cache=True)
    again = kvsim.load_trace(log, tokenizer="bytes", cache=True)
    assert first.arrival_step.tolist() == again.arrival_step.tolist() == [0, -1, 7]
