"""`kvsim sweep`: exact replays over capacities, block/page sizes and policies, plus one-pass curves."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvsim.cli.options import FLEET_PANEL, INPUT, OFFLOAD, OFFLOAD_PANEL, ROUTER_NAMES, LogInput, option, with_groups
from kvsim.cli.app import app, console
from kvsim.cli.replay_options import ArrivalFromOpt, ArrivalsOpt, ReplayOpt, SpeedupOpt, StepSecondsOpt
from kvsim.cli.options import (DEFAULT, BlockSizeListOpt, CapacityListOpt, EngineVersionOpt, EvictionListOpt, GpuOpt, LogPaths, ModelOpt, PageSizeListOpt, PolicyOpt, WarmupOpt)

_RUN = "Execution"
_OUT = "Output"
#: kvsim simulate's tier options, --offload-size taking a comma list here (docs/offload.md)
SWEEP_OFFLOAD = OFFLOAD.but(offload_size=option(
    Optional[str], "--offload-size", "Also replay each row with the tier at these sizes, a comma list: tokens "
    "(5e4,1e5), memory such as 100GiB (needs --model), 0 = no tier; columns offload, offload_size_tokens, "
    "gpu/cpu/disk_hit_rate (docs/offload.md).", OFFLOAD_PANEL))


@app.command()
@with_groups(INPUT, SWEEP_OFFLOAD)
def sweep(
    logs: LogPaths,
    capacity: CapacityListOpt,
    policy: PolicyOpt = "all",
    block_size: BlockSizeListOpt = str(DEFAULT["block_size"]),
    page_size: PageSizeListOpt = str(DEFAULT["page_size"]),
    eviction: EvictionListOpt = DEFAULT["eviction_policy"],
    model: ModelOpt = None,
    engine_version: EngineVersionOpt = None,
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
    replay_mode: ReplayOpt = "sequential",
    arrival_from: ArrivalFromOpt = None,
    step_seconds: StepSecondsOpt = None,
    speedup: SpeedupOpt = 1.0,
    arrivals: ArrivalsOpt = "logged",
    gpu: GpuOpt = None,
    calibration: Annotated[Optional[Path], typer.Option(
        "--calibration", help="--replay timed: a gpu-validate calibration JSON as the step cost.",
        rich_help_panel="Concurrent replay (--replay steps|timed)", show_default=False)] = None,
    replicas: Annotated[Optional[str], typer.Option(
        "--replicas", help="Also replay each row as fleets of these sizes, a comma list (1,2,4,8), behind each "
        "--router: columns replicas, router, fleet and routed bounds (docs/fleet.md).", rich_help_panel=FLEET_PANEL,
        show_default=False)] = None,
    router: Annotated[Optional[str], typer.Option(
        "--router", help=f"Routers of the fleets, a comma list: {', '.join(ROUTER_NAMES)} (default round_robin).",
        rich_help_panel=FLEET_PANEL, show_default=False)] = None,
    router_option: Annotated[Optional[list[str]], typer.Option(
        "--router-option", help="A router option KEY=VALUE (repeatable), for the routers that have it.",
        rich_help_panel=FLEET_PANEL, show_default=False)] = None,
    log_input: LogInput = None,
    offload: dict = None,
) -> None:
    """Replay a log at every combination of capacity, block/page size and policy.

    Each combination is an exact sequential replay (as [bold]kvsim simulate[/]); APC rows vary
    --block-size, radix rows --page-size and --eviction. Hit rate = cached prompt
    tokens / prompt tokens of admitted requests. With --curve, a one-pass stack-distance model
    gives the whole hit-rate-vs-capacity curve of each LRU-like setting; its error against the
    exact replays is shown per row. Every row also shows the optimum: the most any cache of that
    size could hit, knowing the future, under the engine's rules. With --replay steps or timed,
    each row is also replayed as the log arrived through the engine's scheduler model (vLLM
    0.33.0, SGLang 0.5.23) at the same capacity: its hit rate under load, preemptions, and with
    timed the TTFT p50/p90 (step cost: --model on --gpu, or --calibration). With --offload and
    --offload-size, each row is replayed again with a memory tier of each size: the token shares
    served from the GPU, CPU memory and disk.
    """
    from kvsim.errors import ConfigError
    from kvsim.outputs import check_output_path
    from kvsim.sweep.grid import (
        parse_capacities,
        parse_eviction_policies,
        parse_ints,
        parse_policies,
    )
    from kvsim.sweep.executors import EXECUTORS, make_executor
    from kvsim.warmup import parse_warmup

    names = parse_policies(policy)
    window = parse_warmup(warmup)
    parse_capacities(capacity, model)
    parse_ints(block_size, "--block-size")
    parse_ints(page_size, "--page-size")
    parse_eviction_policies(eviction)
    if executor not in EXECUTORS:
        raise ConfigError(f"--executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if curve_points < 2:
        raise ConfigError(f"--curve-points must be at least 2, got {curve_points}")
    under_load = _under_load(replay_mode, arrival_from, step_seconds, arrivals, speedup, model, gpu, calibration,
                             engine_version)
    grid = _fleet_grid(replicas, router, router_option)
    tiers = _tier_grid(offload, names, capacity, block_size, page_size, eviction, model, engine_version, gpu)
    if tiers is not None and grid is not None:
        raise ConfigError("sweep fleets (--replicas) or tier sizes (--offload-size), one at a time")
    runner = make_executor(executor, jobs)
    for out in (csv_out, json_out, html):
        if out is not None:
            check_output_path(out, logs)
    if csv_out is not None and json_out is not None and csv_out.resolve() == json_out.resolve():
        raise ConfigError("--csv and --json name the same file")

    from kvsim.render.sweep import render_sweep
    from kvsim.sweep.run import sweep as run
    from kvsim.sweep.run import sweep_json

    trace = log_input.load(logs)
    if under_load is not None:
        from kvsim.drive.concurrent import releases_for

        releases_for(trace, under_load[0])     # a log without the arrivals asked for: one line, exit 2
    options = {} if engine_version is None else {"engine_version": engine_version}
    if gpu is not None:
        options["gpu"] = gpu
    result = run(trace, names, capacity, block_size, page_size, eviction, model=model, jobs=jobs,
                 executor=runner, curves=curve, curve_points=curve_points, progress=True, warmup=window,
                 concurrent=under_load, **options)
    render_sweep(console, result)
    fleet_table = None
    if grid is not None:
        from kvsim.fleet.sweep import fleet_frame, fleet_rows
        from kvsim.render.fleet import render_fleet_sweep

        fleet_table = fleet_frame(fleet_rows(trace, result.points, grid, under_load))
        render_fleet_sweep(console, fleet_table)
    tier_table = None
    if tiers is not None:
        from kvsim.render.sweep import render_offload_sweep
        from kvsim.sweep.offload import offload_frame, offload_rows

        tier_table = offload_frame(offload_rows(trace, result.points, tiers, result.frame, under_load,
                                                progress=True))
        render_offload_sweep(console, tier_table)
    if csv_out is not None:
        from kvsim.outputs import write_text_atomic

        table = result.frame if fleet_table is None else fleet_table    # with --replicas: the fleet rows
        table = table if tier_table is None else tier_table             # with --offload: the tier rows
        write_text_atomic(csv_out, table.to_csv(index=False))
        console.print(f"table written to {csv_out}")
    if json_out is not None:
        from kvsim.outputs import write_json

        settings = {"policy": names, "capacity": capacity, "block_size": block_size, "page_size": page_size,
                    "eviction_policy": eviction, "model": model, "engine_version": engine_version,
                    "executor": executor, "jobs": jobs, "warmup": warmup}
        if under_load is not None:    # (a sequential sweep's JSON stays as it was)
            from kvsim.drive.views import describe

            mode, cost = under_load
            settings.update({"replay": replay_mode, "gpu": gpu, "arrival_from": mode.arrival_from,
                             "step_seconds": step_seconds, "speedup": speedup, "arrivals": arrivals,
                             "under_load": describe(mode, cost)})
        if fleet_table is not None:
            settings.update({"replicas": replicas, "router": router or "round_robin",
                             "router_options": list(router_option or [])})
        if tier_table is not None:
            settings.update({"offload": tiers.backend, "offload_size": [t.label for t in tiers.sizes],
                             "offload_options": {k: v for k, v in tiers.options.items() if k != "offload"}})
        data = sweep_json(trace, result, settings)
        if fleet_table is not None:
            data["fleet_rows"] = _records(fleet_table)
        if tier_table is not None:
            data["offload_rows"] = _records(tier_table)
        write_json(json_out, data)
        console.print(f"sweep written to {json_out}")
    if html is not None:
        from kvsim.cli.report import html_report, sweep_report_options

        html_report(html, trace, logs, sweep_report_options(block_size, page_size, eviction, engine_version,
                                                            model, jobs, window, speedup), sweep_result=result)


def _under_load(replay_mode: str, arrival_from: str | None, step_seconds: float | None, arrivals: str,
                speedup: float, model: str | None, gpu: str | None, calibration: Path | None,
                engine_version: str | None):
    """(ReplayMode, step cost) of the concurrent replay the options ask for, or None for
    --replay sequential; bad options fail here, as kvsim simulate's."""
    from kvsim.cli.replay_options import replay_mode as mode_of
    from kvsim.errors import ConfigError

    mode = mode_of(replay_mode, arrival_from, step_seconds, arrivals, speedup, calibration, {}, {})
    if mode is None:
        return None
    if engine_version is not None and not str(engine_version).startswith("0.33"):
        raise ConfigError("--replay steps|timed models vLLM 0.33.0's scheduler; --engine-version applies "
                          "to --replay sequential only")
    cost = None
    if mode.mode == "timed":
        from kvsim.drive.step_cost import step_cost

        cost = step_cost(model, gpu, mode.calibration)
    return mode, cost


def _fleet_grid(replicas: str | None, router: str | None, router_option: list[str] | None):
    """The fleets of --replicas x --router (None without --replicas); bad values fail here."""
    from kvsim.errors import ConfigError
    from kvsim.fleet.config import parse_router_options
    from kvsim.fleet.sweep import fleets, parse_replicas

    options = parse_router_options(router_option)
    if replicas is None:
        if router is not None or options:
            raise ConfigError("--router and --router-option need --replicas (a comma list of fleet sizes)")
        return None
    routers = [r.strip() for r in (router or "round_robin").split(",") if r.strip()]
    return fleets(parse_replicas(replicas), routers, options)


def _tier_grid(offload: dict | None, names: list[str], capacity: str, block_size: str, page_size: str,
               eviction: str, model: str | None, engine_version: str | None, gpu: str | None):
    """The tier sizes of --offload x --offload-size (None without --offload); every row at every
    size is checked here, before the log is read."""
    from kvsim.sweep.grid import expand_grid, parse_capacities, parse_eviction_policies, parse_ints
    from kvsim.sweep.offload import check, tier_grid

    tiers = tier_grid(offload or {}, model)
    if tiers is None:
        return None
    base = {k: v for k, v in (("model", model), ("engine_version", engine_version), ("gpu", gpu)) if v is not None}
    points = expand_grid(names, parse_capacities(capacity, model), parse_ints(block_size, "--block-size"),
                         parse_ints(page_size, "--page-size"), parse_eviction_policies(eviction), base=base)
    check(tiers, points)
    return tiers


def _records(table) -> list[dict]:
    """A table's rows for the JSON output (inf and NaN as null)."""
    return table.replace({float("inf"): None}).astype(object).where(table.notna(), None).to_dict(orient="records")
