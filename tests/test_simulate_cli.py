"""`kvsim simulate` end to end: side-by-side summary, JSON, per-request JSONL, clear errors."""
import json
from pathlib import Path

import pytest

from kvsim.cli import run

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "traces" / "multi_tenant.jsonl"


def test_all_policies_side_by_side_with_json_and_per_request(tmp_path, capsys):
    js, pr = tmp_path / "s.json", tmp_path / "r.jsonl"
    code = run(["simulate", str(DEMO), "--policy", "all", "--capacity-tokens", "5000", "--limit", "60",
                "--json", str(js), "--per-request", str(pr)])
    assert code == 0
    out = capsys.readouterr().out
    assert "vLLM APC" in out and "SGLang radix" in out and "token hit rate" in out
    data = json.loads(js.read_text())
    assert set(data["policies"]) == {"apc", "radix"}
    for name, p in data["policies"].items():
        s = p["summary"]
        assert s["requests"] == 60 and s["capacity_tokens"] <= 5000
        assert s["cached_tokens"] + s["computed_tokens"] == s["prompt_tokens"]
    rows = [json.loads(line) for line in pr.read_text().splitlines()]
    assert len(rows) == 120
    apc_rows = [r for r in rows if r["policy"] == "apc"]
    assert [r["index"] for r in apc_rows] == list(range(60))
    assert sum(r["cached_tokens"] for r in apc_rows) == data["policies"]["apc"]["summary"]["cached_tokens"]
    assert not any("content" in r or "messages" in r for r in rows)     # no prompt text


def test_unlimited_capacity_is_the_default_and_said(capsys):
    assert run(["simulate", str(DEMO), "--limit", "20"]) == 0
    assert "unlimited" in capsys.readouterr().out


@pytest.mark.parametrize("args,needle", [
    (["--capacity-tokens", "lots"], "capacity"),
    (["--capacity-tokens", "-4"], "positive"),
    (["--block-size", "0"], "block size"),
    (["--policy", "lfu"], "unknown policy"),
    (["--kv-cache-memory", "20GiB"], "--model"),
    (["--model", "gpt-9", "--gpu", "H100-80GB"], "unknown model"),
    (["--policy", "radix", "--finish", "eos"], "unknown finish"),
    (["--policy", "radix", "--radix-tree", "btree"], "unknown radix tree"),
    (["--policy", "radix", "--eviction-policy", "random"], "unknown radix eviction policy"),
])
def test_bad_configurations_exit_2_with_one_line(args, needle, capsys):
    assert run(["simulate", str(DEMO), "--limit", "5", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_outputs_never_overwrite_the_input(tmp_path, capsys):
    log = tmp_path / "log.jsonl"
    log.write_bytes(DEMO.read_bytes())
    assert run(["simulate", str(log), "--json", str(log)]) == 2
    assert "input file" in capsys.readouterr().err
    assert log.read_bytes() == DEMO.read_bytes()


def test_length_only_traces_are_refused_clearly(capsys):
    azure = ROOT / "traces" / "public" / "AzureLLMInferenceTrace_code.csv"
    assert run(["simulate", str(azure), "--limit", "10"]) == 2
    assert "no prefix information" in capsys.readouterr().err


def test_radix_engine_flags_reach_the_model(tmp_path):
    """--radix-tree/--disable-overlap-schedule/--eviction-policy are passed to the radix replay."""
    out = tmp_path / "s.json"
    assert run(["simulate", str(DEMO), "--policy", "radix", "--capacity-tokens", "3000", "--limit", "80",
                "--radix-tree", "classic", "--eviction-policy", "fifo", "--disable-overlap-schedule",
                "--json", str(out)]) == 0
    cfg = json.loads(out.read_text())["policies"]["radix"]["config"]
    assert cfg["eviction_policy"] == "fifo" and cfg["radix_tree"] == "classic" and cfg["overlap"] is False
