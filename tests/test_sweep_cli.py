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
    (["-c", "1e5", "--replay", "later"], "unknown --replay"),
    (["-c", "1e5", "--speedup", "2"], "need(s) --replay steps or --replay timed"),
    (["-c", "1e5", "--replay", "timed"], "--replay timed needs --model and --gpu"),
    (["-c", "1e5", "--replay", "steps"], "needs arrival_step on every request"),
    (["-c", "1e5", "--replay", "steps", "--arrival-from", "timestamp"], "needs --step-seconds"),
    (["-c", "1e5", "--replay", "steps", "--arrival-from", "timestamp", "--step-seconds", "1"],
     "needs a timestamp on every request"),
    (["-c", "1e5", "--replay", "steps", "--arrival-from", "timestamp", "--step-seconds", "0"], "--step-seconds"),
    (["-c", "1e5", "--replay", "steps", "--speedup", "-1"], "--speedup must be positive"),
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


def test_under_load_columns_are_the_scheduler_models(tmp_path, capsys):
    """--replay timed adds, per row, the concurrent hit rate and TTFT percentiles of the scheduler
    model at that row's capacity (the same numbers kvsim.drive.views gives directly)."""
    from pathlib import Path

    import numpy as np

    from kvsim import load_trace
    from kvsim.engines.options import SimOptions
    from kvsim.drive.step_cost import step_cost
    from kvsim.drive.concurrent import ReplayMode
    from kvsim.drive.views import concurrent_columns

    demo = Path(__file__).resolve().parents[1] / "traces" / "demo_mixture.jsonl"
    csv_path, json_path = tmp_path / "s.csv", tmp_path / "s.json"
    assert run(["sweep", str(demo), "--limit", "40", "-c", "3000,inf", "-j", "1", "--replay", "timed",
                "--model", "llama-3-8b", "--gpu", "H100-80GB", "--speedup", "3", "--csv", str(csv_path),
                "--json", str(json_path)]) == 0
    assert "under load" in capsys.readouterr().out
    frame = pd.read_csv(csv_path, dtype={"capacity": str})
    doc = json.loads(json_path.read_text())
    assert doc["settings"]["replay"] == "timed" and doc["settings"]["speedup"] == 3
    trace = load_trace(demo, limit=40)
    mode, cost = ReplayMode("timed", speedup=3.0), step_cost("llama-3-8b", "H100-80GB")
    for row in frame.to_dict(orient="records"):
        cap = float(row["capacity"])
        options = SimOptions(capacity_tokens=cap, gpu="H100-80GB")
        direct = concurrent_columns(trace, options, row["policy"], mode, cost)
        for key in ("concurrent_hit_rate", "concurrent_preemptions", "ttft_p50_s", "ttft_p90_s"):
            assert row[key] == pytest.approx(direct[key]), key
        assert 0 < row["ttft_p50_s"] <= row["ttft_p90_s"] and np.isfinite(row["concurrent_hit_rate"])
