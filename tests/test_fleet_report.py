"""The report's Fleet section (kvsim/report/fleet.py), from the fleet summaries of a replay."""
from __future__ import annotations

import numpy as np

from kvsim.engines.options import SimOptions
from kvsim.fleet.config import FleetSpec
from kvsim.fleet.sequential import run_fleet_simulation
from kvsim.io.trace.columns import Trace
from kvsim.report.document import Chart
from kvsim.report.figures import png_bytes
from kvsim.report.fleet import fleet_section


def test_fleet_section_has_the_attribution_and_every_replica():
    rng = np.random.default_rng(0)
    systems = [rng.integers(0, 900, 300) for _ in range(4)]
    prompts = [np.concatenate([systems[i % 4], rng.integers(0, 900, 30)]) for i in range(60)]
    trace = Trace.from_prompts(prompts, output_lengths=[8] * 60)
    runs = run_fleet_simulation(trace, ["apc", "radix"], SimOptions(capacity_tokens=1200), FleetSpec(3, "round_robin"))
    fleets = {name: run.fleet_summary(trace) for name, run in runs.items()}
    section = fleet_section(fleets, {"apc": "vLLM APC", "radix": "SGLang radix"},
                            lambda name, fig, caption, alt: Chart(name, name, caption, png_bytes(fig), alt))
    assert [c.name for c in section.charts] == ["fleet_attribution", "fleet_replicas_apc", "fleet_replicas_radix"]
    assert all(c.png.startswith(b"\x89PNG") for c in section.charts)
    assert [len(t.rows) for t in section.tables] == [3, 3]
    f = fleets["apc"]
    assert f"delivered {f['token_hit_rate']:.1%}" in section.paragraphs[1]
    assert f"the larger gap is {f['larger_gap']}" in section.paragraphs[1] or f["larger_gap"] == "neither"


def test_report_command_adds_the_fleet_section(tmp_path):
    """kvsim report --replicas N --router R: the page has the Fleet section at the chosen capacity."""
    from pathlib import Path

    from kvsim.cli import run

    log = Path(__file__).resolve().parents[1] / "traces" / "multi_tenant.jsonl"
    out = tmp_path / "report.html"
    assert run(["report", str(log), "--capacity", "3000", "--limit", "80", "--replicas", "3", "--router",
                "cache_aware", "--no-concurrent", "-o", str(out)]) == 0
    page = out.read_text()
    assert "Fleet: 3 replicas behind cache_aware" in page and "Replicas of vLLM APC" in page
