"""`kvsim gpu-validate`: run a real prefill driven by a cache model's block tables."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated

import typer

from kvsim.cli.app import app, console, err_console
from kvsim.cli.options import (
    FormatOpt,
    OnErrorOpt,
    TemplateOpt,
    TokenizerOpt,
    TraceBlockOpt,
)

_RUN = "Run"
_CAP = "Cache"
_OUT = "Output"
DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "traces" / "support_chat.jsonl"


def _need(module: str) -> None:
    """Exit 2 with one line when the gpu extra is missing (printed without markup: '[gpu]' is literal)."""
    if importlib.util.find_spec(module) is None:
        err_console.print(f"error: gpu-validate needs {module}, which is not installed: pip install 'kvsim[gpu]'",
                          markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2)


@app.command("gpu-validate")
def gpu_validate(
    log: Annotated[list[Path] | None, typer.Argument(
        help="Prompt log(s) (default: the bundled traces/support_chat.jsonl).", show_default=False)] = None,
    policy: Annotated[str, typer.Option("--policy", "-p", help="apc (vLLM APC) or radix (SGLang RadixAttention).",
                                        rich_help_panel=_RUN)] = "apc",
    device: Annotated[str, typer.Option("--device", help="auto, cuda or cpu.", rich_help_panel=_RUN)] = "auto",
    model: Annotated[str, typer.Option("--model", help="tiny, llama-3.2-1b-shape or llama-3-8b-shape "
                                       "(random weights, nothing downloaded).", rich_help_panel=_RUN)] = "tiny",
    requests: Annotated[int, typer.Option("--requests", "-n", help="Validate the first N requests of the log.",
                                          rich_help_panel=_RUN)] = 16,
    dtype: Annotated[str, typer.Option("--dtype", help="auto (bfloat16 on cuda, float32 on cpu), float32, "
                                       "float16 or bfloat16.", rich_help_panel=_RUN)] = "auto",
    attention: Annotated[str, typer.Option("--attention", help="auto (Triton kernel on cuda, torch reference on "
                                           "cpu), triton (on cpu: Triton's interpreter, slow) or torch.",
                                           rich_help_panel=_RUN)] = "auto",
    repeats: Annotated[int, typer.Option("--repeats", help="Timed runs per prefill (the median is kept).",
                                         rich_help_panel=_RUN)] = 3,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random weights.", rich_help_panel=_RUN)] = 0,
    tolerance: Annotated[float | None, typer.Option(
        "--tolerance", help="Relative error allowed between reuse and full prefill (default: 1e-4 float32, "
        "1e-2 float16, 3e-2 bfloat16).", rich_help_panel=_RUN, show_default=False)] = None,
    capacity_tokens: Annotated[str | None, typer.Option(
        "--capacity-tokens", help="Usable KV capacity in tokens (default: unlimited for the slice).",
        rich_help_panel=_CAP, show_default=False)] = None,
    block_size: Annotated[int, typer.Option("--block-size", help="APC block size (1, 16, 32, 64, ...).",
                                            rich_help_panel=_CAP)] = 16,
    page_size: Annotated[int, typer.Option("--page-size", help="Radix page size.", rich_help_panel=_CAP)] = 1,
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the JSON results, report and figures.",
                                      rich_help_panel=_OUT)] = Path("out/gpu-validate"),
    calibration_out: Annotated[Path | None, typer.Option(
        "--calibration-out", help="Where to write the fitted calibration JSON (default: OUT/calibration.json); "
        "use it with kvsim simulate --calibration.", rich_help_panel=_OUT, show_default=False)] = None,
    no_report: Annotated[bool, typer.Option("--no-report", help="Skip the HTML/PNG report.",
                                            rich_help_panel=_OUT)] = False,
    fmt: FormatOpt = "auto",
    tokenizer: TokenizerOpt = "cl100k_base",
    chat_template: TemplateOpt = "llama3",
    trace_block_size: TraceBlockOpt = 512,
    on_error: OnErrorOpt = "fail",
) -> None:
    """Check the simulator on a real prefill: reuse equals recomputation, and the time it saves.

    The cache model (--policy) admits each request of the slice; its block tables address
    a paged KV cache on the device; only the uncached tokens are computed, attending to the
    cached pages through the Triton paged-attention kernel. The last-position logits and the
    K/V must equal a full prefill's within the dtype's tolerance, and the measured time
    saved is compared with the simulator's prediction. Exit code 1 when a check fails.
    """
    from kvsim.cli.options import load_from_cli
    from kvsim.cli.options import parse_capacity_tokens
    from kvsim.errors import ConfigError, KvsimError
    from kvsim.outputs import check_output_path
    from kvsim.replay.options import SimOptions

    _need("torch")
    if attention == "triton" or (attention == "auto" and device == "cuda"):
        _need("triton")
    logs = log or [DEFAULT_TRACE]
    if not log and not DEFAULT_TRACE.exists():
        raise KvsimError(f"no log given and the bundled trace {DEFAULT_TRACE} is missing; pass a LOG path")
    if policy not in ("apc", "radix"):
        raise ConfigError(f"--policy must be apc or radix, got {policy!r}")
    sim = SimOptions(capacity_tokens=parse_capacity_tokens(capacity_tokens), block_size=block_size,
                     page_size=page_size)
    if out.exists() and not out.is_dir():
        raise KvsimError(f"{out}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    calib_path = calibration_out or out / "calibration.json"
    results_path = out / "gpu_validate.json"
    for path in (calib_path, results_path):
        check_output_path(path, logs)

    from kvsim.gpu.validate import ValidateOptions, run_validation

    opts = ValidateOptions(policy=policy, model=model, device=device, dtype=dtype, attention=attention,
                           requests=requests, repeats=repeats, seed=seed, tolerance=tolerance, sim=sim)
    trace = load_from_cli(logs, fmt, tokenizer, chat_template, trace_block_size, on_error, None)
    with console.status("running prefills...") as status:
        result = run_validation(trace, opts, progress=lambda i, n: status.update(f"request {i}/{n}"))

    from kvsim.outputs import write_json

    write_json(results_path, result.to_json())
    written = [results_path]
    if result.calibration is not None:
        result.calibration.save(calib_path)
        written.append(calib_path)
    if not no_report:
        from kvsim.gpu.report import write_report

        written += write_report(result, out)
    render(result)
    for path in written:
        console.print(f"[dim]wrote {path}[/]")
    if not result.ok:
        raise typer.Exit(1)


def render(result) -> None:
    """Per-request table, then the summary (what the GPU script prints last)."""
    from rich.table import Table

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
