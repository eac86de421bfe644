"""Options of the concurrent replay shared by report and sweep.

They keep ``kvsim simulate``'s names and meanings: ``--replay sequential|steps|timed``,
``--arrival-from step|timestamp``, ``--step-seconds``, ``--speedup``.
"""
from __future__ import annotations

from typing import Annotated, Optional

import typer

_LOAD = "Under load (concurrent replay)"

ReplayOpt = Annotated[str, typer.Option(
    "--replay", help="sequential (only the exact sequential replays), or also the scheduler models under load: "
    "steps (a step clock) or timed (a step-cost model: --model and --gpu, or --calibration).",
    rich_help_panel=_LOAD)]
ArrivalFromOpt = Annotated[Optional[str], typer.Option(
    "--arrival-from", help="step (the log's integer arrival_step; default for steps) or timestamp (default for "
    "timed; with steps it needs --step-seconds).", rich_help_panel=_LOAD, show_default=False)]
StepSecondsOpt = Annotated[Optional[float], typer.Option(
    "--step-seconds", help="Log seconds per engine step (steps with --arrival-from timestamp), or seconds per "
    "logged step (timed with --arrival-from step).", rich_help_panel=_LOAD, show_default=False)]
SpeedupOpt = Annotated[float, typer.Option(
    "--speedup", help="Replay the logged arrivals this many times faster (more load).", rich_help_panel=_LOAD)]
ConcurrentOpt = Annotated[bool, typer.Option(
    "--concurrent/--no-concurrent", help="The 'Under load' section: the log replayed as it arrived (timed, with "
    "and without prefix caching), where it has timestamps.", rich_help_panel=_LOAD)]
