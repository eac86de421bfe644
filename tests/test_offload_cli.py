"""`kvsim simulate --offload native|lmcache|hicache` end to end: the tier section, summary.offload
in --json, cached_by_tier in --per-request, every replay mode, and bad input as one line with
exit code 2. Without --offload nothing changes (tests/test_golden_outputs.py holds the bytes)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.cli import run

ROOT = Path(__file__).resolve().parents[1]
CHAT = ROOT / "traces" / "support_chat.jsonl"         # multi-turn sessions: reuse the GPU cannot keep
TIMED = ["--replay", "timed", "--model", "llama-3-8b", "--gpu", "H100-80GB"]


def simulate(tmp_path, *args) -> tuple[dict, list[dict]]:
    js, pr = tmp_path / "s.json", tmp_path / "r.jsonl"
    assert run(["simulate", str(CHAT), "--capacity", "3000", *args, "--json", str(js), "--per-request", str(pr)]) == 0
    return json.loads(js.read_text()), [json.loads(line) for line in pr.read_text().splitlines()]


@pytest.mark.parametrize("args", [
    ["--policy", "apc", "--offload", "native", "--offload-size", "200000"],
    ["--policy", "apc", "--offload", "native", "--offload-size", "2e5", "--offload-block-size", "32",
     "--offload-eviction-policy", "arc", "--offload-store-threshold", "2"],
    ["--policy", "apc", "--offload", "lmcache", "--offload-size", "200000", "--lmcache-chunk-size", "64"],
    ["--policy", "apc", "--offload", "lmcache", "--model", "llama-3-8b", "--lmcache-max-local-cpu-size", "0.5",
     "--disk-size", "1GiB", "--lmcache-chunk-size", "64", "--lmcache-save-unfull-chunk"],
    ["--policy", "radix", "--offload", "hicache"],
    ["--policy", "radix", "--offload", "hicache", "--hicache-write-policy", "write_back", "--hicache-ratio", "1.5",
     "--page-size", "16"],
])
def test_sequential_tier_section_json_and_per_request(tmp_path, capsys, args):
    """The tier serves hits here; per request cached = the sum of cached_by_tier, and the run's
    per-tier hits add up to the requests'."""
    data, rows = simulate(tmp_path, *args)
    out = " ".join(capsys.readouterr().out.split())
    name = args[1]
    assert "Offload tier (" in out and "of the prompt tokens came from the tier" in out
    s = data["policies"][name]["summary"]
    o = s["offload"]
    assert o["backend"] == args[args.index("--offload") + 1]
    assert o["offloaded_hit_tokens"] > 0 and set(o["tiers"]) >= {"gpu", "cpu"}
    assert sum(t["hit_tokens"] for t in o["tiers"].values()) == s["cached_tokens"]
    assert data["policies"][name]["config"]["offload"]["backend"] == o["backend"]
    for row in rows:
        assert sum(row["cached_by_tier"].values()) == row["cached_tokens"]
    for t, tier in o["tiers"].items():
        assert sum(row["cached_by_tier"][t] for row in rows) == tier["hit_tokens"]
        if t != "gpu":
            # whole offload blocks move: a load may start inside the block the GPU hit ends in
            assert tier["loaded_tokens"] >= tier["hit_tokens"] and tier["stored_tokens"] > 0
    if "--disk-size" in args:
        assert o["tiers"]["disk"]["hit_tokens"] > 0 and o["tiers"]["cpu"]["evicted_tokens"] > 0
        assert o["tiers"]["cpu"]["loaded_bytes"] == o["tiers"]["cpu"]["loaded_tokens"] * o["bytes_per_token"]


def test_vllm_logged_rate_counts_the_gpu_hits_only(tmp_path):
    """vLLM's prefix-cache metrics count local hits; the tier's tokens are the connector's."""
    data, _ = simulate(tmp_path, "--policy", "apc", "--offload", "native", "--offload-size", "200000")
    s = data["policies"]["apc"]["summary"]
    assert s["vllm_logged_hit_rate"] == pytest.approx(s["offload"]["tiers"]["gpu"]["hit_rate"])
    assert s["token_hit_rate"] > s["vllm_logged_hit_rate"]


@pytest.mark.parametrize("policy, tier", [("apc", "native"), ("apc", "lmcache"), ("radix", "hicache")])
def test_timed_reports_ttft_with_and_without_the_tier(tmp_path, capsys, policy, tier):
    data, rows = simulate(tmp_path, "--policy", policy, "--offload", tier, "--offload-size", "200000", *TIMED)
    out = " ".join(capsys.readouterr().out.split())
    assert "TTFT with the tier" in out and "without it" in out and "Loading took" in out
    o = data["policies"][policy]["summary"]["offload"]
    assert o["without_tier"]["ttft_mean_s"] > 0 and o["transfer"]["load_seconds"] < o["transfer"]["recompute_seconds"]
    assert all("ttft_without_offload_s" in r and "cached_by_tier" in r for r in rows)
    assert sum(r["cached_by_tier"]["cpu"] for r in rows) == o["tiers"]["cpu"]["hit_tokens"] > 0


def test_steps_replay_with_each_backend(tmp_path):
    for policy, tier in (("apc", "native"), ("apc", "lmcache"), ("radix", "hicache")):
        data, _ = simulate(tmp_path, "--policy", policy, "--offload", tier, "--offload-size", "200000", "--replay",
                           "steps", "--arrival-from", "timestamp", "--step-seconds", "0.05")
        o = data["policies"][policy]["summary"]["offload"]
        assert o["offloaded_hit_tokens"] > 0 and data["policies"][policy]["scheduler"]["offload" if policy == "apc"
                                                                                       else "hicache"]


def test_without_offload_no_tier_fields(tmp_path):
    data, rows = simulate(tmp_path, "--policy", "all")
    for p in data["policies"].values():
        assert "offload" not in p["summary"] and "offload" not in p["config"]
    assert all("cached_by_tier" not in r for r in rows)


@pytest.mark.parametrize("args, needle", [
    (["--policy", "apc", "--offload", "native", "--offload-size", "10GiB"], "give --model"),
    (["--policy", "apc", "--offload", "native", "--offload-size", "1e5", "--hicache-ratio", "3"],
     "--hicache-ratio is an option of --offload hicache"),
    (["--policy", "apc", "--offload", "lmcache", "--offload-block-size", "32"], "not of --offload lmcache"),
    (["--policy", "radix", "--offload", "hicache", "--lmcache-chunk-size", "64"], "not of --offload hicache"),
    (["--policy", "apc", "--offload", "hicache"], "use it with --policy radix"),
    (["--policy", "radix", "--offload", "native", "--offload-size", "1e5"], "use it with --policy apc"),
    (["--policy", "radix", "--offload", "lmcache"], "use it with --policy apc"),
    (["--policy", "all", "--offload", "native", "--offload-size", "1e5"], "use it with --policy apc"),
    (["--policy", "apc", "--offload-size", "1e5"], "need(s) --offload"),
    (["--policy", "apc", "--offload", "native"], "needs --offload-size"),
    (["--policy", "apc", "--offload", "bogus"], "unknown --offload"),
    (["--policy", "apc", "--offload", "native", "--offload-size", "1e5", "--offload-block-size", "24"],
     "multiple of the GPU block"),
    (["--policy", "apc", "--offload", "native", "--offload-size", "1e5", "--offload-eviction-policy", "lfu"],
     "--offload-eviction-policy"),
    (["--policy", "radix", "--offload", "hicache", "--hicache-write-policy", "sometimes"], "--hicache-write-policy"),
    (["--policy", "radix", "--offload", "hicache", "--hicache-size", "5"], "give --model"),
    (["--policy", "radix", "--offload", "hicache", "--radix-tree", "classic"], "unified tree"),
    (["--policy", "apc", "--offload", "lmcache", "--offload-size", "1e5", "--lmcache-max-local-cpu-size", "1"],
     "size once"),
    (["--policy", "apc", "--offload", "native", "--offload-size", "lots"], "not a size"),
])
def test_bad_offload_input_exits_2_with_one_line(args, needle, capsys):
    assert run(["simulate", str(CHAT), "--limit", "5", "--capacity", "3000", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_an_offload_tier_needs_a_finite_gpu_pool(capsys):
    assert run(["simulate", str(CHAT), "--limit", "5", "--offload", "native", "--offload-size", "1e5"]) == 2
    assert "finite GPU pool" in capsys.readouterr().err
