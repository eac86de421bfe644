"""`kvsim sweep`: outputs (terminal, CSV, JSON) and one-line errors with exit code 2."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from kvsim.cli import run

SECRET = "PATIENT-RECORD-1234"


@pytest.fixture()
def log(tmp_path):
    path = tmp_path / "log.jsonl"
    system = "You are a helpful assistant for the clinic. " * 3
    lines = [json.dumps({"prompt": f"{system}{SECRET} question {i % 5} " + "detail " * (i % 7),
                         "output_length": 3 + i % 4}) for i in range(40)]
    path.write_text("\n".join(lines) + "\n")
    return path


def sweep_args(log, *extra):
    return ["sweep", str(log), "--tokenizer", "bytes", "-p", "apc", "-c", "64,256,inf", "--block-size", "4,16",
            "-j", "1", *extra]


def test_table_csv_and_json(log, tmp_path, capsys):
    csv_path, json_path = tmp_path / "s.csv", tmp_path / "s.json"
    assert run(sweep_args(log, "--csv", str(csv_path), "--json", str(json_path))) == 0
    out = capsys.readouterr().out
    assert "apc b4" in out and "apc b16" in out and "one-pass curve apc" in out
    frame = pd.read_csv(csv_path, dtype={"capacity": str})
    assert len(frame) == 6 and list(frame["capacity"]) == ["64", "256", "inf"] * 2
    assert {"token_hit_rate", "curve_hit_rate", "curve_abs_error"} <= set(frame.columns)
    doc = json.loads(json_path.read_text())
    assert len(doc["rows"]) == 6 and doc["trace"]["requests"] == 40
    assert {c["settings"]["block_size"] for c in doc["curves"]} == {4, 16}
    assert all(len(c["capacity_tokens"]) == len(c["hit_rate"]) >= 2 for c in doc["curves"])
    for text in (out, csv_path.read_text(), json_path.read_text()):
        assert SECRET not in text


def test_no_curve(log, capsys):
    assert run(sweep_args(log, "--no-curve")) == 0
    out = capsys.readouterr().out
    assert "1-pass" not in out and "one-pass curve" not in out


@pytest.mark.parametrize("args, message", [
    (["-c", "1e5,abc"], "not a capacity: 'abc'"),
    (["-c", "1e5,-3"], "capacity must be"),
    (["-c", "20GiB"], "give --model"),
    (["-c", "1e5", "--block-size", "16,0"], "--block-size"),
    (["-c", "1e5", "--eviction", "lru,random"], "unknown eviction policy"),
    (["-c", "1e5", "--executor", "dask"], "--executor"),
    (["-c", "1e5", "--jobs", "0"], "--jobs"),
    (["-c", "1e5", "-p", "apc,nope"], "unknown policy"),
])
def test_bad_options_exit_2_with_one_line(log, capsys, args, message):
    assert run(["sweep", str(log), "--tokenizer", "bytes", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_outputs_never_overwrite_inputs(log, capsys):
    before = log.read_text()
    assert run(sweep_args(log, "--csv", str(log))) == 2
    assert "refusing to write over an input file" in capsys.readouterr().err
    assert log.read_text() == before
