"""`kvsim gpu-validate` in the terminal: the per-request checks and the summary."""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def render_validation(console: Console, result: Any) -> None:
    """Per-request table, then the summary (what the GPU script prints last)."""
    cfg = result.config
    t = Table(caption="sim: cached tokens the simulator predicts; cached: tokens skipped here; error: largest "
                      "relative error of reuse vs full prefill (logits, K/V)", caption_justify="left", title=f"gpu-validate: {cfg['policy']} on {cfg['model']} ({cfg['dtype']}, {cfg['attention']}, "
                    f"{cfg['device_name']})", title_justify="left")
    for col in ("req", "prompt", "sim", "cached", "error", "full ms", "reuse ms", "saved", "ok"):
        t.add_column(col, justify="right", no_wrap=True)
    for c in result.checks:
        if c.rejected:
            t.add_row(str(c.index), str(c.prompt_tokens), str(c.predicted_cached), "-", "-", "-", "-", "-",
                      "rejected" if c.ok else "[red]FAIL[/]")
            continue
        err = max(c.logits_rel_err, c.kv_cached_rel_err or 0.0, c.kv_new_rel_err or 0.0)
        saved = 100 * (1 - c.t_reuse_s / c.t_full_s) if c.t_full_s else 0.0
        t.add_row(str(c.index), str(c.prompt_tokens), str(c.predicted_cached), str(c.cached_tokens),
                  f"{err:.0e}", f"{c.t_full_s * 1e3:.3g}", f"{c.t_reuse_s * 1e3:.3g}",
                  f"{saved:.0f}%", "ok" if c.ok else "[red]FAIL[/]")
    console.print(t)
    for c in result.checks:
        if c.problem:
            console.print(f"[red]request {c.index} ({c.request_id}):[/] {c.problem}", highlight=False)
    s = result.summary()
    lines = [
        (f"correctness: {s['validated'] - s['mismatches']}/{s['validated']} requests match a full prefill "
         f"(max logits err {_g(s['max_logits_rel_err'])}, max K/V err {_g(s['max_kv_rel_err'])}, "
         f"tolerance {s['tolerance']:g})"),
    ]
    if result.control:
        ctl = result.control
        lines.append(f"negative controls: stale page err {ctl['stale_page_rel_err']:.3g}, RoPE offset err "
                     f"{ctl['rope_offset_rel_err']:.3g} -> {'detected' if ctl['detected'] else '[red]NOT detected[/]'}")
    if s["cached_tokens_differ_from_simulator"]:
        lines.append(f"[red]{s['cached_tokens_differ_from_simulator']} request(s) cached a different number of "
                     "tokens than the simulator predicted[/]")
    if "measured_saving_share" in s:
        lines.append(f"prefill time: full {s['measured_full_s'] * 1e3:.1f} ms, with reuse "
                     f"{s['measured_reuse_s'] * 1e3:.1f} ms -> measured saving {_pct(s['measured_saving_share'])}; "
                     f"predicted ({s['predicted_saving_model']}) {_pct(s['predicted_saving_share'])}, "
                     f"relative error {_pct(s.get('predicted_saving_rel_err'))}")
    if "roofline_full_s" in s:
        lines.append(f"roofline: full {s['roofline_full_s'] * 1e3:.1f} ms, reuse {s['roofline_reuse_s'] * 1e3:.1f} ms "
                     f"(measured/roofline {s['measured_full_s'] / s['roofline_full_s']:.2f}x for full prefills)")
    if "kernel_flops_per_s" in s:
        extra = ""
        if "kernel_flops_share_of_peak" in s:
            extra = (f" = {_pct(s['kernel_flops_share_of_peak'])} of peak FLOP/s, "
                     f"{_pct(s['kernel_bandwidth_share_of_peak'])} of peak bandwidth")
        lines.append(f"attention kernel: {s['kernel_flops_per_s'] / 1e12:.3g} TFLOP/s, "
                     f"{s['kernel_bytes_per_s'] / 1e9:.3g} GB/s{extra}")
    if result.calibration is not None:
        cal = result.calibration
        lines.append(f"calibration: fixed {cal.fixed_s * 1e3:.3g} ms + {cal.per_token_s * 1e6:.3g} us/token + "
                     f"{cal.per_context_token_s * 1e9:.3g} ns/(token x context token); "
                     f"fit r2 {_g(cal.fit.get('r2'))}, rms rel err {_pct(cal.fit.get('rms_relative_error'))}")
    lines.append("[bold green]PASS[/]" if result.ok else "[bold red]FAIL[/]")
    for line in lines:
        console.print(line, highlight=False)


def _g(v) -> str:
    return "-" if v is None else f"{v:.3g}"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"
