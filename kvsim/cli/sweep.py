"""`kvsim sweep`: exact replays over capacities, block/page sizes and policies, plus one-pass curves."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvsim.cli.app import app, console
from kvsim.cli.options import (
    FormatOpt,
    LimitOpt,
    LogPaths,
    OnErrorOpt,
    TemplateOpt,
    TokenizerOpt,
    TraceBlockOpt,
    WarmupOpt,
    load_from_cli,
)

_GRID = "Grid (comma lists)"
_RUN = "Execution"
_OUT = "Output"


@app.command()
def sweep(
    logs: LogPaths,
    capacity: Annotated[str, typer.Option(
        "--capacity", "-c", help="Usable KV capacities: tokens (1e4,1e5,250000), 'inf', or memory such as 20GiB "
        "(needs --model).", rich_help_panel=_GRID)],
    policy: Annotated[str, typer.Option("--policy", "-p", help="apc, radix, a comma list, or all.",
                                        rich_help_panel=_GRID)] = "all",
    block_size: Annotated[str, typer.Option("--block-size", help="APC block sizes.", rich_help_panel=_GRID)] = "16",
    page_size: Annotated[str, typer.Option("--page-size", help="Radix page sizes.", rich_help_panel=_GRID)] = "1",
    eviction_policy: Annotated[str, typer.Option(
        "--eviction-policy", help="Radix eviction policies (lru, lfu, fifo, mru, filo, priority, slru, tlru).",
        rich_help_panel=_GRID)] = "lru",
    model: Annotated[Optional[str], typer.Option(
        "--model", help="Model shape (llama-3-8b, ...) or HF config.json: converts memory capacities into tokens.",
        rich_help_panel=_GRID, show_default=False)] = None,
    engine_version: Annotated[Optional[str], typer.Option(
        "--engine-version", help="vLLM behaviour profile: 0.33 (default) or 0.11.", rich_help_panel=_GRID,
        show_default=False)] = None,
    jobs: Annotated[Optional[int], typer.Option(
        "--jobs", "-j", help="Parallel replays (default: number of CPUs; 1 = in this process).",
        rich_help_panel=_RUN, show_default=False)] = None,
    executor: Annotated[str, typer.Option(
        "--executor", help="local (process pool) or ray (RAY_ADDRESS cluster, else local Ray; "
        "pip install 'kvsim\\[ray]').", rich_help_panel=_RUN)] = "local",
    curve: Annotated[bool, typer.Option(
        "--curve/--no-curve", help="One-pass hit-rate curves for LRU-like policies, with their error against "
        "the exact replays.", rich_help_panel=_RUN)] = True,
    curve_points: Annotated[int, typer.Option(
        "--curve-points", help="Points of each smooth curve in the JSON output.", rich_help_panel=_RUN)] = 64,
    csv_out: Annotated[Optional[Path], typer.Option("--csv", help="Write the table as CSV.", rich_help_panel=_OUT,
                                                    show_default=False)] = None,
    json_out: Annotated[Optional[Path], typer.Option(
        "--json", help="Write the table and the smooth curves as JSON.", rich_help_panel=_OUT,
        show_default=False)] = None,
    html: Annotated[Optional[Path], typer.Option(
        "--html", help="Also write the HTML report with this sweep's curves (PNGs next to it), as kvsim report.",
        rich_help_panel=_OUT, show_default=False)] = None,
    warmup: WarmupOpt = None,
    fmt: FormatOpt = "auto",
    tokenizer: TokenizerOpt = "cl100k_base",
    chat_template: TemplateOpt = "llama3",
    trace_block_size: TraceBlockOpt = 512,
    on_error: OnErrorOpt = "fail",
    limit: LimitOpt = None,
) -> None:
    """Replay a log at every combination of capacity, block/page size and policy.

    Each combination is an exact sequential replay (as [bold]kvsim simulate[/]); APC rows vary
    --block-size, radix rows --page-size and --eviction-policy. Hit rate = cached prompt
    tokens / prompt tokens of admitted requests. With --curve, a one-pass stack-distance model
    gives the whole hit-rate-vs-capacity curve of each LRU-like setting; its error against the
    exact replays is shown per row. Every row also shows the optimum: the most any cache of that
    size could hit, knowing the future, under the engine's rules.
    """
    from kvsim.errors import ConfigError
    from kvsim.outputs import check_output_path
    from kvsim.sweep.grid import (
        parse_capacities,
        parse_eviction_policies,
        parse_ints,
        parse_policies,
    )
    from kvsim.sweep.runner import EXECUTORS, make_executor
    from kvsim.warmup import parse_warmup

    names = parse_policies(policy)
    window = parse_warmup(warmup)
    parse_capacities(capacity, model)
    parse_ints(block_size, "--block-size")
    parse_ints(page_size, "--page-size")
    parse_eviction_policies(eviction_policy)
    if executor not in EXECUTORS:
        raise ConfigError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if curve_points < 2:
        raise ConfigError(f"--curve-points must be at least 2, got {curve_points}")
    runner = make_executor(executor, jobs)
    for out in (csv_out, json_out, html):
        if out is not None:
            check_output_path(out, logs)
    if csv_out is not None and json_out is not None and csv_out.resolve() == json_out.resolve():
        raise ConfigError("--csv and --json name the same file")

    from kvsim.sweep.render import render_sweep, sweep_json
    from kvsim.sweep.run import sweep as run

    trace = load_from_cli(logs, fmt, tokenizer, chat_template, trace_block_size, on_error, limit)
    options = {} if engine_version is None else {"engine_version": engine_version}
    result = run(trace, names, capacity, block_size, page_size, eviction_policy, model=model, jobs=jobs,
                 executor=runner, curves=curve, curve_points=curve_points, progress=True, warmup=window,
                 **options)
    render_sweep(console, result)
    if csv_out is not None:
        from kvsim.outputs import write_text_atomic

        write_text_atomic(csv_out, result.frame.to_csv(index=False))
        console.print(f"table written to {csv_out}")
    if json_out is not None:
        from kvsim.outputs import write_json

        settings = {"policy": names, "capacity": capacity, "block_size": block_size, "page_size": page_size,
                    "eviction_policy": eviction_policy, "model": model, "engine_version": engine_version,
                    "executor": executor, "jobs": jobs, "warmup": warmup}
        write_json(json_out, sweep_json(trace, result, settings))
        console.print(f"sweep written to {json_out}")
    if html is not None:
        from kvsim.cli.report import html_report, sweep_report_options

        html_report(html, trace, logs, sweep_report_options(block_size, page_size, eviction_policy, engine_version,
                                                            model, jobs, window), sweep_result=result)
