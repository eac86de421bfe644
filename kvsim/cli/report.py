"""`kvsim report`: one self-contained HTML page (and PNGs) about a prompt log."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from kvsim.cli.options import CAPACITY, FLEET, INPUT, OFFLOAD, CalibrationFileOpt, EngineOptions, LogInput, with_groups
from kvsim.cli.app import app, console, err_console
from kvsim.cli.replay_options import SpeedupOpt
from kvsim.cli.options import ANALYZE_DEFAULT, BlockSizesOpt, TopOpt
from kvsim.cli.options import LogPaths, PolicyOpt, ShowTextOpt, WarmupOpt

_OUT = "Output"
ConcurrentOpt = Annotated[bool, typer.Option(
    "--concurrent/--no-concurrent", help="The Under load section: the log replayed as it arrived (timed, with "
    "and without prefix caching), where it has timestamps.", rich_help_panel="Concurrent replay (--replay steps|timed)")]


def html_report(html: Path, trace: Any, logs: list[Path], options: Any = None, png_dir: Path | None = None,
                **precomputed: Any) -> Path:
    """Write the report of ``trace`` to ``html`` with progress on stderr; print and return its path.

    Used by ``kvsim report`` and by ``--html`` on analyze, simulate and sweep, which pass what
    they computed (``analysis=``, ``runs=``, ``sweep_result=``) so it is not computed again.
    """
    from kvsim.report import make_report

    def progress(line: str) -> None:
        err_console.print(f"report: {line}", highlight=False, markup=False)

    written = make_report(trace, html, options, png_dir=png_dir, inputs=logs, progress=progress, **precomputed)
    pngs = written[:-1]
    where = (f" and {len(pngs)} PNG file(s) in {pngs[0].parent}" if pngs else "")
    console.print(f"report written to {written[-1]}{where}", highlight=False, soft_wrap=True)
    return written[-1]


@app.command()
@with_groups(CAPACITY, FLEET, INPUT, OFFLOAD)
def report(
    logs: LogPaths,
    output: Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write (self-contained: images "
                                         "and styles embedded).", rich_help_panel=_OUT)] = Path("report.html"),
    png_dir: Annotated[Optional[Path], typer.Option(
        "--png-dir", help="Write the PNG charts into this folder (default: next to the HTML file, named "
        "<name>_<chart>.png).", rich_help_panel=_OUT, show_default=False)] = None,
    policy: PolicyOpt = "all",
    block_sizes: BlockSizesOpt = ANALYZE_DEFAULT["block_sizes"],
    top: TopOpt = ANALYZE_DEFAULT["top"],
    show_text: ShowTextOpt = False,
    calibration: CalibrationFileOpt = None,
    gpu_results: Annotated[Optional[Path], typer.Option(
        "--gpu-results", help="gpu-validate result JSON (gpu_validate.json): add the GPU validation section.",
        rich_help_panel=_OUT, show_default=False)] = None,
    jobs: Annotated[Optional[int], typer.Option(
        "--jobs", "-j",
        help="Parallel replays (default: every core for a batch of replays of 2M prompt tokens or more, else 1).",
        show_default=False)] = None,
    warmup: WarmupOpt = None,
    concurrent: ConcurrentOpt = True,
    speedup: SpeedupOpt = 1.0,
    agreement: Annotated[bool, typer.Option(
        "--agreement", help="The log is a record of kvsim serve --upstream: print where kvsim's predicted "
        "cached_tokens agree with the server's, instead of the HTML page.", rich_help_panel=_OUT)] = False,
    engine: EngineOptions = None,
    fleet: object = None,
    log_input: LogInput = None,
    offload: dict = None,
) -> None:
    """Write an HTML report (plus PNG charts) of a prompt log: what a prefix cache would save.

    Key numbers first (upper bound, APC and radix hit rates at the chosen capacity, prefill
    tokens and estimated GPU time saved, KV memory for 90% of the upper bound), then hit rate
    vs capacity and vs block size, the cached share per request, where requests stop sharing
    and which volatile content breaks it, the top shared prefixes as an icicle of the prefix
    tree, per-tenant and per-adapter hit rates with the cost of isolation, and the
    recommendation of [bold]kvsim analyze[/]. Where the log has timestamps, the "Under load"
    section replays it as it arrived through the vLLM and SGLang scheduler models (hit rate
    sequential vs concurrent, TTFT with and without prefix caching, radix lpm vs fcfs; step
    cost: the roofline of --model on --gpu, llama-3-8b on H100-80GB by default, or
    --calibration). Without a capacity option the report uses the KV needed for 90% of the
    upper bound. No prompt text unless --show-text.

    With [bold]--agreement[/], a record of [bold]kvsim serve --upstream[/] gets the agreement
    report instead: kvsim's predicted cached_tokens vs the server's, per request.

    With [bold]--offload[/] (and [bold]--offload-size[/]), a Memory tiers section: each engine
    of that tier at the chosen capacity, its hits from the GPU, CPU memory and disk, and in the
    timed replay TTFT with and without the tier.
    """
    if agreement:
        from kvsim.errors import ConfigError
        from kvsim.report.agreement import load_agreement, render_agreement

        if len(logs) != 1:
            raise ConfigError("--agreement compares one record of kvsim serve --upstream")
        render_agreement(console, load_agreement(logs[0]), top=top, show_text=show_text)
        return
    from kvsim.analyze.options import parse_block_sizes
    from kvsim.errors import ConfigError
    from kvsim.outputs import check_output_path
    from kvsim.report import ReportOptions
    from kvsim.warmup import parse_warmup

    window = parse_warmup(warmup)
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {jobs}")
    sim = engine.sim_options()
    calib = None
    if calibration is not None:
        from kvsim.costs.calibration import Calibration

        calib = Calibration.load(calibration)
    if gpu_results is not None:
        from kvsim.report.gpu import load_validation

        load_validation(gpu_results)  # a bad file fails before the log is read
    check_output_path(output, logs)
    options = ReportOptions(sim=sim, block_sizes=parse_block_sizes(block_sizes), top=top, show_text=show_text,
                            model=engine.model, calibration=calib, gpu_results=gpu_results, jobs=jobs, warmup=window,
                            concurrent=concurrent, speedup=speedup, policies=policy, fleet=fleet,
                            offload=offload or None)
    trace = log_input.load(logs)
    html_report(output, trace, logs, options, png_dir=png_dir)


def sweep_report_options(block_size: str, page_size: str, eviction: str, engine_version: str | None,
                         model: str | None, jobs: int | None, warmup: Any = None, speedup: float = 1.0) -> Any:
    """The report settings of ``kvsim sweep --html``: the first block size, page size and
    eviction policy of the grid are the report's engine settings."""
    from kvsim.engines.options import SimOptions
    from kvsim.report import ReportOptions
    from kvsim.sweep.grid import parse_eviction_policies, parse_ints

    sim = SimOptions(block_size=parse_ints(block_size, "--block-size")[0],
                     page_size=parse_ints(page_size, "--page-size")[0],
                     eviction_policy=parse_eviction_policies(eviction)[0], engine_version=engine_version)
    return ReportOptions(sim=sim, model=model, jobs=jobs, warmup=warmup, speedup=speedup)
