"""`kvsim simulate --replay steps|timed`: the engines' schedulers under load (docs/concurrency.md)."""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

from kvsim.cli.app import console

PROGRESS_MIN_REQUESTS = 500


def simulate_concurrent(logs: list[Path], names: list[str], options, mode, json_out: Path | None,
                        per_request: Path | None, html: Path | None, warmup: str | None, log_input) -> None:
    """Check the options, read the log, replay each policy's scheduler, print and write the results."""
    from kvsim.errors import ConfigError
    from kvsim.outputs import check_output_path
    from kvsim.drive.concurrent import check_supported, run_concurrent, scheduler_settings
    from kvsim.drive.step_cost import step_cost

    if html is not None:
        raise ConfigError("--html reports the sequential replay; use kvsim report for the concurrent view")
    if warmup is not None:
        raise ConfigError("--warmup applies to --replay sequential only")
    check_supported(names, options)
    for name in names:                # bad scheduler settings fail before a large log is read
        scheduler_settings(name, options, mode)
    if mode.mode == "timed":
        step_cost(options.model, options.gpu, mode.calibration)
    for out in (json_out, per_request):
        if out is not None:
            check_output_path(out, logs)
    trace = log_input.load(logs)
    bars = None
    if len(trace) >= PROGRESS_MIN_REQUESTS:
        from kvsim.render.progress import Bars

        bars = Bars("count")
    with bars or nullcontext():
        progress = None if bars is None else (lambda label, total: bars.task(label, total))
        runs = run_concurrent(trace, names, options, mode, progress=progress)
    from kvsim.render.concurrent import render_concurrent

    render_concurrent(console, trace, runs, mode)
    if json_out is not None:
        from kvsim.outputs import write_json
        from kvsim.drive.concurrent import concurrent_json

        write_json(json_out, concurrent_json(trace, runs, options, mode))
        console.print(f"summary written to {json_out}")
    if per_request is not None:
        from kvsim.outputs import write_jsonl
        from kvsim.drive.concurrent import concurrent_rows

        write_jsonl(per_request, concurrent_rows(trace, runs))
        console.print(f"per-request results written to {per_request}")
