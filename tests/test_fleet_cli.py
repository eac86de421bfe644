"""`kvsim simulate --replicas N --router NAME` end to end: the fleet section, JSON, per-request
replicas, the default router said, and bad input as one line with exit code 2."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.cli import run
from kvsim.cli.options import ROUTER_NAMES
from kvsim.fleet.routers import ROUTERS

ROOT = Path(__file__).resolve().parents[1]
TENANTS = ROOT / "traces" / "multi_tenant.jsonl"      # no session ids
CHAT = ROOT / "traces" / "support_chat.jsonl"         # sessions


def test_the_help_names_every_router():
    assert ROUTER_NAMES == tuple(ROUTERS)


def test_sequential_fleet_json_and_per_request(tmp_path, capsys):
    js, pr = tmp_path / "s.json", tmp_path / "r.jsonl"
    assert run(["simulate", str(CHAT), "--policy", "all", "--capacity", "3000", "--limit", "80", "--replicas", "3",
                "--router", "cache_aware", "--router-option", "cache_threshold=0.5", "--json", str(js),
                "--per-request", str(pr)]) == 0
    out = capsys.readouterr().out
    assert "Fleet (vLLM APC): 3 replicas behind cache_aware (cache_threshold=0.5)" in " ".join(out.split())
    assert "natural mode for fleets is --replay steps|timed" in " ".join(out.split())
    data = json.loads(js.read_text())
    assert data["fleet"]["replicas"] == 3 and data["fleet"]["router_settings"]["cache_threshold"] == 0.5
    for name in ("apc", "radix"):
        s = data["policies"][name]["summary"]
        f = s["fleet"]
        assert f["fleet_bound_hit_rate"] >= f["routed_bound_hit_rate"] >= f["token_hit_rate"] == s["token_hit_rate"]
        assert f["capacity_tokens_total"] == 3 * f["capacity_tokens_per_replica"]
        assert len(f["per_replica"]) == 3 and sum(r["requests"] for r in f["per_replica"]) == 80
        assert f["larger_gap"] in ("routing", "memory", "neither") and f["load_imbalance"]["requests"] >= 1.0
    rows = [json.loads(line) for line in pr.read_text().splitlines()]
    assert len(rows) == 160 and {r["replica"] for r in rows} <= {0, 1, 2}
    apc = [r for r in rows if r["policy"] == "apc"]
    for k in range(3):
        per = data["policies"]["apc"]["summary"]["fleet"]["per_replica"][k]
        assert sum(r["cached_tokens"] for r in apc if r["replica"] == k) == per["cached_tokens"]


def test_default_router_is_round_robin_and_said(capsys):
    assert run(["simulate", str(TENANTS), "--limit", "12", "--replicas", "2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "2 replicas behind round_robin (the default router; --router to choose)" in out
    assert "natural mode" not in out


def test_steps_fleet_shows_peaks(tmp_path, capsys):
    js = tmp_path / "s.json"
    assert run(["simulate", str(CHAT), "--limit", "40", "--replay", "steps", "--arrival-from", "timestamp",
                "--step-seconds", "0.05", "--capacity", "4000", "--replicas", "2", "--router", "dynamo",
                "--json", str(js)]) == 0
    assert "Replicas (apc)" in capsys.readouterr().out
    per = json.loads(js.read_text())["policies"]["apc"]["summary"]["fleet"]["per_replica"]
    assert all("peak_running" in r and "peak_waiting" in r and "ttft_p50_s" not in r for r in per)


def test_one_replica_reports_what_simulate_reports(tmp_path, capsys):
    one, fleet = tmp_path / "one.json", tmp_path / "fleet.json"
    args = ["simulate", str(TENANTS), "--limit", "40", "--capacity", "2000", "--policy", "all"]
    assert run([*args, "--json", str(one)]) == 0
    assert run([*args, "--replicas", "1", "--router", "prefix_hash", "--json", str(fleet)]) == 0
    a, b = json.loads(one.read_text()), json.loads(fleet.read_text())
    for name in ("apc", "radix"):
        sa, sb = a["policies"][name]["summary"], b["policies"][name]["summary"]
        sb.pop("fleet")
        sa.pop("replay_seconds"), sb.pop("replay_seconds")
        assert sa == sb


@pytest.mark.parametrize("args,needle", [
    (["--replicas", "0"], "--replicas must be at least 1 (got 0)"),
    (["--router", "cache_aware"], "--router needs --replicas"),
    (["--router-option", "cache_threshold=0.5"], "--router-option needs --replicas"),
    (["--replicas", "2", "--router", "round_robin", "--router-option", "cache_threshold=0.5"],
     "router round_robin has no option 'cache_threshold'"),
    (["--replicas", "2", "--router", "dynamo", "--router-option", "max_tree_size=10"], "router dynamo has no option"),
    (["--replicas", "2", "--router", "session"], "router session needs session ids"),
    (["--replicas", "2", "--router", "nginx"], "unknown --router 'nginx'"),
    (["--replicas", "2", "--router-option", "threshold"], "--router-option takes KEY=VALUE"),
    (["--replicas", "2", "--html", "x.html"], "--html reports one engine"),
])
def test_bad_fleet_input_exits_2_with_one_line(args, needle, capsys):
    assert run(["simulate", str(TENANTS), "--limit", "5", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
