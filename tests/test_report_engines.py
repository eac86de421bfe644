"""The report covers the engines it is asked for, each drawn as its spec says: an engine from a
plugin with no one-pass curve and no optimum (``report_engine_spec.MirrorSpec``: APC's rules
under another name) gets its dense exact replays, block-size line, group bars, under-load
bars and table rows beside the built-ins."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from kvsim.engines import registry
from kvsim.engines.options import SimOptions
from kvsim.report import ReportOptions, build_report, render_html
from kvsim.report import build as B

TRACES = Path(__file__).resolve().parents[1] / "traces"
PLUGIN = "report_engine_spec:MirrorSpec"


@pytest.fixture
def mirror(monkeypatch):
    """The mirror engine registered for one test; the registry as it was afterwards."""
    saved, loaded = dict(registry._specs), registry._loaded
    monkeypatch.setenv(registry.PLUGINS_ENV, "")      # undone after the test, whatever load_plugin adds
    spec = registry.load_plugin(PLUGIN)
    yield spec
    registry._specs.clear()
    registry._specs.update(saved)
    registry._loaded = loaded


@pytest.fixture
def charts(monkeypatch):
    """The series each capacity and block-size chart was drawn from, by chart function, in order."""
    drawn: dict[str, list] = {"capacity": [], "block_size": []}
    for name in drawn:
        real = getattr(B.F, f"{name}_chart")

        def spy(series, *args, _real=real, _name=name, **kwargs):
            drawn[_name].append((list(series), kwargs))
            return _real(series, *args, **kwargs)

        monkeypatch.setattr(B.F, f"{name}_chart", spy)
    return drawn


def _trace(n: int = 80):
    from kvsim import load_trace

    return load_trace(TRACES / "multi_tenant.jsonl", limit=n)


def _section(data, sid):
    return next(s for s in data.sections if s.id == sid)


def test_a_plugin_engine_is_reported_beside_the_built_ins(mirror, charts):
    """Its key card, replays (APC's, hit for hit), block-size line, group bars, under-load bars
    and table rows appear; it gets no optimum and no one-pass curve."""
    options = ReportOptions(sim=SimOptions(capacity_tokens=3000), block_sizes=(16, 32),
                            policies="apc,radix,mirror", speedup=4)
    data = build_report(_trace(), options)
    n = data.numbers
    assert list(n["hit_rate"]) == ["apc", "radix", "mirror"]
    assert n["hit_rate"]["mirror"] == n["hit_rate"]["apc"] > 0
    assert set(n["optimal_hit_rate"]) == {"apc", "radix"}
    assert n["target_from"] == "apc"
    assert "Mirror blocks hit rate" in {k.label for k in data.key_numbers}

    series, kwargs = charts["capacity"][0]      # then the block-level policies' chart
    mine = [s for s in series if s["policy"] == "mirror"]
    assert {s["kind"] for s in mine} <= {"joined", "exact"} and any(s["kind"] == "joined" for s in mine)
    assert kwargs["colors"]["mirror"] == "#0f766e"
    joined = next(s for s in mine if s["kind"] == "joined")
    assert joined["label"].startswith("Mirror blocks (block 16): exact replays at ")

    capacity = _section(data, "capacity")
    table = capacity.tables[0]
    assert "MIR hit rate" in table.header and "MIR optimum" not in table.header
    apc, mir = table.header.index("APC hit rate"), table.header.index("MIR hit rate")
    both = [r for r in table.rows if r[apc] != "-" and r[mir] != "-"]
    assert both and all(r[apc] == r[mir] for r in both)     # the same rules: the same replays
    assert "MIR: exact replays joined by a line" in capacity.charts[0].caption
    assert "it has no one-pass curve" in capacity.charts[0].caption

    blocks, _ = charts["block_size"][-1]
    lines = {s["policy"]: s for s in blocks}
    assert lines["mirror"]["sizes"] == [16, 32] and lines["mirror"]["hit_rate"] == lines["apc"]["hit_rate"]
    assert "MIR goes from" in _section(data, "block-size").charts[0].caption

    groups = _section(data, "groups")
    assert groups.charts and "MIR " in groups.charts[0].caption

    load = _section(data, "concurrent")
    assert "Mirror blocks" in load.charts[0].caption
    rows = {r[0] for r in load.tables[0].rows}
    assert "Mirror blocks" in rows and "SGLang radix (lpm)" in rows
    assert n["concurrent"]["mirror"]["concurrent_hit_rate"] == n["concurrent"]["apc"]["concurrent_hit_rate"]

    notes = _section(data, "notes")
    assert any(b.startswith("Mirror blocks (mirror, a plugin engine") for b in notes.bullets)
    page = render_html(data)
    assert "Mirror blocks" in page and page.count('<img src="data:image/png;base64,') == len(data.charts)


def test_a_report_of_an_engine_without_a_curve_reads_its_capacity_off_block_lru(mirror):
    """No engine has an exact curve: the capacity for 90% comes from block LRU, and the notes
    say so."""
    data = build_report(_trace(60), ReportOptions(block_sizes=(16,), policies=["mirror"], concurrent=False))
    n = data.numbers
    assert list(n["hit_rate"]) == ["mirror"] and n["optimal_hit_rate"] == {}
    assert n["target_from"] is None and "block LRU" in n["capacity_source"]
    assert n["capacity_tokens"]["mirror"] == pytest.approx(n["target_capacity"], abs=16)
    assert math.isfinite(n["capacity_tokens"]["mirror"])
    assert any("No engine in this report has an exact one-pass curve" in note for note in data.notes)
    cards = {k.label: k for k in data.key_numbers}
    assert "block LRU" in cards["KV memory for 90% of the bound"].detail
    assert "a block LRU cache of 16-token blocks (one-pass) at" in _section(data, "capacity").charts[0].caption


def test_report_policy_option_on_the_command_line(mirror, tmp_path):
    from kvsim.cli import run

    out = tmp_path / "r.html"
    assert run(["report", str(TRACES / "multi_tenant.jsonl"), "-o", str(out), "--limit", "40", "--capacity", "3000",
                "--block-sizes", "16", "--no-concurrent", "--policy", "mirror,apc"]) == 0
    page = out.read_text(encoding="utf-8")
    assert "Mirror blocks hit rate" in page and "vLLM APC hit rate" in page and "SGLang radix" not in page


def test_an_unknown_policy_is_a_clear_error():
    from kvsim.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown policy 'nope'"):
        ReportOptions(policies="apc,nope")
