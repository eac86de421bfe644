"""--warmup on simulate, sweep, analyze and report: the window fills the cache, every figure
leaves it out, and every output says so. Figures are checked against the per-request
replay results of a run without the option, masked by hand."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from kvsim.cli import run
from kvsim.errors import ConfigError
from kvsim.io.load import load_trace
from kvsim.drive.sequential import replay
from kvsim.engines.options import SimOptions
from kvsim.sweep.curves import apc_curve
from kvsim.warmup import Warmup, as_fraction, measured_mask, parse_warmup

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "traces" / "support_chat.jsonl"


@pytest.mark.parametrize("text, fraction, count", [
    ("0.5", 0.5, None), ("50%", 0.5, None), ("0", 0.0, None), ("12", 0.0, 12), (None, 0.0, None), (7, 0.0, 7),
])
def test_parse(text, fraction, count):
    w = parse_warmup(text)
    assert (w.fraction, w.count) == (fraction, count)


@pytest.mark.parametrize("text", ["1.0", "1.5", "-1", "100%", "half", "nan", "1e3", "2.0"])
def test_parse_rejects(text):
    with pytest.raises(ConfigError, match="--warmup"):
        parse_warmup(text)


def test_window_and_fraction_agree():
    assert measured_mask(10, "0.5").tolist() == [False] * 5 + [True] * 5
    assert measured_mask(7, "3").tolist() == [False] * 3 + [True] * 4
    assert measured_mask(7, None).all()
    with pytest.raises(ConfigError, match="leaves none"):
        measured_mask(5, "5")
    for n in (1, 7, 100, 12031):
        for k in sorted({0, 1, n // 3, n - 1} - {n}):
            f = as_fraction(n, Warmup(count=k) if k else None)
            assert math.floor(n * f) == k        # the one-pass curves' rule gives the same window


def _masked_hit_rate(result, trace, mask):
    ok = ~result.rejected & mask
    return result.cached_tokens[ok].sum() / trace.prompt_lengths[ok].sum()


def test_simulate_counts_only_the_measured_requests(tmp_path, capsys):
    js, pr = tmp_path / "s.json", tmp_path / "r.jsonl"
    assert run(["simulate", str(DEMO), "--policy", "all", "--capacity", "6000", "--warmup", "40",
                "--json", str(js), "--per-request", str(pr)]) == 0
    out = capsys.readouterr().out
    assert "Warm-up: the first 40 of 95 requests" in out
    data = json.loads(js.read_text())
    assert data["warmup"] == {"fraction": None, "count": 40, "warmup_requests": 40}
    trace = load_trace(str(DEMO))
    mask = measured_mask(len(trace), 40)
    plain = replay("apc", trace, SimOptions(capacity_tokens=6000))
    s = data["policies"]["apc"]["summary"]
    assert s["requests"] == 55 and s["warmup_requests"] == 40
    assert s["token_hit_rate"] == pytest.approx(_masked_hit_rate(plain, trace, mask))
    assert s["prompt_tokens"] == int(trace.prompt_lengths[mask & ~plain.rejected].sum())
    assert "sglang_logged_hit_rate" not in data["policies"]["radix"]["summary"]   # a whole-run figure
    rows = [json.loads(line) for line in pr.read_text().splitlines()]
    assert [r["index"] for r in rows if r["policy"] == "apc"] == list(range(40, 95))


def test_sweep_rows_curves_and_optimum_honour_the_window(tmp_path, capsys):
    csv_path, json_path = tmp_path / "s.csv", tmp_path / "s.json"
    assert run(["sweep", str(DEMO), "-p", "apc", "-c", "3000,6000,inf", "-j", "1", "--warmup", "0.5",
                "--csv", str(csv_path), "--json", str(json_path)]) == 0
    assert "Warm-up: the first 47 requests" in capsys.readouterr().out
    frame = pd.read_csv(csv_path)
    trace = load_trace(str(DEMO))
    mask = measured_mask(len(trace), 0.5)
    for row in frame.to_dict(orient="records"):
        plain = replay("apc", trace, SimOptions(capacity_tokens=row["capacity_tokens"]))
        assert row["token_hit_rate"] == pytest.approx(_masked_hit_rate(plain, trace, mask))
        assert row["curve_hit_rate"] == pytest.approx(apc_curve(trace, 16, warmup=0.5).hit_rate(
            [row["capacity_tokens"]])[0])
        assert row["optimal_hit_rate"] >= row["token_hit_rate"]
    doc = json.loads(json_path.read_text())
    assert doc["warmup"]["warmup_requests"] == 47 and doc["settings"]["warmup"] == "0.5"


def test_analyze_bounds_count_only_the_measured_requests(tmp_path):
    js_all, js_half = tmp_path / "a.json", tmp_path / "b.json"
    assert run(["analyze", str(DEMO), "--json", str(js_all)]) == 0
    assert run(["analyze", str(DEMO), "--json", str(js_half), "--warmup", "50%"]) == 0
    whole, half = json.loads(js_all.read_text()), json.loads(js_half.read_text())
    trace = load_trace(str(DEMO))
    mask = measured_mask(len(trace), 0.5)
    assert half["bound"]["prompt_tokens"] == int(trace.prompt_lengths[mask].sum())
    assert whole["bound"]["prompt_tokens"] == trace.num_prompt_tokens
    # the unlimited APC replay is the block-16 bound: the same with the window masked by hand
    plain = replay("apc", trace, SimOptions(capacity_tokens=math.inf))
    assert half["bound"]["block16"] == pytest.approx(_masked_hit_rate(plain, trace, mask))
    assert half["settings"]["warmup"]["warmup_requests"] == 47
    assert any(n.startswith("warm-up: the first 47") for n in half["notes"])


def test_report_says_so_and_uses_the_window(tmp_path):
    out = tmp_path / "r.html"
    assert run(["report", str(DEMO), "--capacity", "6000", "--warmup", "0.5", "-o", str(out),
                "-j", "1"]) == 0
    page = out.read_text(encoding="utf-8")
    assert "the first 47 of 95 requests (49%) only warm the cache" in page
    assert "optimum" in page


def test_bad_warmup_fails_before_reading(tmp_path, capsys):
    assert run(["simulate", str(DEMO), "--warmup", "1.5"]) == 2
    assert "--warmup" in capsys.readouterr().err
    assert run(["sweep", str(DEMO), "-c", "inf", "--warmup", "x"]) == 2
    assert run(["report", str(DEMO), "--warmup", "-2", "-o", str(tmp_path / "r.html")]) == 2
    assert run(["analyze", str(DEMO), "--warmup", "200%"]) == 2
