"""The report's "Under load" section: it renders, its numbers are the scheduler models', and a
log without timestamps gets one line instead."""
from __future__ import annotations

import json
from pathlib import Path

from kvsim.cli import run

TRACES = Path(__file__).resolve().parents[1] / "traces"


def test_section_shows_the_concurrent_views_numbers(tmp_path, capsys):
    """Hit rates in the caption are concurrent_view's at the report's capacity, arrivals sped up 4x."""
    from kvsim import load_trace
    from kvsim.engines.options import SimOptions
    from kvsim.report import text as T
    from kvsim.drive.step_cost import step_cost
    from kvsim.drive.concurrent import ReplayMode
    from kvsim.drive.views import concurrent_view

    out = tmp_path / "r.html"
    assert run(["report", str(TRACES / "demo_mixture.jsonl"), "-o", str(out), "--capacity", "6000", "--limit", "60",
                "--block-sizes", "16", "--speedup", "4"]) == 0
    assert "concurrent replay (radix)" in capsys.readouterr().err     # progress names the phase
    page = out.read_text(encoding="utf-8")
    assert {"r_load_hit_rate.png", "r_ttft.png"} <= {p.name for p in tmp_path.glob("*.png")}
    assert "Under load: concurrent replay" in page and 'id="fig-ttft"' in page
    assert "roofline of llama-3-8b" in page and "not given: the report&#x27;s default" in page
    assert "4x faster than logged" in page
    trace = load_trace(TRACES / "demo_mixture.jsonl", limit=60)
    cost, mode = step_cost("llama-3-8b", "H100-80GB"), ReplayMode("timed", speedup=4.0)
    options = SimOptions(capacity_tokens=6000, gpu="H100-80GB")
    apc, radix = (concurrent_view(trace, options, p, cost, mode=mode) for p in ("apc", "radix"))
    assert (f"vLLM APC {T.pct(apc.sequential_hit_rate)} → {T.pct(apc.concurrent_hit_rate)}, SGLang radix "
            f"{T.pct(radix.sequential_hit_rate)} → {T.pct(radix.concurrent_hit_rate)} with its default fcfs queue, "
            f"{T.pct(radix.policy_hit_rates['lpm'])} with lpm") in page


def test_a_log_without_timestamps_gets_one_line(tmp_path):
    log = tmp_path / "no_time.jsonl"
    rows = [json.loads(line) for line in (TRACES / "code_review.jsonl").open().readlines()[:20]]
    log.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "timestamp"}) + "\n" for r in rows))
    out = tmp_path / "r.html"
    assert run(["report", str(log), "-o", str(out), "--block-sizes", "16"]) == 0
    page = out.read_text(encoding="utf-8")
    assert "No concurrent view: not every request has a timestamp" in page
    assert not list(tmp_path.glob("r_ttft.png")) and not list(tmp_path.glob("r_load_hit_rate.png"))


def test_step_cost_is_the_calibration_when_given(tmp_path):
    """--calibration replaces the roofline; without --model/--gpu the page names the defaults."""
    from kvsim.costs.calibration import Calibration
    from kvsim.engines.options import SimOptions
    from kvsim.report import ReportOptions
    from kvsim.report.concurrent import step_cost_for
    from kvsim.drive.step_cost import CalibratedStepCost, RooflineStepCost

    cal = Calibration(device="test-gpu", model="m", dtype="float32", fixed_s=1e-3, per_token_s=1e-5,
                      per_context_token_s=0.0)
    cost, text = step_cost_for(ReportOptions(calibration=cal))
    assert isinstance(cost, CalibratedStepCost) and text == "calibration of m on test-gpu"
    cost, text = step_cost_for(ReportOptions(sim=SimOptions(gpu="A100-80GB"), model="qwen2.5-7b"))
    assert isinstance(cost, RooflineStepCost) and "not given" not in text and "A100" in text
    _, text = step_cost_for(ReportOptions())
    assert "llama-3-8b" in text and "--model and --gpu not given" in text
