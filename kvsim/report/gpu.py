"""The gpu-validate section: its figures (PNG) and HTML, in the HTML report and as the
standalone page ``kvsim gpu-validate`` writes, and its result JSON read back.

Three figures: predicted vs measured prefill saving per request; reuse-vs-full errors
against the tolerance (with the negative controls); the attention kernel's achieved FLOP
rate and bandwidth against the device's peaks. No torch needed.
"""
from __future__ import annotations

import html
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.errors import InputError, read_json_input

if TYPE_CHECKING:
    from kvsim.gpu.validate import ValidationResult


def load_validation(path: str | Path):
    """Read ``gpu_validate.json`` (written by ``kvsim gpu-validate``) into a ValidationResult."""
    from kvsim.costs.calibration import SCHEMA, Calibration
    from kvsim.costs.roofline import DevicePeak
    from kvsim.gpu.validate import RequestCheck, ValidationResult

    path = Path(path)
    data = read_json_input(path, "gpu-validate result JSON")
    need = ("config", "summary", "requests")
    if not isinstance(data, dict) or any(k not in data for k in need):
        raise InputError(path, "not a kvsim gpu-validate result (expected the keys config, summary and requests; "
                               "it is the gpu_validate.json that kvsim gpu-validate writes)")
    names = {f.name for f in fields(RequestCheck)}
    try:
        checks = [RequestCheck(**{k: v for k, v in r.items() if k in names}) for r in data["requests"]]
        cal = data.get("calibration")
        calibration = None
        if isinstance(cal, dict) and cal.get("schema") == SCHEMA:
            calibration = Calibration(**{k: v for k, v in cal.items() if k != "schema"})
        peak = DevicePeak(**data["device_peak"]) if data.get("device_peak") else None
        return ValidationResult(config=data["config"], checks=checks, tolerance=float(data["summary"]["tolerance"]),
                                control=data.get("control"), calibration=calibration, peak=peak)
    except (TypeError, KeyError, ValueError) as e:
        raise InputError(path, f"malformed gpu-validate result ({e.__class__.__name__}: {e})") from None


def gpu_charts(result) -> list[tuple[str, Any]]:
    """(file stem, figure) of each gpu-validate figure that has data to show."""
    out = []
    for name, make in FIGURES.items():
        try:
            fig = make(result)
        except (ValueError, ZeroDivisionError, TypeError):  # nothing measured for this figure
            continue
        out.append((Path(name).stem, fig))
    return out


def gpu_fragment(result, images: dict[str, str]) -> str:
    """The gpu-validate HTML fragment with the given ``name -> src`` images."""
    return html_section(result, images)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def saving_figure(result: "ValidationResult"):
    """Per request: measured saving vs the simulator's predicted saving (ms)."""
    plt = _plt()
    done = [c for c in result.checks if c.t_full_s is not None]
    x = np.array([c.index for c in done])
    measured = np.array([c.t_full_s - c.t_reuse_s for c in done]) * 1e3
    fig, ax = plt.subplots(figsize=(8, 3.6))
    w = 0.28
    ax.bar(x - w, measured, w, label="measured (full - reuse)")
    if result.peak is not None:
        pred = np.array([c.roofline_full_s - c.roofline_reuse_s for c in done]) * 1e3
        ax.bar(x, pred, w, label=f"roofline prediction ({result.peak.name})")
    else:
        share = np.array([1 - c.flops_reuse / c.flops_full for c in done])
        pred = share * np.array([c.t_full_s for c in done]) * 1e3
        ax.bar(x, pred, w, label="FLOP share saved x measured full time")
    if result.calibration is not None:
        cal = np.array([result.calibration.saved_seconds(c.prompt_tokens, c.cached_tokens) for c in done]) * 1e3
        ax.bar(x + w, cal, w, label="calibrated fit (in-sample)")
    ax.set_xlabel("request")
    ax.set_ylabel("prefill time saved (ms)")
    ax.set_title(f"Prefill saved by prefix reuse: {result.config['policy']}, {result.config['model']}, "
                 f"{result.config['device_name']}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def error_figure(result: "ValidationResult"):
    """Per request: relative error of reuse vs full prefill, against the tolerance."""
    plt = _plt()
    done = [c for c in result.checks if c.logits_rel_err is not None]
    fig, ax = plt.subplots(figsize=(8, 3.2))
    floor = 1e-9
    x = [c.index for c in done]
    ax.semilogy(x, [max(c.logits_rel_err, floor) for c in done], "o", label="last-position logits")
    ax.semilogy(x, [max(c.kv_cached_rel_err or floor, floor) for c in done], "s", ms=4, label="K/V read from cache")
    ax.semilogy(x, [max(c.kv_new_rel_err or floor, floor) for c in done], "^", ms=4, label="K/V written")
    ax.axhline(result.tolerance, color="k", ls="--", lw=1, label=f"tolerance ({result.config['dtype']})")
    if result.control:
        for key, label in (("stale_page_rel_err", "control: stale page"), ("rope_offset_rel_err", "control: RoPE offset")):
            ax.axhline(max(result.control[key], floor), ls=":", lw=1, color="tab:red" if "stale" in key else "tab:purple",
                       label=label)
    ax.set_xlabel("request")
    ax.set_ylabel("relative L2 error (0 drawn at 1e-9)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def kernel_figure(result: "ValidationResult"):
    """Attention kernel's achieved TFLOP/s and GB/s per request, with device peaks."""
    plt = _plt()
    done = [c for c in result.checks if c.kernel_s]
    x = [c.index for c in done]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.2))
    a1.plot(x, [c.kernel_flops / c.kernel_s / 1e12 for c in done], "o")
    a2.plot(x, [c.kernel_bytes / c.kernel_s / 1e9 for c in done], "o")
    if result.peak is not None:
        dtype_bytes = 4 if result.config["dtype"] == "float32" else 2
        a1.axhline(result.peak.flops(dtype_bytes) / 1e12, color="k", ls="--", lw=1, label=f"{result.peak.name} peak")
        a2.axhline(result.peak.mem_bandwidth / 1e9, color="k", ls="--", lw=1, label=f"{result.peak.name} peak")
        a1.legend(fontsize=7)
        a2.legend(fontsize=7)
    a1.set_ylabel("attention TFLOP/s")
    a2.set_ylabel("attention GB/s (ideal bytes)")
    for a in (a1, a2):
        a.set_xlabel("request")
    fig.suptitle(f"Paged-prefill attention ({result.config['attention']}), one layer, reuse shape", fontsize=9)
    fig.tight_layout()
    return fig


FIGURES = {"gpu_saving.png": saving_figure, "gpu_errors.png": error_figure, "gpu_kernel.png": kernel_figure}


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v))


def html_section(result: "ValidationResult", images: dict[str, str]) -> str:
    """An HTML fragment: verdict, summary table, figures, per-request table (no prompt text)."""
    s = result.summary()
    verdict = "PASS" if result.ok else "FAIL"
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{_fmt(v)}</td></tr>" for k, v in s.items())
    cols = ["index", "request_id", "prompt_tokens", "predicted_cached", "cached_tokens", "ok",
            "logits_rel_err", "kv_cached_rel_err", "kv_new_rel_err", "t_full_s", "t_reuse_s",
            "roofline_full_s", "roofline_reuse_s", "problem"]
    head = "".join(f"<th>{c}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(getattr(c, k))}</td>" for k in cols) + "</tr>"
                   for c in result.checks)
    imgs = "".join(f'<figure><img src="{html.escape(src)}" alt="{html.escape(name)}"></figure>'
                   for name, src in images.items())
    control = ""
    if result.control:
        control = (f"<p>Negative controls (request {result.control['request']}): stale page error "
                   f"{result.control['stale_page_rel_err']:.3g}, RoPE-offset error "
                   f"{result.control['rope_offset_rel_err']:.3g} (tolerance {result.tolerance:g}).</p>")
    cfg = result.config
    return (f"<section id='gpu-validate'><h2>GPU validation: {verdict}</h2>"
            f"<p>{html.escape(cfg['policy'])} block tables drove a paged KV cache for "
            f"{html.escape(cfg['model'])} ({html.escape(cfg['dtype'])}, {html.escape(cfg['attention'])} attention) "
            f"on {html.escape(cfg['device_name'])}; random weights, nothing downloaded.</p>{control}"
            f"<table>{rows}</table>{imgs}<table><tr>{head}</tr>{body}</table></section>")


def write_gpu_page(result: "ValidationResult", out_dir: Path) -> list[Path]:
    """Write the PNG figures and a standalone ``gpu_validate.html`` into ``out_dir``."""
    from kvsim.outputs import write_bytes_atomic, write_text_atomic

    out_dir = Path(out_dir)
    written = []
    images = {}
    for name, make in FIGURES.items():
        path = out_dir / name
        write_bytes_atomic(path, figure_png(make(result)))
        written.append(path)
        images[name] = name
    page = ("<!doctype html><html><head><meta charset='utf-8'><title>kvsim gpu-validate</title>"
            "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;"
            "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:100%}</style></head><body>"
            + html_section(result, images) + "</body></html>")
    path = out_dir / "gpu_validate.html"
    write_text_atomic(path, page)
    written.append(path)
    return written


def figure_png(fig: Any) -> bytes:
    """A figure as PNG bytes (closed afterwards)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    _plt().close(fig)
    return buf.getvalue()
