"""`kvsim gpu-validate`: run a real prefill driven by a cache model's block tables."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated

import typer

from kvsim.cli.options import INPUT, LogInput, with_groups
from kvsim.cli.app import app, console, err_console
from kvsim.cli.options import DEFAULT, BlockSizeOpt, PageSizeOpt

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
@with_groups(INPUT.but(limit=None))
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
    capacity: Annotated[str | None, typer.Option(
        "--capacity", "-c", help="Usable KV capacity in tokens, or 'inf' (default: unlimited for the slice).",
        rich_help_panel=_CAP, show_default=False)] = None,
    block_size: BlockSizeOpt = DEFAULT["block_size"],
    page_size: PageSizeOpt = DEFAULT["page_size"],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the JSON results, report and figures.",
                                      rich_help_panel=_OUT)] = Path("out/gpu-validate"),
    calibration_out: Annotated[Path | None, typer.Option(
        "--calibration-out", help="Where to write the fitted calibration JSON (default: OUT/calibration.json); "
        "use it with kvsim simulate --calibration.", rich_help_panel=_OUT, show_default=False)] = None,
    no_report: Annotated[bool, typer.Option("--no-report", help="Skip the HTML/PNG report.",
                                            rich_help_panel=_OUT)] = False,
    log_input: LogInput = None,
) -> None:
    """Check the simulator on a real prefill: reuse equals recomputation, and the time it saves.

    The cache model (--policy) admits each request of the slice; its block tables address
    a paged KV cache on the device; only the uncached tokens are computed, attending to the
    cached pages through the Triton paged-attention kernel. The last-position logits and the
    K/V must equal a full prefill's within the dtype's tolerance, and the measured time
    saved is compared with the simulator's prediction. Exit code 1 when a check fails.
    """
    from kvsim.cli.options import parse_capacity_tokens
    from kvsim.errors import KvsimError
    from kvsim.outputs import check_output_path, make_dir
    from kvsim.engines.options import SimOptions

    _need("torch")
    if attention == "triton" or (attention == "auto" and device == "cuda"):
        _need("triton")
    logs = log or [DEFAULT_TRACE]
    if not log and not DEFAULT_TRACE.exists():
        raise KvsimError(f"no log given and the bundled trace {DEFAULT_TRACE} is missing; pass a LOG path")
    from kvsim.engines import registry

    registry.engine(policy)   # an unknown policy is a clear error
    sim = SimOptions(capacity_tokens=parse_capacity_tokens(capacity), block_size=block_size,
                     page_size=page_size)
    if out.exists() and not out.is_dir():
        raise KvsimError(f"{out}: exists and is not a directory")
    make_dir(out)
    calib_path = calibration_out or out / "calibration.json"
    results_path = out / "gpu_validate.json"
    for path in (calib_path, results_path):
        check_output_path(path, logs)

    from kvsim.gpu.validate import ValidateOptions, run_validation

    opts = ValidateOptions(policy=policy, model=model, device=device, dtype=dtype, attention=attention,
                           requests=requests, repeats=repeats, seed=seed, tolerance=tolerance, sim=sim)
    trace = log_input.load(logs)
    with console.status("running prefills...") as status:
        result = run_validation(trace, opts, progress=lambda i, n: status.update(f"request {i}/{n}"))

    from kvsim.outputs import write_json

    write_json(results_path, result.to_json())
    written = [results_path]
    if result.calibration is not None:
        result.calibration.save(calib_path)
        written.append(calib_path)
    if not no_report:
        from kvsim.report.gpu import write_gpu_page

        written += write_gpu_page(result, out)
    from kvsim.render.gpu_validate import render_validation

    render_validation(console, result)
    for path in written:
        console.print(f"[dim]wrote {path}[/]")
    if not result.ok:
        raise typer.Exit(1)
