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
ArrivalFromOpt = Annotated[str, typer.Option(
    "--arrival-from", help="--replay steps: each request's arrival_step field (step), or its timestamp "
    "converted with --step-seconds (timestamp).", rich_help_panel=_LOAD)]
StepSecondsOpt = Annotated[float, typer.Option(
    "--step-seconds", help="--arrival-from timestamp: seconds of log time per scheduler step.",
    rich_help_panel=_LOAD)]
SpeedupOpt = Annotated[float, typer.Option(
    "--speedup", help="Replay the logged arrivals this many times faster (more load).", rich_help_panel=_LOAD)]
ConcurrentOpt = Annotated[bool, typer.Option(
    "--concurrent/--no-concurrent", help="The 'Under load' section: the log replayed as it arrived (timed, with "
    "and without prefix caching), where it has timestamps.", rich_help_panel=_LOAD)]
