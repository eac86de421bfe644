"""`kvsim simulate`: replay a log through the APC and/or radix cache models."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvsim.cli.app import app, console
from kvsim.cli.options import INPUT_DEFAULT
from kvsim.cli.options import (DEFAULT, BlockSizeOpt, CapacityOpt, EngineVersionOpt, EvictionOpt, FormatOpt,
                               GpuOpt, GpuUtilOpt, KvCacheMemoryOpt, LimitOpt, LogPaths, MaxTotalTokensOpt,
                               MemFractionOpt, ModelOpt, NumGpuBlocksOpt, OnErrorOpt, PageSizeOpt, PolicyOpt,
                               TemplateOpt, TokenizerOpt, TraceBlockOpt, WarmupOpt, load_from_cli, sim_options)
from kvsim.cli.replay_options import (ArrivalFromOpt, ArrivalsOpt, AsyncSchedulingOpt, LongPrefillOpt,
                                      MaxNumBatchedTokensOpt, MaxNumSeqsOpt, MaxPrefillTokensOpt,
                                      MaxRunningRequestsOpt, RandomSeedOpt, ReplayOpt, SchedulePolicyOpt,
                                      SchedulingPolicyOpt, SpeedupOpt, StepSecondsOpt, replay_mode)

_ENG = "Engine settings"
_OUT = "Output"
_RAD = "SGLang radix settings"


@app.command()
def simulate(
    logs: LogPaths,
    policy: PolicyOpt = "apc",
    replay: ReplayOpt = "sequential",
    arrival_from: ArrivalFromOpt = None,
    step_seconds: StepSecondsOpt = None,
    arrivals: ArrivalsOpt = "logged",
    speedup: SpeedupOpt = 1.0,
    max_num_seqs: MaxNumSeqsOpt = None,
    max_num_batched_tokens: MaxNumBatchedTokensOpt = None,
    long_prefill_token_threshold: LongPrefillOpt = None,
    scheduling_policy: SchedulingPolicyOpt = None,
    async_scheduling: AsyncSchedulingOpt = None,
    schedule_policy: SchedulePolicyOpt = None,
    max_prefill_tokens: MaxPrefillTokensOpt = None,
    max_running_requests: MaxRunningRequestsOpt = None,
    random_seed: RandomSeedOpt = None,
    capacity: CapacityOpt = None,
    num_gpu_blocks: NumGpuBlocksOpt = None,
    max_total_tokens: MaxTotalTokensOpt = None,
    kv_cache_memory: KvCacheMemoryOpt = None,
    model: ModelOpt = None,
    gpu: GpuOpt = None,
    gpu_memory_utilization: GpuUtilOpt = DEFAULT["gpu_memory_utilization"],
    mem_fraction_static: MemFractionOpt = None,
    block_size: BlockSizeOpt = DEFAULT["block_size"],
    page_size: PageSizeOpt = DEFAULT["page_size"],
    eviction: EvictionOpt = DEFAULT["eviction_policy"],
    engine_version: EngineVersionOpt = None,
    hash_algo: Annotated[str, typer.Option("--hash-algo", help="APC block hash: fast, sha256 or sha256_cbor "
                                           "(the last two reproduce vLLM's hash bytes).",
                                           rich_help_panel=_ENG)] = DEFAULT["hash_algo"],
    concurrency: Annotated[int, typer.Option("--concurrency", help="Retired: use --replay steps|timed.",
                                             rich_help_panel=_ENG, hidden=True)] = 1,
    radix_tree: Annotated[str, typer.Option("--radix-tree", help="SGLang tree: unified (what a default 0.5.23 "
                                            "server builds) or classic (RadixCache).",
                                            rich_help_panel=_RAD)] = DEFAULT["radix_tree"],
    disable_overlap_schedule: Annotated[bool, typer.Option(
        "--disable-overlap-schedule", help="SGLang's non-overlap scheduler (default: overlap on, as SGLang; "
        "also for --replay steps|timed).",
        rich_help_panel=_RAD)] = not DEFAULT["radix_overlap"],
    chunked_prefill_size: Annotated[Optional[int], typer.Option(
        "--chunked-prefill-size", help="SGLang's chunk size (-1 off; default: SGLang's for --gpu, else 4096; "
        "also for --replay steps|timed).",
        rich_help_panel=_RAD, show_default=False)] = None,
    finish: Annotated[str, typer.Option("--finish", help="How replies end: length (at the logged length) or "
                                        "stop (a stop token).", rich_help_panel=_RAD)] = DEFAULT["radix_finish"],
    eviction_amount: Annotated[str, typer.Option(
        "--eviction-amount", help="shortfall (SGLang 0.5.23: need - free) or need (older releases).",
        rich_help_panel=_RAD)] = DEFAULT["radix_eviction_amount"],
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the summary as JSON.",
                                                     rich_help_panel=_OUT, show_default=False)] = None,
    per_request: Annotated[Optional[Path], typer.Option(
        "--per-request", help="Write one JSON line per request (and policy).", rich_help_panel=_OUT,
        show_default=False)] = None,
    calibration: Annotated[Optional[Path], typer.Option(
        "--calibration", help="gpu-validate calibration JSON: estimate TTFT and GPU-seconds saved "
        "(--replay timed: the cost of a step, instead of the roofline of --model on --gpu).",
        rich_help_panel=_OUT, show_default=False)] = None,
    html: Annotated[Optional[Path], typer.Option(
        "--html", help="Also write the HTML report at this capacity (PNGs next to it), as kvsim report.",
        rich_help_panel=_OUT, show_default=False)] = None,
    warmup: WarmupOpt = None,
    fmt: FormatOpt = INPUT_DEFAULT["format"],
    tokenizer: TokenizerOpt = INPUT_DEFAULT["tokenizer"],
    chat_template: TemplateOpt = INPUT_DEFAULT["chat_template"],
    trace_block_size: TraceBlockOpt = INPUT_DEFAULT["trace_block_size"],
    on_error: OnErrorOpt = INPUT_DEFAULT["on_error"],
    limit: LimitOpt = None,
) -> None:
    """Replay a prompt log through faithful models of vLLM APC and SGLang RadixAttention.

    Figures: [bold]token hit rate[/] = cached prompt tokens / prompt tokens (admitted requests);
    [bold]vLLM logged hit rate[/] = hits / queries as vLLM records them (prompt-logprob requests
    excluded); [bold]SGLang logged hit rate[/] = #cached-token / (#cached-token + page-rounded
    #new-token); [bold]request hit rate[/] = share of requests with any cached token;
    [bold]evictions[/] = blocks (APC) or leaves (radix) evicted. Without a capacity option the
    cache is unlimited (the upper bound).
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
    mode = replay_mode(
        replay, arrival_from, step_seconds, arrivals, speedup, calibration,
        vllm=dict(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                  long_prefill_token_threshold=long_prefill_token_threshold, policy=scheduling_policy,
                  async_scheduling=async_scheduling),
        sglang=dict(schedule_policy=schedule_policy,
                    max_prefill_tokens=max_prefill_tokens, max_running_requests=max_running_requests,
                    random_seed=random_seed))
    options = sim_options(
        capacity, num_gpu_blocks, max_total_tokens, kv_cache_memory, model, gpu, gpu_memory_utilization,
        mem_fraction_static, block_size=block_size, page_size=page_size, eviction_policy=eviction,
        engine_version=engine_version, hash_algo=hash_algo,
        extra=dict(radix_tree=radix_tree, overlap=not disable_overlap_schedule, finish=finish,
                   eviction_amount=eviction_amount,
                   **({} if chunked_prefill_size is None else {"chunked_prefill_size": chunked_prefill_size})),
    )
    if mode is not None:
        from kvsim.cli.simulate_concurrent import simulate_concurrent

        simulate_concurrent(logs, names, options, mode, json_out, per_request, html, warmup,
                            dict(fmt=fmt, tokenizer=tokenizer, chat_template=chat_template,
                                 trace_block_size=trace_block_size, on_error=on_error, limit=limit))
        return
    _check_settings(names, options)  # fail on bad settings before reading a large log
    for out in (json_out, per_request, html):
        if out is not None:
            check_output_path(out, logs)
    calib = None
    if calibration is not None:
        from kvsim.gpu.calibration import Calibration

        calib = Calibration.load(calibration)
    trace = load_from_cli(logs, fmt, tokenizer, chat_template, trace_block_size, on_error, limit)
    runs = run_simulation(trace, names, options, progress=True)
    window = apply_warmup(runs, len(trace), warmup)
    render_simulation(console, trace, runs, options, calibration=calib)
    console.print("[dim]Replay: sequential (one request at a time; --replay steps|timed for the engines' "
                  "schedulers under load).[/]")
    if window.active:
        console.print(f"[dim]Warm-up: {window.describe(len(trace))} (SGLang's logged rate, a whole-run figure, "
                      "is not shown).[/]")
    if json_out is not None:
        from kvsim.outputs import write_json

        data = {"mode": "sequential", **simulation_json(trace, runs, options, calibration=calib)}
        if window.active:
            data["warmup"] = window.as_dict(len(trace))
        write_json(json_out, data)
        console.print(f"summary written to {json_out}")
    if per_request is not None:
        from kvsim.outputs import write_jsonl

        write_jsonl(per_request, per_request_rows(trace, runs))
        console.print(f"per-request results written to {per_request}")
    if html is not None:
        from kvsim.cli.report import html_report
        from kvsim.report import ReportOptions

        html_report(html, trace, logs, ReportOptions(sim=options, calibration=calib, warmup=window), runs=runs)


def _check_settings(names: list[str], options) -> None:
    """Resolve each policy's settings once, so bad values fail before the log is read."""
    from kvsim.engines import registry

    for name in names:
        registry.engine(name).settings(options)
