"""Parquet traces: ``kvsim convert`` writes them, every command reads them, the round trip is
lossless, pandas and pyarrow read them as users would, bad files give one clear line."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import kvsim
from kvsim.cli import run
from kvsim.errors import InputError
from trace_equal import assert_same_trace

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pd = pytest.importorskip("pandas")

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "traces"
MOONCAKE = TRACES / "public" / "conversation_trace.jsonl"


def mixed_tokens_log(path: Path) -> Path:
    """Token ids (some beyond int32), unknown and known replies and arrivals, every name."""
    recs = []
    for i in range(40):
        rec = {"prompt_token_ids": [1, 2, 3 + i, (2**40 + i) if i == 7 else 5]}
        if i % 3:
            rec["output_token_ids"] = list(range(i % 5))
        if i % 4:
            rec["timestamp"] = 10.0 + i / 3
        for key, every in (("tenant", 2), ("cache_salt", 3), ("lora", 5), ("session_id", 4)):
            if i % every == 0:
                rec[key] = f"{key}-{i % 3}é"
        if i % 6 == 0:
            rec["request_id"] = f"req-{i}"
        if i % 9 == 0:
            rec["prompt_logprobs"] = True
        if i % 10 == 5:
            rec["logprob_start_len"] = 3
        if i % 5:
            rec["arrival_step"] = i // 2
        if i % 7 == 0:
            rec["max_tokens"] = 33
        recs.append(rec)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def convert(tmp_path: Path, *logs: Path, extra=()) -> Path:
    out = tmp_path / "trace.parquet"
    assert run(["convert", *map(str, logs), "-o", str(out), "--force", *extra]) == 0
    return out


CASES = {
    "chat": lambda tmp: [TRACES / "support_chat.jsonl"],
    "tenants and adapters": lambda tmp: [TRACES / "multi_tenant.jsonl", TRACES / "multi_lora.jsonl"],
    "mooncake hash ids": lambda tmp: [MOONCAKE],
    "tokens, every field": lambda tmp: [mixed_tokens_log(tmp / "t.jsonl")],
}


@pytest.mark.parametrize("case", list(CASES))
def test_round_trip_is_lossless(tmp_path, case):
    logs = CASES[case](tmp_path)
    extra = ["--limit", "300"] if case == "mooncake hash ids" else []
    original = kvsim.load_trace(logs, limit=300 if extra else None)
    back = kvsim.load_trace(convert(tmp_path, *logs, extra=extra))
    assert_same_trace(back, original, meta=False)
    for field in ("tokenizer", "chat_template", "hash_block_size", "notes"):
        assert getattr(back.meta, field) == getattr(original.meta, field), field
    assert back.meta.formats == ["parquet"]


def test_pandas_and_pyarrow_read_what_kvsim_wrote(tmp_path):
    log = mixed_tokens_log(tmp_path / "t.jsonl")
    trace = kvsim.load_trace(log)
    path = convert(tmp_path, log)
    df = pd.read_parquet(path)
    assert len(df) == len(trace)
    for i in range(len(trace)):
        assert list(df["prompt_token_ids"][i]) == trace.prompt(i).tolist()
        out = trace.output(i)
        assert (df["output_token_ids"][i] is None) == (out is None)
        if out is not None:
            assert list(df["output_token_ids"][i]) == out.tolist()
        assert df["output_length"][i] == trace.output_lengths[i]
        assert (math.isnan(trace.arrival[i]) and pd.isna(df["arrival"][i])) or df["arrival"][i] == trace.arrival[i]
        for col in ("tenant", "cache_salt", "lora", "session"):
            value = df[col][i]
            assert (None if pd.isna(value) else value) == trace.name_of(col, int(getattr(trace, col)[i]))
        assert df["request_id"][i] == trace.request_id(i)
        assert bool(df["prompt_logprobs"][i]) == bool(trace.prompt_logprobs[i])
    table = pq.read_table(path)
    assert table.schema.field("prompt_token_ids").type == pa.large_list(pa.int64())  # an id needs 64 bits
    meta = json.loads(table.schema.metadata[b"kvsim"])
    assert meta["requests"] == len(trace) and meta["meta"]["sources"] == [str(log)]


def test_a_parquet_trace_made_elsewhere(tmp_path):
    df = pd.DataFrame({"prompt_token_ids": [[1, 2, 3], [1, 2, 4, 5]],
                       "output_token_ids": [[7, 8], None],
                       "tenant": ["a", None], "arrival": [0.5, None]})
    path = tmp_path / "elsewhere.parquet"
    df.to_parquet(path)
    t = kvsim.load_trace(path)
    assert t.prompt(1).tolist() == [1, 2, 4, 5] and t.output(0).tolist() == [7, 8] and t.output(1) is None
    assert t.output_lengths.tolist() == [2, 1]  # the output ids, else 1
    assert [t.name_of("tenant", c) for c in t.tenant] == ["a", None]
    assert t.arrival[0] == 0.5 and math.isnan(t.arrival[1])
    assert len(kvsim.load_trace(path, limit=1)) == 1


def test_columns_in_several_chunks_with_nulls_read_from_their_buffers(tmp_path):
    """Columns read from Arrow's buffers (not pyarrow's to_numpy): several row groups, offsets
    into shared buffers, null rows and values, as pandas reads the same file."""
    rng = np.random.default_rng(3)
    n = 700
    prompts = [rng.integers(0, 50_000, rng.integers(1, 40)).tolist() for _ in range(n)]
    outputs = [None if i % 5 == 0 else rng.integers(0, 9, rng.integers(0, 5)).tolist() for i in range(n)]
    arrival = [None if i % 7 == 0 else float(i) / 3 for i in range(n)]
    logprobs = [None if i % 11 == 0 else bool(i % 3) for i in range(n)]
    table = pa.table({"prompt_token_ids": pa.array(prompts, pa.list_(pa.int32())),
                      "output_token_ids": pa.array(outputs, pa.large_list(pa.int64())),
                      "arrival": arrival, "prompt_logprobs": logprobs})
    path = tmp_path / "chunks.parquet"
    pq.write_table(table, path, row_group_size=97)
    t = kvsim.load_trace(path, cache=False)
    df = pd.read_parquet(path)
    assert [t.prompt(i).tolist() for i in range(n)] == [list(x) for x in df.prompt_token_ids]
    assert [None if t.output(i) is None else t.output(i).tolist() for i in range(n)] == \
        [None if x is None else list(x) for x in df.output_token_ids]
    np.testing.assert_array_equal(t.arrival, df.arrival.to_numpy(np.float64, na_value=np.nan))
    assert t.prompt_logprobs.tolist() == [bool(x) if x is not None else False for x in logprobs]


def test_reading_a_parquet_trace_does_not_import_pandas(tmp_path):
    import subprocess
    import sys

    path = convert(tmp_path, TRACES / "multi_tenant.jsonl")
    code = ("import sys, kvsim; t = kvsim.load_trace(sys.argv[1], cache=False); "
            "assert len(t) > 0; print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_every_command_reads_parquet(tmp_path, capsys):
    log = TRACES / "multi_tenant.jsonl"
    path = convert(tmp_path, log)
    results = []
    for src in (log, path):
        js = tmp_path / f"{src.suffix}.json"
        assert run(["simulate", str(src), "--policy", "all", "--capacity", "20000", "--json", str(js)]) == 0
        summaries = {k: v["summary"] for k, v in json.loads(js.read_text())["policies"].items()}
        results.append({k: {f: x for f, x in s.items() if f != "replay_seconds"} for k, s in summaries.items()})
    assert results[0] == results[1]
    for cmd in (["analyze"], ["inspect"], ["sweep", "--capacity", "5000,20000"],
                ["report", "-o", str(tmp_path / "r.html")]):
        assert run([*cmd, str(path)]) == 0, cmd
    assert "parquet" in capsys.readouterr().out


def test_parquet_is_read_faster_than_its_log_would_be_tokenized(tmp_path):
    """Not a timing: reading Parquet never needs a tokenizer or a chat template."""
    t = kvsim.load_trace(convert(tmp_path, TRACES / "support_chat.jsonl"), tokenizer="no-such-tokenizer",
                         chat_template="no-such-template")
    assert t.meta.tokenizer is not None and len(t) > 0


@pytest.mark.parametrize("table,problem", [
    ({"prompt": [[1, 2]]}, "needs a prompt_token_ids column"),
    ({"prompt_token_ids": [["a", "b"]]}, "must hold lists of integer token ids"),
    ({"prompt_token_ids": [[1, 2], None]}, "row 1: prompt_token_ids is null"),
    ({"prompt_token_ids": [[1, -2]]}, "negative id (-2)"),
    ({"prompt_token_ids": [[1, 2]], "tenant": [[1]]}, "column tenant must hold strings"),
    ({"prompt_token_ids": [[1, None, 3]]}, "prompt_token_ids holds a null id"),
    ({"prompt_token_ids": [[1, 2], [3]], "output_length": pa.array([None, 4], pa.int64())},
     "column output_length (int64) is not int (null values)"),
    ({"prompt_token_ids": [[1, 2]], "output_length": [None]}, "column output_length (null) is not int (null values)"),
])
def test_bad_parquet_files_give_one_line(tmp_path, capsys, table, problem):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table(table), path)
    assert run(["inspect", str(path)]) == 2
    err = capsys.readouterr().err
    assert problem in err and str(path) in err and "Traceback" not in err


def test_a_damaged_parquet_file(tmp_path, capsys):
    path = convert(tmp_path, TRACES / "rag.jsonl")
    data = path.read_bytes()
    path.write_bytes(data[:4] + b"\0" * 64 + data[68:])
    assert run(["inspect", str(path)]) == 2
    assert "cannot read Parquet file" in capsys.readouterr().err


def test_convert_output_rules(tmp_path, capsys):
    log = tmp_path / "t.jsonl"
    log.write_bytes((TRACES / "rag.jsonl").read_bytes())
    assert run(["convert", str(log), "-o", str(log)]) == 2  # never onto an input
    out = tmp_path / "x.parquet"
    out.write_text("keep me")
    assert run(["convert", str(log), "-o", str(out)]) == 2 and out.read_text() == "keep me"
    assert run(["convert", str(log), "-o", str(tmp_path / "x.csv")]) == 2
    assert "use a .parquet" in capsys.readouterr().err
    jl = tmp_path / "t.tokens.jsonl.gz"
    assert run(["convert", str(log), "-o", str(jl)]) == 0
    assert_same_trace(kvsim.load_trace(jl), kvsim.load_trace(log), meta=False,  # the tokens format
                      skip=("msg_offsets", "msg_starts", "msg_roles", "role_names"))  # has no messages


def test_missing_pyarrow_is_a_clear_error(tmp_path, monkeypatch, capsys):
    import builtins

    real = builtins.__import__

    def no_pyarrow(name, *a, **kw):
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    assert run(["convert", str(TRACES / "rag.jsonl"), "-o", str(tmp_path / "x.parquet")]) == 2
    assert "pip install 'kvsim[parquet]'" in capsys.readouterr().err


def test_damaged_reader_input_is_an_input_error(tmp_path):
    path = tmp_path / "x.parquet"
    path.write_bytes(b"PAR1" + b"\1" * 20 + b"PAR1")
    with pytest.raises(InputError, match="cannot read Parquet"):
        kvsim.load_trace(path)


def test_names_that_are_not_unicode_text_are_a_clear_error(tmp_path, capsys):
    log = tmp_path / "s.jsonl"
    log.write_text('{"prompt_token_ids": [1, 2], "tenant": "a\\ud800"}\n')
    assert run(["convert", str(log), "-o", str(tmp_path / "x.parquet")]) == 2
    err = capsys.readouterr().err
    assert "column tenant" in err and "Traceback" not in err and not (tmp_path / "x.parquet").exists()
