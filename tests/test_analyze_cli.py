"""`kvsim analyze` on every bundled trace: a clean report, the same numbers in --json, no raw
text unless --show-text, one-line errors for bad options."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.analyze.core import SECTIONS
from kvsim.render.analyze import pct
from kvsim.cli import run

TRACES = Path(__file__).resolve().parents[1] / "traces"
# the two Mooncake traces go through the CLI in test_analyze_mooncake.py
BUNDLED = sorted(p for p in TRACES.rglob("*") if p.suffix in (".jsonl", ".json", ".csv") and p.is_file()
                 and not p.name.endswith("_trace.jsonl"))


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: str(p.relative_to(TRACES)))
def test_clean_report_on_every_bundled_trace(path, tmp_path, capsys):
    out_json = tmp_path / "report.json"
    assert run(["analyze", str(path), "--json", str(out_json)]) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "Traceback" not in text + captured.err and "error:" not in captured.err
    assert "kvsim analyze:" in text and "Workload shape" in text
    data = json.loads(out_json.read_text())
    assert set(SECTIONS) <= set(data)
    if data["bound"] is None:
        assert "no prefix information" in text
        return
    # the headline numbers are the JSON's
    assert f"{pct(data['bound']['token'])} of prompt tokens at token level" in " ".join(text.split())
    assert data["recommendation"]["engine"] in ("APC", "RadixAttention")
    assert "Recommendation" in text and "Seed heuristic" in text


def first_system_text(path: Path) -> str:
    row = json.loads(path.open().readline())
    return row["messages"][0]["content"][30:70]


def test_no_raw_text_without_show_text(tmp_path, capsys):
    path = TRACES / "volatile_prefix.jsonl"
    secret = first_system_text(path)
    out_json = tmp_path / "r.json"
    assert run(["analyze", str(path), "--json", str(out_json), "--top", "3"]) == 0
    assert secret not in capsys.readouterr().out and secret not in out_json.read_text()
    assert run(["analyze", str(path), "--json", str(out_json), "--top", "3", "--show-text"]) == 0
    shown = capsys.readouterr().out
    data = json.loads(out_json.read_text())
    site = data["divergence"]["volatile"]["sites"][0]
    assert site["location"]["role"] == "system" and "Request ID" in site["text"]["span"]
    assert site["moved_bound"]["token"] > data["bound"]["token"] + 0.5   # moving it recovers most of the log
    assert "Request ID" in shown and any("text" in p for p in data["prefixes"]["top"])


@pytest.mark.parametrize("args, message", [
    (["--block-sizes", "16,x"], "--block-sizes"),
    (["--block-sizes", "0"], "--block-sizes"),
    (["--model", "no-such-model"], "unknown model"),
    (["--top", "0"], "--top"),
])
def test_bad_options_are_one_line_errors(args, message, capsys):
    assert run(["analyze", str(TRACES / "code_review.jsonl"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_refuses_to_write_json_over_the_input(tmp_path, capsys):
    src = tmp_path / "log.jsonl"
    src.write_text((TRACES / "code_review.jsonl").read_text())
    assert run(["analyze", str(src), "--json", str(src)]) == 2
    assert src.read_text() == (TRACES / "code_review.jsonl").read_text()
