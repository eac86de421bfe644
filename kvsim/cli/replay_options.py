"""The concurrent-replay options of ``kvsim simulate`` (``--replay steps|timed``), defined once.

Scheduler options keep the engines' own names (vLLM's ``--max-num-seqs``, SGLang's
``--schedule-policy``, ...); unset ones take the engine's default for the GPU
(each engine's ``scheduler_settings``), and the summary says which.
"""
from __future__ import annotations

from typing import Annotated, Optional

import typer

PANEL = "Concurrent replay (--replay steps|timed)"

ReplayOpt = Annotated[str, typer.Option(
    "--replay", help="sequential (one request at a time), steps (the engines' real schedulers on a step clock) "
    "or timed (steps that cost modelled time: TTFT, E2E).", rich_help_panel=PANEL)]
ArrivalFromOpt = Annotated[Optional[str], typer.Option(
    "--arrival-from", help="step (the log's integer arrival_step; default for steps) or timestamp (default for "
    "timed; with steps it needs --step-seconds).", rich_help_panel=PANEL, show_default=False)]
StepSecondsOpt = Annotated[Optional[float], typer.Option(
    "--step-seconds", help="Log seconds per engine step (steps with --arrival-from timestamp), or seconds per "
    "logged step (timed with --arrival-from step).", rich_help_panel=PANEL, show_default=False)]
ArrivalsOpt = Annotated[str, typer.Option(
    "--arrivals", help="logged (as the log says) or closed-loop (a session's next turn waits for the previous "
    "reply, plus the logged gap as think time).", rich_help_panel=PANEL)]
ServeReplayOpt = Annotated[str, typer.Option(
    "--replay", help="sequential (each request served whole, at once) or timed (the engine's scheduler in "
    "wall-clock time: requests share batches and queue, replies take the modelled time).",
    rich_help_panel=PANEL)]
CalibrationOpt = Annotated[Optional[str], typer.Option(
    "--calibration", help="--replay timed: a gpu-validate calibration JSON for the cost of a step (default: the "
    "roofline of --model on --gpu).", rich_help_panel=PANEL, show_default=False)]
SpeedupOpt = Annotated[float, typer.Option(
    "--speedup", help="Divide logged arrival times by this (2 = twice the load).", rich_help_panel=PANEL)]
def flag(setting: str) -> str:
    """The command-line flag of a scheduler setting."""
    return {"policy": "--scheduling-policy", "random_seed": "--random-seed"}.get(setting, "--" + setting.replace("_", "-"))


def replay_mode(replay: str, arrival_from: str | None, step_seconds: float | None, arrivals: str, speedup: float,
                calibration, vllm: dict, sglang: dict):
    """The :class:`ReplayMode` the options ask for, or None for ``--replay sequential``.

    Options that only a concurrent replay reads are an error with ``--replay sequential``.
    """
    from kvsim.errors import ConfigError
    from kvsim.drive.concurrent import MODES, ReplayMode

    if replay not in MODES:
        raise ConfigError(f"unknown --replay {replay!r}; choose {', '.join(MODES)}")
    vllm = {k: v for k, v in vllm.items() if v is not None}
    sglang = {k: v for k, v in sglang.items() if v is not None}
    if replay == "sequential":
        given = [flag for flag, value in (("--arrival-from", arrival_from), ("--step-seconds", step_seconds),
                                          ("--arrivals", None if arrivals == "logged" else arrivals),
                                          ("--speedup", None if speedup == 1.0 else speedup))
                 if value is not None]
        given += [flag(k) for k in (*vllm, *sglang)]
        if given:
            raise ConfigError(f"{', '.join(given)} need(s) --replay steps or --replay timed")
        return None
    return ReplayMode(replay, arrival_from, step_seconds, arrivals, speedup,
                      None if calibration is None else str(calibration), vllm, sglang)


def _scheduler(max_num_seqs=None, max_num_batched_tokens=None, long_prefill_token_threshold=None,
               scheduling_policy=None, async_scheduling=None, schedule_policy=None, max_prefill_tokens=None,
               max_running_requests=None, random_seed=None) -> dict[str, dict]:
    """The scheduler options, by whose scheduler reads them (ReplayMode's vllm / sglang)."""
    return {"vllm": dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                         long_prefill_token_threshold=long_prefill_token_threshold, policy=scheduling_policy,
                         async_scheduling=async_scheduling),
            "sglang": dict(schedule_policy=schedule_policy, max_prefill_tokens=max_prefill_tokens,
                           max_running_requests=max_running_requests, random_seed=random_seed)}




from kvsim.cli.options import Group, option  # noqa: E402


def _sched(kind, flag_name: str, text: str):
    return option(kind, flag_name, text, PANEL)


#: the engines' scheduler options (simulate, serve): vLLM 0.33.0's, then SGLang 0.5.23's
#: (SGLang's --chunked-prefill-size and --disable-overlap-schedule are the radix model's own)
SCHEDULER = Group("scheduler", {
    "max_num_seqs": _sched(Optional[int], "--max-num-seqs", "vLLM: most running requests (default: vLLM's for "
                           "--gpu, else 256)."),
    "max_num_batched_tokens": _sched(Optional[int], "--max-num-batched-tokens", "vLLM: token budget per step "
                                     "(default: vLLM's for --gpu, else 2048)."),
    "long_prefill_token_threshold": _sched(Optional[int], "--long-prefill-token-threshold",
                                           "vLLM: cap a prefill chunk when others wait (default 0: off)."),
    "scheduling_policy": _sched(Optional[str], "--scheduling-policy", "vLLM: fcfs (default) or priority (logs "
                                "carry no priority: all 0, arrival order decides)."),
    "async_scheduling": _sched(Optional[bool], "--async-scheduling/--no-async-scheduling",
                               "vLLM: async scheduling (default on, as vLLM 0.33.0)."),
    "schedule_policy": _sched(Optional[str], "--schedule-policy", "SGLang: fcfs (0.5.23's default), lpm, "
                              "dfs-weight, lof or random."),
    "max_prefill_tokens": _sched(Optional[int], "--max-prefill-tokens", "SGLang: tokens per prefill batch "
                                 "(default 16384)."),
    "max_running_requests": _sched(Optional[int], "--max-running-requests", "SGLang: most running requests "
                                   "(default: from the pool size, as SGLang)."),
    "random_seed": _sched(Optional[int], "--random-seed", "SGLang: seed of --schedule-policy random (default 0)."),
}, _scheduler)
