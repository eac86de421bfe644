"""The report's numbers and pictures, from traces whose answers are known by construction."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kvsim.errors import KvsimError
from kvsim.io.trace.columns import Trace
from kvsim.engines.options import SimOptions
from kvsim.report import ReportOptions, build_report, capacity_for_share, render_html
from kvsim.report.prefix_tree import icicle_layout


def _prompts(rng: np.random.Generator, parts: list[tuple[int, int]]) -> list[np.ndarray]:
    """Prompts built from (shared-segment id, length) pieces; segment ids >= 1000 are unique."""
    segs: dict[int, np.ndarray] = {}
    out = []
    for plan in parts:
        pieces = []
        for sid, n in plan:
            if sid not in segs:
                segs[sid] = rng.integers(1000, 90000, n)
            pieces.append(segs[sid][:n])
        out.append(np.concatenate(pieces))
    return out


def _shared_prefix_trace(n: int = 10, shared: int = 64, own: int = 32) -> Trace:
    """n requests: one shared ``shared``-token prefix, then ``own`` tokens of their own."""
    rng = np.random.default_rng(0)
    plans = [[(0, shared), (1000 + i, own)] for i in range(n)]
    return Trace.from_prompts(_prompts(rng, plans))


def test_key_numbers_of_a_shared_prefix_trace_are_the_arithmetic():
    """10 requests share 64 of 96 tokens: 9 x 64 / 960 = 60% at every level, unlimited cache."""
    tr = _shared_prefix_trace()
    data = build_report(tr, ReportOptions(sim=SimOptions(capacity_tokens=math.inf), block_sizes=(16, 32)))
    n = data.numbers
    assert n["upper_bound_token"] == pytest.approx(0.6)
    assert n["upper_bound_apc_block16"] == pytest.approx(0.6)
    assert n["hit_rate"] == {"apc": pytest.approx(0.6), "radix": pytest.approx(0.6)}
    assert n["cached_tokens"] == {"apc": 9 * 64, "radix": 9 * 64}
    assert n["capacity_source"] == "given" and n["capacity_tokens"]["apc"] == math.inf
    assert n["gpu_seconds_saved"] is None
    cards = {k.label: k for k in data.key_numbers}
    assert cards["vLLM APC hit rate"].value == "60.0%"
    assert cards["Estimated GPU time saved"].value == "not estimated"


def test_default_capacity_is_the_kv_for_90_percent_of_the_bound():
    """Without a capacity, the report replays at the exact APC curve's 90% point; APC really
    reaches 90% of its unlimited rate there and not one block below."""
    from kvsim.api import simulate
    from kvsim.sweep.curves import curve_model

    tr = _trace_with_reuse_distance()
    data = build_report(tr, ReportOptions(block_sizes=(16,)))
    cap = data.numbers["capacity_tokens"]["apc"]
    assert "90%" in data.numbers["capacity_source"]
    assert cap == data.numbers["capacity_for_target"]["apc"]
    full = simulate(tr, "apc", capacity_tokens=math.inf)
    unlimited = full.cached_tokens.sum() / tr.prompt_lengths.sum()
    at = simulate(tr, "apc", capacity_tokens=cap)
    below = simulate(tr, "apc", capacity_tokens=cap - 16)
    rate = lambda r: r.cached_tokens[~r.rejected].sum() / tr.prompt_lengths[~r.rejected].sum()  # noqa: E731
    assert rate(at) >= 0.9 * unlimited > rate(below)
    assert data.numbers["hit_rate"]["apc"] == pytest.approx(rate(at))
    assert capacity_for_share(curve_model(tr, "apc"), 0.9) == cap


def _trace_with_reuse_distance() -> Trace:
    """8 prompts (each 128 shared + 32 own tokens) revisited in rounds: LRU needs them all."""
    rng = np.random.default_rng(1)
    plans = [[(k, 128), (1000 + 100 * r + k, 32)] for r in range(4) for k in range(8)]
    return Trace.from_prompts(_prompts(rng, plans))


def test_capacity_for_share_is_none_when_nothing_is_reused():
    from kvsim.sweep.curves import curve_model

    rng = np.random.default_rng(2)
    tr = Trace.from_prompts(_prompts(rng, [[(1000 + i, 40)] for i in range(5)]))
    assert capacity_for_share(curve_model(tr, "apc"), 0.9) is None
    data = build_report(tr, ReportOptions(block_sizes=(16,)))
    assert data.numbers["capacity_tokens"]["apc"] == math.inf
    assert data.numbers["hit_rate"]["apc"] == 0.0


def test_icicle_boxes_are_the_shared_prefixes():
    """6 requests share A (48 tokens), 3 of them go on with B (32 more); 4 others share C (32)."""
    rng = np.random.default_rng(3)
    plans = ([[(0, 48), (1, 32), (1000 + i, 20)] for i in range(3)]
             + [[(0, 48), (1010 + i, 40)] for i in range(3)]
             + [[(2, 32), (1020 + i, 40)] for i in range(4)]
             + [[(1030, 64)]])
    tr = Trace.from_prompts(_prompts(rng, plans))
    lay = icicle_layout(tr)
    boxes = sorted((s["x0"], s["width"], s["y0"], s["y1"]) for s in lay["segments"])
    assert boxes == sorted([(0, 6, 0, 48), (0, 3, 48, 80), (6, 4, 0, 32)])
    assert lay["total_requests"] == 11 and lay["shared_requests"] == 10 and lay["max_depth_tokens"] == 80


def test_icicle_labels_match_the_analyzer_top_prefixes():
    from kvsim.analyze import AnalyzeOptions, analyze

    tr = _trace_with_reuse_distance()
    top = analyze(tr, AnalyzeOptions(top=5)).to_dict()["prefixes"]["top"]
    lay = icicle_layout(tr, top)
    labelled = {s["rank_label"]: s for s in lay["segments"] if s["rank_label"]}
    assert set(labelled) == {f"#{p['rank']}" for p in top}
    for p in top:
        s = labelled[f"#{p['rank']}"]
        assert s["requests"] == p["requests"] and s["y1"] == p["length"] // 16 * 16


def test_icicle_keeps_namespaces_apart():
    """The same prompt under two cache salts is two trees, one per namespace band."""
    rng = np.random.default_rng(4)
    prompts = _prompts(rng, [[(0, 64), (1000 + i, 16)] for i in range(6)])
    tr = Trace.from_prompts(prompts, cache_salts=["a", "a", "a", "b", "b", "b"])
    lay = icicle_layout(tr)
    assert sorted(s["width"] for s in lay["segments"]) == [3, 3]
    assert sorted(ns["label"] for ns in lay["namespaces"]) == ["salt a", "salt b"]


def test_group_bars_show_the_cost_of_isolation():
    """Two tenants with the same prompts under different salts: sharing would double the hits."""
    rng = np.random.default_rng(5)
    prompts = _prompts(rng, [[(0, 64), (1000 + i, 16)] for i in range(8)])
    salts = ["t1", "t2"] * 4
    tr = Trace.from_prompts(prompts, cache_salts=salts, tenants=salts)
    data = build_report(tr, ReportOptions(sim=SimOptions(capacity_tokens=math.inf), block_sizes=(16,)))
    groups = next(s for s in data.sections if s.id == "groups")
    assert [c.name for c in groups.charts] == ["groups"]
    # honoured: each tenant reuses 64 tokens in 3 of its 4 requests; shared: 7 of the 8 requests
    assert data.numbers["hit_rate"]["apc"] == pytest.approx(6 * 64 / (8 * 80))
    assert "+10.0 points with cache salts ignored" in groups.charts[0].caption


def test_every_chart_has_a_title_labelled_axes_with_units_and_a_caption(monkeypatch):
    from kvsim.report import build as B

    figures = []
    real = B._Builder._chart
    monkeypatch.setattr(B._Builder, "_chart",
                        lambda self, name, fig, *a: figures.append(fig) or real(self, name, fig, *a))
    tr = _trace_with_reuse_distance()
    data = build_report(tr, ReportOptions(block_sizes=(16, 32)))
    assert len(figures) == len(data.charts) >= 5
    for fig in figures:
        for ax in fig.axes:
            if not ax.get_visible() or not ax.get_xlabel():  # secondary axes share the main title
                continue
            assert "[" in ax.get_xlabel() and "[" in ax.get_ylabel(), (ax.get_xlabel(), ax.get_ylabel())
        assert any(ax.get_title(loc="left") for ax in fig.axes)
    for chart in data.charts:
        assert chart.title and chart.alt
        assert chart.caption.endswith(".") and chart.caption.count(". ") == 0, chart.caption
        assert chart.png.startswith(b"\x89PNG")


def test_page_is_self_contained_and_escapes_text():
    tr = _shared_prefix_trace()
    data = build_report(tr, ReportOptions(sim=SimOptions(capacity_tokens=1000), block_sizes=(16,),
                                          title="<script>alert(1)</script>"))
    page = render_html(data)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "http://" not in page and "https://" not in page and "<link" not in page
    assert page.count('<img src="data:image/png;base64,') == len(data.charts)
    assert "Content-Security-Policy" in page


def test_a_trace_without_tokens_is_a_clear_error():
    tr = Trace(offsets=np.array([0, 5, 9]), tokens=None, output_lengths=np.array([1, 1]),
               arrival=np.array([0.0, 1.0]))
    with pytest.raises(KvsimError, match="report"):
        build_report(tr)


def test_replay_batches_run_on_every_core_only_when_large(monkeypatch):
    """By default a batch of exact replays goes to a worker per core once it replays
    PARALLEL_MIN_TOKENS prompt tokens in all, else it runs in this process; ``jobs`` decides
    when given. The page is the same either way."""
    import kvsim.report.build as build
    from kvsim.sweep import executors

    tr = _trace_with_reuse_distance()
    asked: list = []
    real = executors.make_executor
    monkeypatch.setattr(executors, "make_executor",
                        lambda name="local", jobs=None: asked.append(jobs) or real(name, jobs))
    in_process = render_html(build_report(tr, ReportOptions(block_sizes=(16,))))
    assert asked and set(asked) == {1}           # a small log: every batch here
    asked.clear()
    monkeypatch.setattr(build, "PARALLEL_MIN_TOKENS", 1)
    on_every_core = render_html(build_report(tr, ReportOptions(block_sizes=(16,))))
    assert asked and set(asked) == {None}
    asked.clear()
    given = render_html(build_report(tr, ReportOptions(block_sizes=(16,), jobs=1)))
    assert set(asked) == {1}
    assert on_every_core == in_process == given


def test_charts_drawn_in_a_forked_child_are_the_same_bytes(monkeypatch):
    """Every other chart's PNG is drawn by a forked child beside the process (kvsim.drive.side):
    the bytes are those the process draws itself, in the charts' order."""
    from kvsim.drive import side

    if not side.can_fork():
        pytest.skip("needs Linux and two cores (os.fork): nothing is drawn beside the process here")
    forks: list[int] = []
    real = side.Side._fork
    monkeypatch.setattr(side.Side, "_fork", lambda self: forks.append(1) or real(self))
    tr = _shared_prefix_trace()
    beside = build_report(tr, ReportOptions(block_sizes=(16, 32)))
    assert forks
    monkeypatch.setenv(side.ENV, "0")
    forks.clear()
    in_turn = build_report(tr, ReportOptions(block_sizes=(16, 32)))
    assert not forks
    charts = [(c.name, c.png) for s in beside.sections for c in s.charts]
    assert len(charts) >= 4 and all(png.startswith(b"\x89PNG") for _, png in charts)
    assert charts == [(c.name, c.png) for s in in_turn.sections for c in s.charts]
