"""The report's charts: one matplotlib function per chart, each taking plain data.

Every function returns a :class:`matplotlib.figure.Figure` with a title and labelled axes
(units in brackets); :func:`png_bytes` turns it into PNG bytes. No pyplot state is used, so
nothing needs a display. An engine's colour comes with the data (``colors``: policy -> colour,
from its spec); the bound, the optimum and the block-level policies have fixed ones.
"""
from __future__ import annotations

import io
import math
from typing import Any, Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter, PercentFormatter

COLORS = {"bound": "#6b7280", "block-lru": "#4d8a3a", "block-fifo": "#8c564b", "optimal": "#111111"}
OTHER = "#444444"            # a policy without a colour
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v")
_WIDE = (8.6, 4.4)
_DPI = 110


def _figure(size: tuple[float, float] = _WIDE) -> Figure:
    fig = Figure(figsize=size, dpi=_DPI)
    fig.set_layout_engine("constrained")
    return fig


def _style(ax, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=11, loc="left")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3, lw=0.6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _palette(colors: dict[str, str] | None) -> dict[str, str]:
    """The fixed colours with the engines' (``colors``) over them."""
    return {**COLORS, **(colors or {})}


def tokens_label(x: float, _pos: Any = None) -> str:
    """12k, 1.5M: a compact token count for axis ticks."""
    if x >= 1e6:
        return f"{x / 1e6:g}M"
    if x >= 1e3:
        return f"{x / 1e3:g}k"
    return f"{x:g}"


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes (no timestamp or software metadata, so reruns are identical)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


# -- hit rate vs capacity -------------------------------------------------------------------

def capacity_chart(series: Sequence[dict[str, Any]], bounds: dict[str, float] | None = None,
                   chosen: dict[str, float] | None = None, kv_bytes_per_token: int | None = None,
                   title: str = "Token hit rate vs KV cache capacity",
                   marks: dict[str, tuple[str, float]] | None = None, colors: dict[str, str] | None = None) -> Figure:
    """Hit rate against usable KV capacity (log scale).

    ``series``: dicts with ``policy``, ``label``, ``kind`` ("curve" = a step line, "exact" =
    markers, "joined" = exact replays joined by a line, "optimal" = a thin dotted line),
    ``capacity_tokens`` and ``hit_rate`` (fractions). ``bounds``: label -> the
    unlimited-cache rate (a dashed horizontal line). ``chosen``: policy -> capacity marked
    with a vertical line. ``marks``: policy -> (text, capacity), a triangle on the x axis
    (e.g. where an engine reaches 90% of the optimum), named in the legend. With ``kv_bytes_per_token`` a top
    axis shows GiB. ``colors``: policy -> colour.
    """
    palette = _palette(colors)
    fig = _figure()
    ax = fig.add_subplot()
    style_of: dict[str, int] = {}
    for s in series:
        x = np.asarray(s["capacity_tokens"], np.float64)
        y = np.asarray(s["hit_rate"], np.float64) * 100
        keep = np.isfinite(x) & (x > 0)
        color = palette.get(s["policy"], OTHER)
        k = style_of.setdefault(s.get("setting", s["label"]), len(style_of))
        if s["kind"] == "curve":
            ax.plot(x[keep], y[keep], color=color, lw=2, ls=LINESTYLES[k % len(LINESTYLES)],
                    drawstyle="steps-post", label=s["label"])
        elif s["kind"] == "joined":
            ax.plot(x[keep], y[keep], color=color, lw=2, marker=MARKERS[k % len(MARKERS)], ms=3.5,
                    label=s["label"])
        elif s["kind"] == "optimal":
            ax.plot(x[keep], y[keep], color=color, lw=1.4, ls=(0, (1, 1.5)), label=s["label"])
        else:
            ax.plot(x[keep], y[keep], ls="none", marker=MARKERS[k % len(MARKERS)], ms=6, mfc="white",
                    mec=color, mew=1.6, color=color, label=s["label"])
    for k, (label, rate) in enumerate((bounds or {}).items()):
        ax.axhline(rate * 100, color=palette["bound"], ls=LINESTYLES[(k + 1) % len(LINESTYLES)], lw=1,
                   label=label)
    for policy, cap in (chosen or {}).items():
        if cap is not None and math.isfinite(cap):
            ax.axvline(cap, color=palette.get(policy, OTHER), lw=1, alpha=0.6, ls="--")
            ax.annotate(f"chosen: {tokens_label(cap)}", (cap, 2), xytext=(4, 0), textcoords="offset points",
                        fontsize=8, color=palette.get(policy, OTHER), rotation=90, va="bottom")
    for policy, (text, cap) in (marks or {}).items():
        if cap is not None and math.isfinite(cap):
            color = palette.get(policy, OTHER)
            ax.plot([cap], [0], marker="^", ms=9, color=color, clip_on=False, zorder=5, ls="none",
                    label=f"{text} ({tokens_label(float(f'{cap:.3g}'))})")
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(tokens_label))
    ax.set_ylim(0, 100)
    ax.yaxis.set_major_formatter(PercentFormatter())
    _style(ax, title, "usable KV cache capacity [tokens, log scale]", "token hit rate [% of prompt tokens]")
    if kv_bytes_per_token:
        gib = kv_bytes_per_token / 2**30
        top = ax.secondary_xaxis("top", functions=(lambda t: t * gib, lambda g: g / gib))
        top.set_xlabel("KV cache memory [GiB]", fontsize=9)
        top.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
    ax.legend(fontsize=8, loc="best", framealpha=0.9)
    return fig


# -- hit rate vs block size -----------------------------------------------------------------

def block_size_chart(series: Sequence[dict[str, Any]], capacity_text: str,
                     title: str = "Token hit rate vs block / page size",
                     xlabel: str = "block / page size [tokens, log scale]",
                     colors: dict[str, str] | None = None) -> Figure:
    """Hit rate against each engine's KV unit (block or page size), log2 axis.

    ``series``: dicts with ``policy``, ``label``, ``sizes``, ``hit_rate`` and optional
    ``dashed`` (the unlimited-cache bound). ``colors``: policy -> colour.
    """
    palette = _palette(colors)
    fig = _figure()
    ax = fig.add_subplot()
    ticks: set[int] = set()
    solid = 0
    for s in series:
        sizes = np.asarray(s["sizes"], np.float64)
        y = np.asarray(s["hit_rate"], np.float64) * 100
        ticks.update(int(v) for v in sizes)
        color = palette.get(s["policy"], OTHER)
        ax.plot(sizes, y, color=color, ls="--" if s.get("dashed") else "-", lw=1.2 if s.get("dashed") else 2,
                marker="o" if not s.get("dashed") else None, ms=5, label=s["label"])
        if not s.get("dashed"):
            below = solid % 2 == 1  # values of every other engine below its line: no overlap
            solid += 1
            for xv, yv in zip(sizes, y):
                ax.annotate(f"{yv:.1f}%", (xv, yv), xytext=(0, -12 if below else 6), textcoords="offset points",
                            ha="center", fontsize=7, color=color)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(ticks))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
    ax.set_ylim(0, 100)
    ax.yaxis.set_major_formatter(PercentFormatter())
    _style(ax, f"{title} ({capacity_text})", xlabel, "token hit rate [% of prompt tokens]")
    ax.legend(fontsize=8, loc="lower left", framealpha=0.9)
    return fig


# -- per-request cached fraction ------------------------------------------------------------

def cached_fraction_chart(fractions: dict[str, np.ndarray], labels: dict[str, str] | None = None,
                          bins: int = 20, title: str = "How much of each request was cached",
                          colors: dict[str, str] | None = None) -> Figure:
    """Histogram of cached tokens / prompt tokens per admitted request, one bar colour per policy."""
    palette = _palette(colors)
    fig = _figure()
    ax = fig.add_subplot()
    edges = np.linspace(0, 100, bins + 1)
    names = list(fractions)
    data = [np.clip(np.asarray(fractions[p], np.float64) * 100, 0, 100) for p in names]
    ax.hist(data, bins=edges, color=[palette.get(p, OTHER) for p in names],
            label=[(labels or {}).get(p, p) for p in names], rwidth=0.9)
    for p, d in zip(names, data):
        if len(d):
            ax.axvline(float(np.mean(d)), color=palette.get(p, OTHER), ls="--", lw=1)
    ax.set_xlim(0, 100)
    ax.xaxis.set_major_formatter(PercentFormatter())
    _style(ax, title, "cached share of the request's prompt [%] (dashed: mean)", "requests [count]")
    ax.legend(fontsize=8, loc="upper center", framealpha=0.9)
    return fig


# -- first divergence -----------------------------------------------------------------------

def divergence_chart(labels: Sequence[str], requests: Sequence[int], whole_prompt: int,
                     marks: dict[int, str] | None = None,
                     title: str = "Where requests stop sharing a prefix") -> Figure:
    """Bars of the first-divergence position bins; ``marks`` (bin index -> text) flags bins
    holding a volatile-content site."""
    fig = _figure()
    ax = fig.add_subplot()
    names = list(labels) + ["whole prompt\nseen before"]
    values = list(requests) + [whole_prompt]
    x = np.arange(len(names))
    colors = ["#7c8aa5"] * len(labels) + ["#4d8a3a"]
    for k in (marks or {}):
        colors[k] = "#c2410c"
    ax.bar(x, values, color=colors, width=0.75)
    top = max(values + [1])
    for k, v in enumerate(values):
        ax.annotate(f"{v:,}", (k, v), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
    for k, text in (marks or {}).items():
        ax.annotate(text, (k, values[k]), xytext=(0, 16), textcoords="offset points", ha="center", fontsize=7,
                    color="#c2410c")
    ax.set_xticks(x)
    ax.set_xticklabels(names, fontsize=8)
    ax.set_ylim(0, top * 1.25)
    _style(ax, title, "first token that differs from the best earlier request [token position, binned]",
           "requests [count]")
    ax.grid(False, axis="x")
    handles = [Patch(color="#7c8aa5", label="requests stopping in this range")]
    if marks:
        handles.append(Patch(color="#c2410c", label="range holding volatile content (see table)"))
    handles.append(Patch(color="#4d8a3a", label="prompt fully seen before"))
    ax.legend(handles=handles, fontsize=8, loc="upper left", framealpha=0.9)
    return fig


# -- prefix tree (icicle) -------------------------------------------------------------------

_TREE_COLORS = ("#2563a8", "#d9661f", "#4d8a3a", "#9b3b8c", "#b58a1b", "#1f8a8a", "#a33b3b", "#5a5aa8",
                "#6b7f2a", "#8a5a3b")


def prefix_tree_chart(segments: Sequence[dict[str, Any]], namespaces: Sequence[dict[str, Any]],
                      total_requests: int, max_depth_tokens: int,
                      title: str = "Shared prefixes: the prompt prefix tree (icicle)") -> Figure:
    """An icicle of the prefix tree: a box per shared prefix segment, width = requests that
    share it, height = its token span, children below their parent.

    ``segments``: dicts with ``x0``, ``width``, ``y0``, ``y1`` (tokens), ``tree`` (colour
    group) and optional ``label``. ``namespaces``: dicts with ``x0``, ``width``, ``label``
    (a band above the tree; drawn only when there is more than one namespace).
    """
    fig = _figure((8.6, 5.0))
    ax = fig.add_subplot()
    depth = max(max_depth_tokens, 16)
    band = depth * 0.06
    # the x axis spans the requests that share something; the rest would be blank
    span = max([s["x0"] + s["width"] for s in segments] + [1])
    for s in segments:
        color = _TREE_COLORS[int(s["tree"]) % len(_TREE_COLORS)]
        wide = s["width"] / span * 800 > 4  # white edges would wash out boxes a few pixels wide
        ax.add_patch(Rectangle((s["x0"], s["y0"]), s["width"], s["y1"] - s["y0"], facecolor=color,
                               edgecolor="white" if wide else color, lw=0.6 if wide else 0, alpha=0.85))
        label = _fitting_label(s, span) if (s["y1"] - s["y0"]) >= 0.04 * depth else None
        if label:
            ax.text(s["x0"] + s["width"] / 2, (s["y0"] + s["y1"]) / 2, label, ha="center", va="center",
                    fontsize=7, color="white", fontweight="bold", clip_on=True)
    if len(namespaces) > 1:
        for ns in namespaces:
            ax.add_patch(Rectangle((ns["x0"], -band), ns["width"], band * 0.9, facecolor="#e5e7eb",
                                   edgecolor="white", lw=0.6))
            if ns["width"] >= 0.06 * span:
                ax.text(ns["x0"] + ns["width"] / 2, -band / 2, ns["label"], ha="center", va="center", fontsize=7,
                        clip_on=True)
    ax.set_xlim(0, span)
    ax.set_ylim(depth * 1.02, -band if len(namespaces) > 1 else 0)
    ax.yaxis.set_major_formatter(FuncFormatter(tokens_label))
    _style(ax, title, "requests sharing the prefix [count; box width]",
           "position in the prompt [tokens from the start]")
    ax.grid(False)
    return fig


def _fitting_label(segment: dict[str, Any], total: int, axes_px: float = 800.0) -> str | None:
    """The segment's label, its rank alone, or nothing: whatever fits in the box (7-pt text)."""
    px = segment["width"] / max(total, 1) * axes_px
    for text in (segment.get("label"), segment.get("rank_label")):
        if text and px >= 5.5 * len(text) + 6:
            return text
    return None


# -- groups (tenants, adapters) -------------------------------------------------------------

def group_chart(panels: Sequence[dict[str, Any]], title: str = "Hit rate per tenant and adapter",
                colors: dict[str, str] | None = None) -> Figure:
    """Grouped bars, one panel per grouping column.

    ``panels``: dicts with ``title``, ``groups`` (names) and ``series`` (dicts with
    ``policy``, ``label``, ``values`` (fractions) and optional ``hatched`` = the
    counterfactual with the namespace ignored). ``colors``: policy -> colour.
    """
    palette = _palette(colors)
    n = max(len(panels), 1)
    fig = _figure((8.6, 3.4 * n + 0.6))
    axes = fig.subplots(n, 1, squeeze=False)[:, 0]
    for ax, panel in zip(axes, panels):
        groups = list(panel["groups"])
        x = np.arange(len(groups))
        k = len(panel["series"])
        w = 0.8 / max(k, 1)
        for j, s in enumerate(panel["series"]):
            color = palette.get(s["policy"], OTHER)
            vals = np.asarray(s["values"], np.float64) * 100
            pos = x - 0.4 + w * (j + 0.5)
            if s.get("hatched"):
                ax.bar(pos, vals, w, facecolor="white", edgecolor=color, hatch="///", lw=1, label=s["label"])
            else:
                ax.bar(pos, vals, w, color=color, label=s["label"])
            for xv, yv in zip(pos, vals):
                ax.annotate(f"{yv:.0f}", (xv, yv), xytext=(0, 2), textcoords="offset points", ha="center",
                            fontsize=6, color="#374151")
        ax.set_xticks(x)
        ax.set_xticklabels(groups, fontsize=8, rotation=20 if len(groups) > 6 else 0)
        ax.set_ylim(0, 128)  # room for the legend above 100%
        ax.set_yticks(range(0, 101, 20))
        ax.yaxis.set_major_formatter(PercentFormatter())
        _style(ax, panel["title"], panel.get("xlabel", "group"), "token hit rate [% of prompt tokens]")
        ax.grid(False, axis="x")
        ax.legend(fontsize=7, ncol=4, loc="upper center", framealpha=0.9)
    fig.suptitle(title, fontsize=11, x=0.01, ha="left")
    return fig


# -- under load (concurrent replay) ---------------------------------------------------------

def load_hit_chart(bars: Sequence[dict[str, Any]], title: str = "Hit rate one at a time and under load",
                   colors: dict[str, str] | None = None) -> Figure:
    """Bars of hit rate: ``bars`` are dicts with ``policy``, ``label`` and ``hit_rate``; bars with
    ``sequential`` true are hatched (the one-request-at-a-time replay). ``colors``: policy -> colour."""
    palette = _palette(colors)
    fig = _figure((8.6, 3.8))
    ax = fig.add_subplot()
    x = np.arange(len(bars))
    for k, b in enumerate(bars):
        color = palette.get(b["policy"], OTHER)
        v = float(b["hit_rate"]) * 100
        if b.get("sequential"):
            ax.bar(k, v, 0.7, facecolor="white", edgecolor=color, hatch="///", lw=1.2)
        else:
            ax.bar(k, v, 0.7, color=color)
        ax.annotate(f"{v:.1f}%", (k, v), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=8)
    ax.set_xticks(x)
    ax.set_xticklabels([b["label"] for b in bars], fontsize=8)
    ax.set_ylim(0, 110)
    ax.set_yticks(range(0, 101, 20))
    ax.yaxis.set_major_formatter(PercentFormatter())
    _style(ax, title, "replay (hatched: one request at a time)", "token hit rate [% of prompt tokens]")
    ax.grid(False, axis="x")
    return fig


def ttft_cdf_chart(series: Sequence[dict[str, Any]], title: str = "Time to first token under load",
                   colors: dict[str, str] | None = None) -> Figure:
    """Empirical CDFs of TTFT (log x axis): ``series`` are dicts with ``policy``, ``label``,
    ``ttft`` (seconds) and ``dashed`` (the run without prefix caching). ``colors``: policy -> colour."""
    palette = _palette(colors)
    fig = _figure()
    ax = fig.add_subplot()
    for s in series:
        v = np.sort(np.asarray(s["ttft"], np.float64) * 1e3)
        v = v[np.isfinite(v) & (v > 0)]
        if not len(v):
            continue
        y = np.arange(1, len(v) + 1) / len(v) * 100
        ax.plot(v, y, color=palette.get(s["policy"], OTHER), lw=1.2 if s.get("dashed") else 2,
                ls="--" if s.get("dashed") else "-", drawstyle="steps-post", label=s["label"])
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _p: f"{v:g}" if str(f"{v:g}")[0] in "25" else ""))
    ax.set_ylim(0, 100)
    ax.yaxis.set_major_formatter(PercentFormatter())
    _style(ax, title, "time to first token [ms, log scale]", "requests with this TTFT or less [%]")
    ax.legend(fontsize=8, loc="lower right", framealpha=0.9)
    return fig
