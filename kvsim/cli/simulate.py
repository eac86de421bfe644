"""`kvsim simulate`: replay a log through the APC and/or radix cache models."""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Annotated, Optional

import typer

from kvsim.cli.app import app, console
from kvsim.cli.options import CalibrationFileOpt, ENGINE, FLEET, INPUT, OFFLOAD, DEFAULT, EngineOptions, LogInput, LogPaths, PolicyOpt, WarmupOpt, with_groups
from kvsim.cli.replay_options import (SCHEDULER, ArrivalFromOpt, ArrivalsOpt, ReplayOpt, SpeedupOpt, StepSecondsOpt,
                                      replay_mode)

_ENG = "Engine settings"
_OUT = "Output"
_RAD = "SGLang radix settings"


@app.command()
@with_groups(SCHEDULER, ENGINE, INPUT, FLEET, OFFLOAD)
def simulate(
    logs: LogPaths,
    policy: PolicyOpt = "apc",
    replay: ReplayOpt = "sequential",
    arrival_from: ArrivalFromOpt = None,
    step_seconds: StepSecondsOpt = None,
    arrivals: ArrivalsOpt = "logged",
    speedup: SpeedupOpt = 1.0,
    concurrency: Annotated[int, typer.Option("--concurrency", help="Retired: use --replay steps|timed.",
                                             rich_help_panel=_ENG, hidden=True)] = 1,
    finish: Annotated[str, typer.Option("--finish", help="How replies end: length (at the logged length) or "
                                        "stop (a stop token).", rich_help_panel=_RAD)] = DEFAULT["radix_finish"],
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the summary as JSON.",
                                                     rich_help_panel=_OUT, show_default=False)] = None,
    per_request: Annotated[Optional[Path], typer.Option(
        "--per-request", help="Write one JSON line per request (and policy).", rich_help_panel=_OUT,
        show_default=False)] = None,
    calibration: CalibrationFileOpt = None,
    html: Annotated[Optional[Path], typer.Option(
        "--html", help="Also write the HTML report at this capacity (PNGs next to it), as kvsim report.",
        rich_help_panel=_OUT, show_default=False)] = None,
    warmup: WarmupOpt = None,
    scheduler: dict = None,
    engine: EngineOptions = None,
    log_input: LogInput = None,
    fleet: object = None,
    offload: dict = None,
) -> None:
    """Replay a prompt log through faithful models of vLLM APC and SGLang RadixAttention.

    Figures: [bold]token hit rate[/] = cached prompt tokens / prompt tokens (admitted requests);
    [bold]vLLM logged hit rate[/] = hits / queries as vLLM records them (prompt-logprob requests
    excluded); [bold]SGLang logged hit rate[/] = #cached-token / (#cached-token + page-rounded
    #new-token); [bold]request hit rate[/] = share of requests with any cached token;
    [bold]evictions[/] = blocks (APC) or leaves (radix) evicted. Without a capacity option the
    cache is unlimited (the upper bound). With [bold]--replicas N[/], N such engines behind
    [bold]--router[/]: the summary adds the fleet's bound, the routed bound and each replica.
    """
    from kvsim.outputs import check_output_path
    from kvsim.engines.registry import resolve_policies
    from kvsim.render.simulate import render_simulation
    from kvsim.drive.simulate import per_request_rows, run_simulation, simulation_json
    from kvsim.warmup import apply_warmup, parse_warmup

    from kvsim.errors import ConfigError

    names = resolve_policies(policy)
    parse_warmup(warmup)
    if concurrency != 1:
        raise ConfigError("--concurrency is retired: use --replay steps or --replay timed")
    mode = replay_mode(replay, arrival_from, step_seconds, arrivals, speedup, calibration, **scheduler)
    options = engine.sim_options(finish=finish, **offload)
    if fleet is not None:
        if offload:
            console.print("[dim]Offload: each replica has its own tier; the cached tokens include its hits, the "
                          "per-tier figures are not broken out for fleets.[/]")
        simulate_fleet(logs, names, options, mode, fleet, json_out, per_request, html, warmup, calibration,
                       log_input)
        return
    if mode is not None:
        simulate_concurrent(logs, names, options, mode, json_out, per_request, html, warmup, log_input)
        return
    _check_settings(names, options)  # fail on bad settings before reading a large log
    for out in (json_out, per_request, html):
        if out is not None:
            check_output_path(out, logs)
    calib = None
    if calibration is not None:
        from kvsim.costs.calibration import Calibration

        calib = Calibration.load(calibration)
    trace = log_input.load(logs)
    runs = run_simulation(trace, names, options, progress=True)
    window = apply_warmup(runs, len(trace), warmup)
    render_simulation(console, trace, runs, options, calibration=calib)
    tiers = _offload_sections(trace, {n: r for n, r in runs.items()}, options, calibration)
    console.print("[dim]Replay: sequential (one request at a time; --replay steps|timed for the engines' "
                  "schedulers under load).[/]")
    if window.active:
        console.print(f"[dim]Warm-up: {window.describe(len(trace))} (SGLang's logged rate, a whole-run figure, "
                      "is not shown).[/]")
    data = None
    if json_out is not None:
        data = {"mode": "sequential", **simulation_json(trace, runs, options, calibration=calib)}
        if window.active:
            data["warmup"] = window.as_dict(len(trace))
    _write_outputs(json_out, data, {"offload": tiers}, per_request, lambda: per_request_rows(trace, runs))
    if html is not None:
        from kvsim.cli.report import html_report
        from kvsim.report import ReportOptions

        html_report(html, trace, logs, ReportOptions(sim=options, calibration=calib, warmup=window), runs=runs)


def _offload_sections(trace, runs: dict, options, calibration) -> dict[str, dict]:
    """Each policy's offload-tier summary, with loading against recomputing when the step cost is
    known (--model and --gpu, or --calibration), printed (kvsim/render/offload.py); {} without --offload."""
    from kvsim.drive.metrics import counted
    from kvsim.engines import registry
    from kvsim.render.offload import render_offload

    out: dict[str, dict] = {}
    for name, r in runs.items():
        steps = getattr(r, "steps", None)        # a concurrent run, or a sequential ReplayResult
        extra = steps.extra if steps is not None else r.extra
        if "offload" not in extra:
            continue
        tier = extra["offload"]
        tier = tier.snapshot() if hasattr(tier, "snapshot") else tier
        served = ~(steps.rejected if steps is not None else r.rejected)
        mask = served if steps is not None else served & counted(r)
        summary = tier.summary(trace.prompt_lengths, mask)
        cost = _step_cost(options, calibration)
        if cost is not None:
            summary["transfer"] = tier.transfer_costs(cost.seconds, mask)
        timed = getattr(r, "timed", None)
        if timed is not None and getattr(r, "untiered", None) is not None:
            from kvsim.drive.concurrent import _timed_figures

            summary["with_tier"], summary["without_tier"] = _timed_figures(timed), _timed_figures(r.untiered)
        out[name] = summary
        render_offload(console, registry.engine(name).label, summary)
    return out


def _step_cost(options, calibration):
    """The step-cost model for load-against-recompute figures, or None when it is unknown."""
    from kvsim.errors import ConfigError

    if calibration is None and not (options.model and options.gpu):
        return None
    from kvsim.drive.step_cost import step_cost

    try:
        return step_cost(options.model, options.gpu, None if calibration is None else str(calibration))
    except ConfigError:
        return None


def _check_settings(names: list[str], options) -> None:
    """Resolve each policy's settings once, so bad values fail before the log is read."""
    from kvsim.engines import registry

    for name in names:
        registry.engine(name).settings(options)


# -- --replay steps|timed: the engines' schedulers under load (docs/concurrency.md) -----------------
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
    tiers = _offload_sections(trace, runs, options, mode.calibration)
    from kvsim.drive.concurrent import concurrent_json, concurrent_rows

    data = concurrent_json(trace, runs, options, mode) if json_out is not None else None
    _write_outputs(json_out, data, {"offload": tiers}, per_request, lambda: concurrent_rows(trace, runs))


def _write_outputs(json_out: Path | None, data: dict | None, sections: dict[str, dict[str, dict]],
                   per_request: Path | None, rows) -> None:
    """Write the --json summary, each policy's summary given its ``sections`` (key -> policy ->
    section), and the --per-request rows (``rows()``)."""
    from kvsim.outputs import write_json, write_jsonl

    if json_out is not None and data is not None:
        for key, by_policy in sections.items():
            for name, section in by_policy.items():
                data["policies"][name]["summary"][key] = section
        write_json(json_out, data)
        console.print(f"summary written to {json_out}")
    if per_request is not None:
        write_jsonl(per_request, rows())
        console.print(f"per-request results written to {per_request}")


# -- --replicas N --router NAME: a fleet of engines behind a router (docs/fleet.md) ----------------
def simulate_fleet(logs: list[Path], names: list[str], options, mode, fleet, json_out: Path | None,
                   per_request: Path | None, html: Path | None, warmup: str | None, calibration, log_input) -> None:
    """Check the options, read the log, replay each policy's fleet, print and write the results."""
    from kvsim.errors import ConfigError
    from kvsim.outputs import check_output_path
    from kvsim.render.fleet import render_fleet
    from kvsim.engines import registry

    if html is not None:
        raise ConfigError("--html reports one engine; a fleet's figures are in the terminal, --json and --per-request")
    if mode is not None and warmup is not None:
        raise ConfigError("--warmup applies to --replay sequential only")
    for name in names:                # bad settings fail before a large log is read
        if mode is None:
            registry.engine(name).settings(options)
        else:
            from kvsim.drive.concurrent import check_supported, scheduler_settings

            check_supported([name], options)
            scheduler_settings(name, options, mode)
    if mode is not None and mode.mode == "timed":
        from kvsim.drive.step_cost import step_cost

        step_cost(options.model, options.gpu, mode.calibration)
    for out in (json_out, per_request):
        if out is not None:
            check_output_path(out, logs)
    trace = log_input.load(logs)
    console.print(f"[dim]Fleet: {fleet.describe()}.[/]")
    if mode is None:
        from kvsim.fleet.sequential import fleet_rows, run_fleet_simulation
        from kvsim.render.simulate import render_simulation
        from kvsim.warmup import apply_warmup, parse_warmup

        parse_warmup(warmup)
        calib = None
        if calibration is not None:
            from kvsim.costs.calibration import Calibration

            calib = Calibration.load(calibration)
        runs = run_fleet_simulation(trace, names, options, fleet, progress=True)
        results = {name: run.result for name, run in runs.items()}
        window = apply_warmup(results, len(trace), warmup)
        render_simulation(console, trace, results, options, calibration=calib)
        console.print("[dim]Replay: sequential (one request at a time through the fleet; --replay steps|timed for "
                      "the engines' schedulers under load). Capacity and peak KV are one replica's.[/]")
        if window.active:
            console.print(f"[dim]Warm-up: {window.describe(len(trace))} (SGLang's logged rate, a whole-run figure, "
                          "is not shown).[/]")
        fleets = {name: run.fleet_summary(trace) for name, run in runs.items()}
        rows = lambda: fleet_rows(trace, runs)
    else:
        from kvsim.fleet.concurrent import fleet_concurrent_rows, run_fleet_concurrent
        from kvsim.render.concurrent import render_concurrent

        bars = None
        if len(trace) >= PROGRESS_MIN_REQUESTS:
            from kvsim.render.progress import Bars

            bars = Bars("count")
        with bars or nullcontext():
            progress = None if bars is None else (lambda label, total: bars.task(label, total))
            runs = run_fleet_concurrent(trace, names, options, mode, fleet, progress=progress)
        render_concurrent(console, trace, runs, mode)
        fleets = {name: run.fleet_summary(trace) for name, run in runs.items()}
        rows = lambda: fleet_concurrent_rows(trace, runs)
    for name, f in fleets.items():
        render_fleet(console, name, registry.engine(name).label, f)
    data = None
    if json_out is not None:
        if mode is None:
            from kvsim.drive.simulate import simulation_json

            data = {"mode": "sequential", **simulation_json(trace, results, options, calibration=calib)}
            if window.active:
                data["warmup"] = window.as_dict(len(trace))
        else:
            from kvsim.drive.concurrent import concurrent_json

            data = concurrent_json(trace, runs, options, mode)
        data["fleet"] = fleet.as_dict()
    _write_outputs(json_out, data, {"fleet": fleets}, per_request, rows)
