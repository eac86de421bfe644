"""`kvsim sweep --offload BACKEND --offload-size 0,a,b`: a tier row per point and size, the hit
rates by tier, the CSV and JSON outputs, and bad input as one line with exit code 2."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from kvsim.cli import run

ROOT = Path(__file__).resolve().parents[1]
CHAT = ROOT / "traces" / "support_chat.jsonl"         # multi-turn sessions: reuse beyond a small GPU pool
TIMED = ["--replay", "timed", "--model", "llama-3-8b", "--gpu", "H100-80GB"]


def sweep(tmp_path, *args) -> tuple[pd.DataFrame, dict]:
    out, js = tmp_path / "o.csv", tmp_path / "o.json"
    assert run(["sweep", str(CHAT), "--no-curve", "-j", "1", *args, "--csv", str(out), "--json", str(js)]) == 0
    return pd.read_csv(out, keep_default_na=False, na_values=[""]), json.loads(js.read_text())


@pytest.mark.parametrize("policy, backend, extra", [
    ("apc", "native", []),
    ("apc", "lmcache", ["--lmcache-chunk-size", "64"]),
    ("radix", "hicache", []),
])
def test_a_row_per_point_and_size_with_hit_rates_by_tier(tmp_path, capsys, policy, backend, extra):
    sizes = ["0", "1000", "5000", "20000"]
    table, data = sweep(tmp_path, "--policy", policy, "--capacity", "2000,3000", "--offload", backend,
                        "--offload-size", ",".join(sizes), *extra)
    assert "Memory tiers" in capsys.readouterr().out
    assert len(table) == 2 * len(sizes) and len(data["offload_rows"]) == len(table)
    assert set(zip(table["capacity"].astype(str), table["offload_size"].astype(str))) == {
        (c, s) for c in ("2000", "3000") for s in sizes}
    assert (table["offload"] == backend).all()
    assert table[["gpu_hit_rate", "cpu_hit_rate", "disk_hit_rate"]].sum(axis=1).to_numpy() == pytest.approx(
        table["token_hit_rate"].to_numpy(), abs=1e-12)
    plain = {str(r["capacity"]): r["token_hit_rate"] for r in data["rows"]}     # the tier-less sweep
    for cap, rows in table.groupby(table["capacity"].astype(str)):
        zero = rows[rows["offload_size"].astype(str) == "0"].iloc[0]
        assert zero["token_hit_rate"] == plain[cap] and zero["cpu_hit_rate"] == 0 and zero["offload_size_tokens"] == 0
        rates = rows["token_hit_rate"].to_list()
        assert rates == sorted(rates) and rates[-1] > rates[0]           # a larger tier never hits less
        if backend != "hicache":     # vLLM's GPU pool does not depend on the tier (HiCache loads back into it)
            assert (rows["gpu_hit_rate"] == zero["gpu_hit_rate"]).all()
        assert rows["tier_gain"].to_numpy() == pytest.approx((rows["token_hit_rate"] - zero["token_hit_rate"]).to_numpy())
        assert list(rows["offload_size_tokens"]) == sorted(rows["offload_size_tokens"])
    for r in data["offload_rows"]:
        assert r["offload"] == backend and 0 <= r["cpu_hit_rate"] <= 1
    assert data["settings"]["offload"] == backend and data["settings"]["offload_size"] == sizes


def test_each_row_equals_kvsim_simulate_at_its_size(tmp_path):
    table, _ = sweep(tmp_path, "--policy", "apc", "--capacity", "3000", "--offload", "native",
                     "--offload-size", "5000")
    js = tmp_path / "s.json"
    assert run(["simulate", str(CHAT), "--policy", "apc", "--capacity", "3000", "--offload", "native",
                "--offload-size", "5000", "--json", str(js)]) == 0
    s = json.loads(js.read_text())["policies"]["apc"]["summary"]
    (row,) = table.to_dict(orient="records")
    assert row["token_hit_rate"] == pytest.approx(s["token_hit_rate"], abs=1e-15)
    assert row["cpu_hit_rate"] == pytest.approx(s["offload"]["tiers"]["cpu"]["hit_rate"], abs=1e-15)
    assert row["offload_size_tokens"] == s["offload"]["tiers"]["cpu"]["capacity_tokens"]


def test_lmcache_disk_tier_and_memory_sizes(tmp_path):
    table, _ = sweep(tmp_path, "--policy", "apc", "--capacity", "3000", "--model", "llama-3-8b",
                     "--offload", "lmcache", "--offload-size", "0,64MiB", "--disk-size", "5000",
                     "--lmcache-chunk-size", "64")
    row = table[table["offload_size"] == "64MiB"].iloc[0]
    assert row["disk_size_tokens"] > 0 and row["disk_hit_rate"] > 0 and row["offload_size_tokens"] > 0


def test_timed_ttft_with_and_without_the_tier(tmp_path):
    table, _ = sweep(tmp_path, "--policy", "radix", "--capacity", "3000", "--offload", "hicache",
                     "--offload-size", "0,20000", *TIMED)
    zero, big = (table[table["offload_size"].astype(str) == s].iloc[0] for s in ("0", "20000"))
    for q in (50, 90):
        assert zero[f"ttft_p{q}_s"] == zero[f"ttft_p{q}_without_tier_s"]
        assert big[f"ttft_p{q}_without_tier_s"] == zero[f"ttft_p{q}_s"]
    assert big["ttft_p90_s"] <= big["ttft_p90_without_tier_s"] and big["concurrent_hit_rate"] > zero["concurrent_hit_rate"]


@pytest.mark.parametrize("args, needle", [
    (["--policy", "apc", "--offload", "bogus", "--offload-size", "1e4"], "unknown --offload"),
    (["--policy", "apc", "--offload", "native", "--offload-size", "0,-5"], "not a size"),
    (["--policy", "apc", "--offload-size", "0,1e4"], "need(s) --offload"),
    (["--policy", "apc", "--offload", "hicache", "--offload-size", "1e4"], "use it with --policy radix"),
    (["--policy", "radix", "--offload", "native", "--offload-size", "1e4"], "use it with --policy apc"),
    (["--policy", "radix", "--offload", "lmcache", "--offload-size", "1e4"], "use it with --policy apc"),
    (["--policy", "apc", "--offload", "native", "--offload-size", "1GiB"], "give --model"),
    (["--policy", "apc", "--offload", "native", "--offload-size", "lots"], "not a size"),
    (["--policy", "apc", "--offload", "native", "--offload-size", "1e4", "--hicache-ratio", "3"],
     "--hicache-ratio is an option of --offload hicache"),
    (["--policy", "apc", "--capacity", "1000,inf", "--offload", "native", "--offload-size", "1e4"], "drop 'inf'"),
    (["--policy", "apc", "--offload", "native", "--offload-size", "1e4", "--replicas", "2"], "one at a time"),
])
def test_bad_tier_sweeps_exit_2_with_one_line(args, needle, capsys):
    if "--capacity" not in args:
        args = ["--capacity", "1000", *args]
    assert run(["sweep", str(CHAT), "--limit", "5", "--no-curve", "-j", "1", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_without_offload_the_outputs_are_unchanged(tmp_path):
    table, data = sweep(tmp_path, "--policy", "apc", "--capacity", "3000")
    assert "offload" not in table.columns and "offload_rows" not in data and "offload" not in data["settings"]
