"""`kvsim analyze`: order-free prefix-overlap statistics and cache-friendliness diagnostics."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvsim.cli.options import INPUT, LogInput, with_groups
from kvsim.cli.app import app, console
from kvsim.cli.options import ANALYZE_DEFAULT, BlockSizesOpt, TopOpt
from kvsim.cli.options import LogPaths, ShowTextOpt, WarmupOpt

_OUT = "Output"


@app.command()
@with_groups(INPUT)
def analyze(
    logs: LogPaths,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Also write the whole report as JSON.",
                                                     rich_help_panel=_OUT, show_default=False)] = None,
    html: Annotated[Optional[Path], typer.Option("--html", help="Also write the HTML report (PNGs next to it), "
                                                 "as kvsim report.", rich_help_panel=_OUT, show_default=False)] = None,
    show_text: ShowTextOpt = False,
    model: Annotated[Optional[str], typer.Option(
        "--model", help="Model shape (llama-3-8b, qwen2.5-72b, deepseek-v3, ...) or a HF config.json path: "
        "cache capacities in GiB.", show_default=False)] = None,
    block_sizes: BlockSizesOpt = ANALYZE_DEFAULT["block_sizes"],
    top: TopOpt = ANALYZE_DEFAULT["top"],
    warmup: WarmupOpt = None,
    log_input: LogInput = None,
) -> None:
    """How much of this workload could any prefix cache reuse, where is reuse lost, and what would fix it.

    Without simulating a finite cache: the [bold]upper bound[/] (unlimited cache) at token
    level and per block size, the top shared prefixes, where requests diverge and which
    volatile content (dates, ids, names) breaks sharing, multi-turn history breaks, the
    cost of cache salts and LoRA namespaces, the LRU capacity needed, and a
    recommendation (APC or RadixAttention, block size, top 3 changes).
    """
    from kvsim.analyze import AnalyzeOptions
    from kvsim.analyze import analyze as run_analysis
    from kvsim.analyze.options import parse_block_sizes
    from kvsim.render.analyze import render_report
    from kvsim.outputs import check_output_path

    from kvsim.warmup import parse_warmup

    opts = AnalyzeOptions(block_sizes=parse_block_sizes(block_sizes), top=top, show_text=show_text,
                          model=model, progress=True, warmup=parse_warmup(warmup))
    if model is not None:
        from kvsim.models import get_model

        get_model(model)  # a bad name fails before the log is read
    if json_out is not None:
        check_output_path(json_out, logs)
    if html is not None:
        check_output_path(html, logs)
    trace = log_input.load(logs)
    report = run_analysis(trace, opts).to_dict()
    render_report(console, report)
    if json_out is not None:
        from kvsim.outputs import write_json

        write_json(json_out, report)
        console.print(f"report written to {json_out}")
    if html is not None:
        from kvsim.cli.report import html_report
        from kvsim.report import ReportOptions

        html_report(html, trace, logs, ReportOptions(block_sizes=opts.block_sizes, top=top, show_text=show_text,
                                                     model=model, warmup=opts.warmup), analysis=report)
