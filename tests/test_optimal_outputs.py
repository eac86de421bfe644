"""Where the optimum shows up: every sweep row, the sweep's JSON, the report's capacity chart
and key numbers, and the capacity from which each engine stays within 90% of it."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvsim.cli import run
from kvsim.io.load import load_trace
from kvsim.drive.sequential import replay
from kvsim.drive.metrics import summarize
from kvsim.engines.options import SimOptions
from kvsim.report import ReportOptions, build_report
from kvsim.sweep import sweep
from kvsim.sweep.optimal import apc_optimal, radix_optimal

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "traces" / "demo_mixture.jsonl"


@pytest.fixture(scope="module")
def demo():
    return load_trace(str(DEMO))


def test_every_sweep_row_has_its_optimum(demo):
    result = sweep(demo, "apc,radix", "2000,6000,20000,inf", block_sizes="8,16", page_sizes="1,16", jobs=1)
    frame = result.frame
    assert frame["optimal_hit_rate"].notna().all()
    assert (frame["optimal_hit_rate"] >= frame["token_hit_rate"] - 1e-12).all()
    for row in frame.to_dict(orient="records"):
        cap = None if math.isinf(row["capacity_tokens"]) else row["capacity_tokens"]
        if row["policy"] == "apc":
            want = apc_optimal(demo, int(row["block_size"])).at(cap).hit_rate
        else:
            want = radix_optimal(demo, int(row["page_size"])).at(cap).hit_rate
        assert row["optimal_hit_rate"] == pytest.approx(want)
    unlimited = frame[np.isinf(frame["capacity_tokens"])]
    # with an unlimited cache nothing is ever evicted: the engines reach the optimum
    assert np.allclose(unlimited["optimal_hit_rate"], unlimited["token_hit_rate"])
    engines = {(o.engine, o.settings.get("block_size", o.settings.get("page_size"))) for o in result.optimal}
    assert engines == {("apc", 8), ("apc", 16), ("radix", 1), ("radix", 16)}


def test_sweep_cli_writes_the_optimum(tmp_path, capsys):
    csv_path, json_path = tmp_path / "s.csv", tmp_path / "s.json"
    assert run(["sweep", str(DEMO), "-p", "apc", "-c", "3000,inf", "-j", "1", "--csv", str(csv_path),
                "--json", str(json_path)]) == 0
    out = capsys.readouterr().out
    assert "optimal curve apc" in out and "exact optimum" in out
    frame = pd.read_csv(csv_path)
    assert "optimal_hit_rate" in frame.columns and (frame["optimal_hit_rate"] >= frame["token_hit_rate"]).all()
    doc = json.loads(json_path.read_text())
    assert [c["engine"] for c in doc["optimal_curves"]] == ["apc"]
    curve = doc["optimal_curves"][0]
    assert len(curve["capacity_tokens"]) == len(curve["hit_rate"]) >= 2


def test_report_chart_numbers_and_the_90_percent_point(demo):
    data = build_report(demo, ReportOptions(sim=SimOptions(capacity_tokens=20000), block_sizes=(16,), jobs=1))
    n = data.numbers
    for p in ("apc", "radix"):
        assert n["optimal_hit_rate"][p] >= n["hit_rate"][p]
    near = n["near_optimal_capacity"]
    assert set(near) == {"apc", "radix"} and n["near_optimal_share"] == 0.9
    # at the named capacity an exact replay really is within 90% of the optimum
    for p, model in (("apc", apc_optimal(demo, 16)), ("radix", radix_optimal(demo, 1))):
        cap = near[p]
        assert cap is not None
        got = summarize(replay(p, demo, SimOptions(capacity_tokens=cap)), demo)["token_hit_rate"]
        assert got >= 0.9 * model.at(cap).hit_rate - 1e-12
    capacity = next(s for s in data.sections if s.id == "capacity")
    names = [c.name for c in capacity.charts]
    assert names == ["capacity", "block_policies"]
    caption = capacity.charts[0].caption
    assert "within 90% of its optimum" in caption and "radix: exact replays joined" in caption
    cards = {k.label: k for k in data.key_numbers}
    assert "the optimum there is" in cards["vLLM APC hit rate"].detail


def test_report_from_a_sweep_uses_its_optimum(demo):
    result = sweep(demo, "apc,radix", "4000,12000,inf", jobs=1)
    data = build_report(demo, ReportOptions(sim=SimOptions(capacity_tokens=12000), block_sizes=(16,), jobs=1),
                        sweep_result=result)
    capacity = next(s for s in data.sections if s.id == "capacity")
    assert capacity.tables[0].header[-3:] == ["hit rate", "optimum", "one-pass"]
    assert set(data.numbers["near_optimal_capacity"]) == {"apc", "radix"}
