"""`kvsim report` and `--html` on analyze, simulate and sweep: files written, privacy, options,
the GPU section, and one-line errors."""
from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path

import pytest

from kvsim.cli import run

TRACES = Path(__file__).resolve().parents[1] / "traces"
CHARTS = {"capacity", "block_policies", "block_size", "cached_fraction", "divergence", "prefix_tree", "groups"}
LOAD_CHARTS = {"load_hit_rate", "ttft"}     # the "Under load" section, on logs with timestamps


def _embedded(page: str) -> list[bytes]:
    return [base64.b64decode(b) for b in re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)]


def test_report_writes_the_page_and_the_pngs_next_to_it(tmp_path, capsys):
    """... into a folder it creates."""
    tmp_path = tmp_path / "new"
    out = tmp_path / "report.html"
    mask = os.umask(0o022)
    try:
        assert run(["report", str(TRACES / "multi_lora.jsonl"), "-o", str(out), "--capacity", "8000",
                    "--block-sizes", "16,64", "--no-concurrent"]) == 0
    finally:
        os.umask(mask)
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in tmp_path.iterdir())  # not mkstemp's 0600
    captured = capsys.readouterr()
    assert f"report written to {out}" in " ".join(captured.out.split())
    assert "report: [" in captured.err  # progress, phase by phase
    page = out.read_text(encoding="utf-8")
    pngs = {p.name: p.read_bytes() for p in tmp_path.glob("report_*.png")}
    assert set(pngs) == {f"report_{c}.png" for c in CHARTS}
    assert sorted(_embedded(page)) == sorted(pngs.values())   # the page embeds exactly these PNGs
    for title in ("Hit rate vs cache capacity", "Hit rate vs block size", "Cached share per request",
                  "Where sharing stops", "Top shared prefixes", "Tenants, adapters and the cost of isolation",
                  "Recommendation"):
        assert title in page
    assert "at 8,000 tokens" in page and "not estimated" in page
    assert "Under load" not in page       # --no-concurrent


def test_png_dir(tmp_path):
    out, pngs = tmp_path / "r.html", tmp_path / "figs"
    assert run(["report", str(TRACES / "code_review.jsonl"), "-o", str(out), "--png-dir", str(pngs),
                "--block-sizes", "16", "--no-concurrent"]) == 0
    # one namespace: no group chart
    assert {p.stem for p in pngs.glob("*.png")} == CHARTS - {"groups"}
    assert "no tenants, cache salts or LoRA adapters" in out.read_text()


def first_system_text(path: Path) -> str:
    row = json.loads(path.open().readline())
    return row["messages"][0]["content"][30:70]


def test_no_prompt_text_without_show_text(tmp_path):
    path = TRACES / "volatile_prefix.jsonl"
    secret = first_system_text(path)
    out = tmp_path / "r.html"
    assert run(["report", str(path), "-o", str(out), "--block-sizes", "16", "--top", "3"]) == 0
    page = out.read_text()
    assert secret not in page and "Request ID" not in page
    assert "prompt text is left out" in page
    assert run(["report", str(path), "-o", str(out), "--block-sizes", "16", "--top", "3", "--show-text",
                "--no-concurrent"]) == 0
    page = out.read_text()
    assert "Request ID" in page  # the volatile site's text, now asked for


def test_calibration_turns_saved_tokens_into_gpu_seconds(tmp_path):
    from kvsim.costs.calibration import Calibration

    cal = tmp_path / "cal.json"
    # 1 ms per prefill token, no attention term: the saving is exactly 1 ms per cached token
    Calibration(device="test-gpu", model="m", dtype="float32", fixed_s=0.0, per_token_s=1e-3,
                per_context_token_s=0.0).save(cal)
    out = tmp_path / "r.html"
    assert run(["report", str(TRACES / "rag.jsonl"), "-o", str(out), "--capacity", "inf",
                "--calibration", str(cal), "--block-sizes", "16", "--no-concurrent"]) == 0
    page = out.read_text()
    from kvsim import load_trace
    from kvsim.api import simulate

    tr = load_trace(TRACES / "rag.jsonl")
    cached = {p: int(simulate(tr, p).cached_tokens.sum()) for p in ("apc", "radix")}
    assert f"{cached['apc'] * 1e-3:,.1f} s / {cached['radix'] * 1e-3:,.1f} s" in page
    assert "m on test-gpu" in page


def test_model_adds_gib(tmp_path):
    out = tmp_path / "r.html"
    assert run(["report", str(TRACES / "rag.jsonl"), "-o", str(out), "--model", "llama-3-8b",
                "--block-sizes", "16", "--no-concurrent"]) == 0
    page = out.read_text()
    assert "GiB" in page and "KV cache memory [GiB]" not in page  # the axis label lives in the PNG
    assert "add --model for GiB" not in page


def test_gpu_results_add_the_gpu_section(tmp_path):
    pytest.importorskip("torch")
    gv = tmp_path / "gv"
    assert run(["gpu-validate", str(TRACES / "support_chat.jsonl"), "--device", "cpu", "--requests", "3",
                "--repeats", "1", "-o", str(gv), "--no-report"]) == 0
    out = tmp_path / "r.html"
    assert run(["report", str(TRACES / "support_chat.jsonl"), "-o", str(out), "--block-sizes", "16",
                "--gpu-results", str(gv / "gpu_validate.json"), "--calibration", str(gv / "calibration.json"),
                "--no-concurrent"]) == 0
    page = out.read_text()
    assert "id='gpu-validate'" in page and "GPU validation: PASS" in page
    gpu_pngs = {p.name for p in tmp_path.glob("r_gpu_*.png")}
    assert gpu_pngs == {"r_gpu_saving.png", "r_gpu_errors.png", "r_gpu_kernel.png"}
    assert len(_embedded(page)) == len(CHARTS - {"groups"}) + 3
    assert "not estimated" not in page


@pytest.mark.parametrize("command", [
    ["analyze"],
    ["simulate", "--policy", "apc", "--capacity", "6000"],
    ["sweep", "-c", "3000,12000", "--block-size", "16,64", "-j", "1"],
])
def test_html_option_on_analyze_simulate_and_sweep(command, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert run([command[0], str(TRACES / "multi_tenant.jsonl"), *command[1:], "--html", str(out)]) == 0
    assert f"report written to {out}" in " ".join(capsys.readouterr().out.split())
    page = out.read_text()
    assert len(_embedded(page)) == len(CHARTS | LOAD_CHARTS)
    if command[0] == "simulate":      # the simulated capacity is the report's
        assert "at 6,000 tokens" in page
    if command[0] == "sweep":         # the sweep's settings are the capacity chart's series
        assert "APC block 64" in page and "Exact replays of the sweep" in page


@pytest.mark.parametrize("args, message", [
    (["-o", "{trace}"], "refusing to write over an input file"),
    (["--capacity", "lots"], "--capacity: not a capacity"),
    (["--block-sizes", "16,x"], "--block-sizes"),
    (["--jobs", "0"], "--jobs"),
    (["--speedup", "0"], "--speedup must be positive"),
    (["--calibration", "{missing}"], "no such file"),
    (["--gpu-results", "{trace}"], "not a readable gpu-validate result"),
])
def test_bad_options_are_one_line_errors(args, message, tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_bytes((TRACES / "rag.jsonl").read_bytes())
    args = [a.format(trace=trace, missing=tmp_path / "nope.json") for a in args]
    before = trace.read_bytes()
    code = run(["report", str(trace), *(["-o", str(tmp_path / "r.html")] if "-o" not in args else []), *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err
    assert trace.read_bytes() == before


def test_trace_without_prompts_is_a_one_line_error(tmp_path, capsys):
    code = run(["report", str(TRACES / "public" / "AzureLLMInferenceTrace_code.csv"), "-o", str(tmp_path / "r.html"),
                "--limit", "50"])
    err = capsys.readouterr().err
    assert code == 2 and "report" in err and "Traceback" not in err
    assert not (tmp_path / "r.html").exists()
