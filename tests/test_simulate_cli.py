"""`kvsim simulate` end to end: side-by-side summary, JSON, per-request JSONL, clear errors."""
import json
from pathlib import Path

import pytest

from kvsim.cli import run

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "traces" / "multi_tenant.jsonl"


def test_all_policies_side_by_side_with_json_and_per_request(tmp_path, capsys):
    js, pr = tmp_path / "s.json", tmp_path / "r.jsonl"
    code = run(["simulate", str(DEMO), "--policy", "all", "--capacity", "5000", "--limit", "60",
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
    (["--capacity", "lots"], "capacity"),
    (["--capacity", "-4"], "positive"),
    (["--block-size", "0"], "block size"),
    (["--policy", "lfu"], "unknown policy"),
    (["--kv-cache-memory", "20GiB"], "--model"),
    (["--model", "gpt-9", "--gpu", "H100-80GB"], "unknown model"),
    (["--policy", "radix", "--finish", "eos"], "unknown finish"),
    (["--policy", "radix", "--radix-tree", "btree"], "unknown radix tree"),
    (["--policy", "radix", "--eviction", "random"], "unknown radix eviction policy"),
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
    """--radix-tree/--disable-overlap-schedule/--eviction are passed to the radix replay."""
    out = tmp_path / "s.json"
    assert run(["simulate", str(DEMO), "--policy", "radix", "--capacity", "3000", "--limit", "80",
                "--radix-tree", "classic", "--eviction", "fifo", "--disable-overlap-schedule",
                "--json", str(out)]) == 0
    cfg = json.loads(out.read_text())["policies"]["radix"]["config"]
    assert cfg["eviction_policy"] == "fifo" and cfg["radix_tree"] == "classic" and cfg["overlap"] is False


def test_logprob_requests_are_counted_per_policy(tmp_path):
    """Requests whose cache read a logprob request skips (APC: prompt logprobs) or caps
    (radix: logprob_start_len below len - 1) are counted in the summary and flagged per row."""
    sys_ = list(range(100, 140))
    recs = [{"prompt_token_ids": sys_ + [1, 2, 3], "output_length": 2},
            {"prompt_token_ids": sys_ + [4, 5, 6], "output_length": 2, "prompt_logprobs": 1},
            {"prompt_token_ids": sys_ + [7, 8, 9], "output_length": 2, "logprob_start_len": 20},
            {"prompt_token_ids": sys_ + [7, 8, 9], "output_length": 2, "logprob_start_len": 99},
            {"prompt_token_ids": sys_ + [1, 2, 3, 4], "output_length": 2}]
    log = tmp_path / "lp.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in recs))
    js, pr = tmp_path / "s.json", tmp_path / "r.jsonl"
    assert run(["simulate", str(log), "--policy", "all", "--json", str(js), "--per-request", str(pr)]) == 0
    data = json.loads(js.read_text())["policies"]
    assert data["apc"]["summary"]["cache_reads_skipped"] == 1       # prompt_logprobs only
    assert data["radix"]["summary"]["cache_reads_skipped"] == 2     # starts 0 and 20; 99 is past the prompt
    rows = [json.loads(line) for line in pr.read_text().splitlines()]
    skipped = {p: [r["cache_read_skipped"] for r in rows if r["policy"] == p] for p in ("apc", "radix")}
    assert skipped == {"apc": [False, True, False, False, False], "radix": [False, True, True, False, False]}
    radix = [r for r in rows if r["policy"] == "radix"]
    assert [r["cached_tokens"] for r in radix] == [0, 0, 20, 0, 43]
    assert [r["rejected"] for r in radix] == [False, False, False, True, False]
    apc = [r for r in rows if r["policy"] == "apc"]
    assert [r["cached_tokens"] for r in apc] == [0, 0, 32, 32, 32]
