"""`kvsim sweep --replicas 1,2 --router a,b`: a fleet row per point, size and router, with both bounds."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from kvsim.cli import run

ROOT = Path(__file__).resolve().parents[1]
CHAT = ROOT / "traces" / "support_chat.jsonl"


def test_fleet_rows_add_replicas_router_and_bounds(tmp_path, capsys):
    out, js = tmp_path / "f.csv", tmp_path / "f.json"
    assert run(["sweep", str(CHAT), "--limit", "120", "--capacity", "1500,inf", "--policy", "all", "--no-curve",
                "-j", "1", "--replicas", "1,3", "--router", "round_robin,cache_aware",
                "--router-option", "cache_threshold=0.4", "--csv", str(out), "--json", str(js)]) == 0
    assert "Fleets" in capsys.readouterr().out
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 2 * 2 * 2 * 2                      # policies x capacities x sizes x routers
    for r in rows:
        fb, rb, d = (float(r[k]) for k in ("fleet_bound_hit_rate", "routed_bound_hit_rate", "token_hit_rate"))
        assert fb >= rb >= d
        assert r["router_options"] == ("cache_threshold=0.4" if r["router"] == "cache_aware" else "")
    data = json.loads(js.read_text())
    single = {(s["policy"], s["capacity"]): s["token_hit_rate"] for s in data["rows"]}
    for r in data["fleet_rows"]:
        if r["replicas"] == 1:                              # one replica: the sweep's own replay
            assert r["token_hit_rate"] == single[(r["policy"], r["capacity"])]
            assert r["fleet_bound_hit_rate"] == r["routed_bound_hit_rate"]
    assert data["settings"]["replicas"] == "1,3" and data["settings"]["router"] == "round_robin,cache_aware"


def test_fleet_rows_under_load(tmp_path):
    out = tmp_path / "f.csv"
    assert run(["sweep", str(CHAT), "--limit", "60", "--capacity", "2000", "--policy", "apc", "--no-curve", "-j", "1",
                "--replay", "steps", "--arrival-from", "timestamp", "--step-seconds", "0.05",
                "--replicas", "2", "--router", "dynamo", "--csv", str(out)]) == 0
    (row,) = list(csv.DictReader(out.open()))
    assert row["router"] == "dynamo" and float(row["concurrent_hit_rate"]) <= float(row["routed_bound_hit_rate"])


@pytest.mark.parametrize("args,needle", [
    (["--router", "cache_aware"], "need --replicas"),
    (["--replicas", "0"], "--replicas must be at least 1 (got 0)"),
    (["--replicas", "2,x"], "--replicas takes whole numbers"),
    (["--replicas", "2", "--router", "round_robin,nginx"], "unknown --router 'nginx'"),
    (["--replicas", "2", "--router", "round_robin", "--router-option", "cache_threshold=0.4"], "has option"),
])
def test_bad_fleet_sweeps_exit_2(args, needle, capsys):
    assert run(["sweep", str(CHAT), "--limit", "5", "--capacity", "1000", "--no-curve", "-j", "1", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
