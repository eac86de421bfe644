"""The report's Memory tiers section (kvsim/report/offload.py): `kvsim report --offload ...` shows
each engine of the tier at the chosen capacity, with the figures of `kvsim simulate --json`'s
summary.offload at the same settings, and no prompt text."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvsim.cli import run
from kvsim.engines.options import SimOptions
from kvsim.io.load import load_trace
from kvsim.report import ReportOptions
from kvsim.report.build import build_report

ROOT = Path(__file__).resolve().parents[1]
CHAT = ROOT / "traces" / "support_chat.jsonl"     # multi-turn sessions with timestamps: reuse beyond the GPU


def simulate_offload(tmp_path, policy: str, *args) -> dict:
    js = tmp_path / "s.json"
    assert run(["simulate", str(CHAT), "--policy", policy, "--capacity", "3000", *args, "--json", str(js)]) == 0
    return json.loads(js.read_text())["policies"][policy]["summary"]["offload"]


@pytest.mark.parametrize("policy, tier", [
    ("apc", {"offload": "native", "offload_size": "20000"}),
    ("apc", {"offload": "lmcache", "offload_size": "1000", "disk_size": "5000", "lmcache_chunk_size": 64}),
    ("radix", {"offload": "hicache", "offload_size": "20000"}),
])
def test_the_section_has_simulates_figures(tmp_path, policy, tier):
    trace = load_trace([CHAT])
    data = build_report(trace, ReportOptions(sim=SimOptions(capacity_tokens=3000), offload=tier, concurrent=False,
                                             block_sizes=(16,)))
    args = [x for k, v in tier.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    expected = simulate_offload(tmp_path, policy, *args)
    got = data.numbers["offload"]
    assert list(got) == [policy]                       # only the engine that takes this tier
    assert got[policy] == expected
    (section,) = [s for s in data.sections if s.id == "offload"]
    assert [c.name for c in section.charts] == ["offload_tiers"] and section.charts[0].png.startswith(b"\x89PNG")
    (table,) = section.tables
    assert [row[0] for row in table.rows] == ["GPU", "CPU memory", *(["disk"] if "disk_size" in tier else [])]
    for row, t in zip(table.rows, expected["tiers"].values()):
        assert row[2] == f"{t['hit_tokens']:,}" and row[3] == f"{t['hit_rate']:.1%}"
        if "stored_tokens" in t:
            assert row[5:] == [f"{t['stored_tokens']:,}", f"{t['loaded_tokens']:,}", f"{t['evicted_tokens']:,}"]
            assert row[1] == f"{t['capacity_tokens']:,}"
    assert expected["offloaded_hit_tokens"] > 0


def test_report_command_adds_the_section_with_ttft_and_no_prompt_text(tmp_path):
    out = tmp_path / "report.html"
    args = ["--offload", "native", "--offload-size", "20000", "--model", "llama-3-8b", "--gpu", "H100-80GB"]
    assert run(["report", str(CHAT), "--capacity", "3000", "--block-sizes", "16", *args, "-o", str(out)]) == 0
    page = out.read_text()
    o = simulate_offload(tmp_path, "apc", *args)
    assert "Memory tiers: --offload native" in page and "Tiers of vLLM APC" in page
    cpu = o["tiers"]["cpu"]
    assert f"{cpu['hit_tokens']:,}" in page and f"{cpu['hit_rate']:.1%}" in page
    assert "Timed replay of the same load with the tier (without it)" in page and "TTFT p90" in page
    assert "loading took" in page                      # --model and --gpu: loads against recompute
    first = json.loads(CHAT.open().readline())["messages"][0]["content"]
    assert first[30:70] not in page and first[:40] not in page
    assert (tmp_path / "report_offload_tiers.png").exists()


def test_without_offload_no_section(tmp_path):
    trace = load_trace([CHAT], limit=30)
    data = build_report(trace, ReportOptions(sim=SimOptions(capacity_tokens=3000), concurrent=False,
                                             block_sizes=(16,)))
    assert all(s.id != "offload" for s in data.sections) and data.numbers["offload"] is None


@pytest.mark.parametrize("args, needle", [
    (["--offload", "bogus", "--offload-size", "1e4"], "unknown --offload"),
    (["--offload-size", "1e4"], "need(s) --offload"),
    (["--policy", "apc", "--offload", "hicache"], "use it with --policy radix"),
    (["--policy", "radix", "--offload", "native", "--offload-size", "1e4"], "use it with --policy apc"),
    (["--offload", "native", "--offload-size", "-3"], "--offload-size must be a positive"),
    (["--offload", "native"], "needs --offload-size"),
    (["--offload", "native", "--offload-size", "1GiB"], "give --model"),
])
def test_bad_tier_options_exit_2_with_one_line(tmp_path, args, needle, capsys):
    assert run(["report", str(CHAT), "--limit", "5", "--capacity", "3000", *args, "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "r.html").exists()
