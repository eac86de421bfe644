"""`kvsim simulate`: replay a log through the APC and/or radix cache models."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvsim.cli.app import app, console
from kvsim.cli.options import (FormatOpt, LimitOpt, LogPaths, OnErrorOpt, TemplateOpt, TokenizerOpt,
                               TraceBlockOpt, load_from_cli)

_CAP = "Capacity (one of)"
_ENG = "Engine settings"
_OUT = "Output"
_RAD = "SGLang radix settings"


def parse_capacity_tokens(text: str | None) -> float | None:
    """'inf', '1e6', '250000' -> tokens (float so that inf is allowed)."""
    from kvsim.errors import ConfigError

    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"--capacity-tokens must be a number of tokens or 'inf', got {text!r}") from None
    if not value > 0:
        raise ConfigError(f"--capacity-tokens must be positive, got {text!r}")
    return value


@app.command()
def simulate(
    logs: LogPaths,
    policy: Annotated[str, typer.Option("--policy", "-p", help="apc (vLLM APC), radix (SGLang RadixAttention), "
                                        "a comma list, or all.")] = "apc",
    capacity_tokens: Annotated[Optional[str], typer.Option(
        "--capacity-tokens", help="Usable KV capacity in tokens, or 'inf' for the unlimited upper bound.",
        rich_help_panel=_CAP, show_default=False)] = None,
    num_gpu_blocks: Annotated[Optional[int], typer.Option(
        "--num-gpu-blocks", help="vLLM's num_gpu_blocks (the reserved null block included).",
        rich_help_panel=_CAP, show_default=False)] = None,
    max_total_tokens: Annotated[Optional[int], typer.Option(
        "--max-total-tokens", help="SGLang's max_total_num_tokens.", rich_help_panel=_CAP, show_default=False)] = None,
    kv_cache_memory: Annotated[Optional[str], typer.Option(
        "--kv-cache-memory", help="KV cache memory, e.g. 20GiB (needs --model).", rich_help_panel=_CAP,
        show_default=False)] = None,
    model: Annotated[Optional[str], typer.Option(
        "--model", help="Model shape (llama-3-8b, qwen2.5-72b, deepseek-v3, ...) or a HF config.json path.",
        rich_help_panel=_CAP, show_default=False)] = None,
    gpu: Annotated[Optional[str], typer.Option(
        "--gpu", help="GPU (H100-80GB, H200, A100-80GB, L4, ...): estimate the capacity the engine would get.",
        rich_help_panel=_CAP, show_default=False)] = None,
    gpu_memory_utilization: Annotated[float, typer.Option(
        "--gpu-memory-utilization", help="vLLM's setting, used with --gpu.", rich_help_panel=_CAP)] = 0.9,
    mem_fraction_static: Annotated[Optional[float], typer.Option(
        "--mem-fraction-static", help="SGLang's setting, used with --gpu (default: SGLang's own default).",
        rich_help_panel=_CAP, show_default=False)] = None,
    block_size: Annotated[int, typer.Option("--block-size", help="APC block size (tokens).",
                                            rich_help_panel=_ENG)] = 16,
    page_size: Annotated[int, typer.Option("--page-size", help="Radix page size (tokens).",
                                           rich_help_panel=_ENG)] = 1,
    eviction_policy: Annotated[str, typer.Option("--eviction-policy", help="Radix eviction policy "
                                                 "(lru, lfu, fifo, mru, filo, priority, slru, tlru).",
                                                 rich_help_panel=_ENG)] = "lru",
    engine_version: Annotated[Optional[str], typer.Option(
        "--engine-version", help="Behaviour profile: vLLM 0.33 (default) or 0.11.", rich_help_panel=_ENG,
        show_default=False)] = None,
    hash_algo: Annotated[str, typer.Option("--hash-algo", help="APC block hash: fast, sha256 or sha256_cbor "
                                           "(the last two reproduce vLLM's hash bytes).",
                                           rich_help_panel=_ENG)] = "fast",
    concurrency: Annotated[int, typer.Option("--concurrency", help="1 = sequential replay.",
                                             rich_help_panel=_ENG)] = 1,
    radix_tree: Annotated[str, typer.Option("--radix-tree", help="SGLang tree: unified (what a default 0.5.23 "
                                            "server builds) or classic (RadixCache).", rich_help_panel=_RAD)] = "unified",
    disable_overlap_schedule: Annotated[bool, typer.Option(
        "--disable-overlap-schedule", help="SGLang's non-overlap scheduler (default: overlap on, as SGLang).",
        rich_help_panel=_RAD)] = False,
    chunked_prefill_size: Annotated[Optional[int], typer.Option(
        "--chunked-prefill-size", help="SGLang's chunk size (-1 off; default: SGLang's for --gpu, else 4096).",
        rich_help_panel=_RAD, show_default=False)] = None,
    finish: Annotated[str, typer.Option("--finish", help="How replies end: length (at the logged length) or "
                                        "stop (a stop token).", rich_help_panel=_RAD)] = "length",
    eviction_amount: Annotated[str, typer.Option(
        "--eviction-amount", help="shortfall (SGLang 0.5.23: need - free) or need (older releases).",
        rich_help_panel=_RAD)] = "shortfall",
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the summary as JSON.",
                                                     rich_help_panel=_OUT, show_default=False)] = None,
    per_request: Annotated[Optional[Path], typer.Option(
        "--per-request", help="Write one JSON line per request (and policy).", rich_help_panel=_OUT,
        show_default=False)] = None,
    calibration: Annotated[Optional[Path], typer.Option(
        "--calibration", help="gpu-validate calibration JSON: estimate TTFT and GPU-seconds saved.",
        rich_help_panel=_OUT, show_default=False)] = None,
    html: Annotated[Optional[Path], typer.Option(
        "--html", help="Also write the HTML report at this capacity (PNGs next to it), as kvsim report.",
        rich_help_panel=_OUT, show_default=False)] = None,
    fmt: FormatOpt = "auto",
    tokenizer: TokenizerOpt = "cl100k_base",
    chat_template: TemplateOpt = "llama3",
    trace_block_size: TraceBlockOpt = 512,
    on_error: OnErrorOpt = "fail",
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
    from kvsim.models import parse_bytes
    from kvsim.outputs import check_output_path
    from kvsim.replay.options import SimOptions
    from kvsim.cache.registry import resolve_policies
    from kvsim.replay.simulate import run_simulation, render_simulation, simulation_json, per_request_rows

    names = resolve_policies(policy)
    options = SimOptions(
        capacity_tokens=parse_capacity_tokens(capacity_tokens), num_gpu_blocks=num_gpu_blocks,
        max_total_tokens=max_total_tokens,
        kv_cache_memory=None if kv_cache_memory is None else parse_bytes(kv_cache_memory),
        model=model, gpu=gpu, gpu_memory_utilization=gpu_memory_utilization,
        mem_fraction_static=mem_fraction_static, block_size=block_size, page_size=page_size,
        eviction_policy=eviction_policy, engine_version=engine_version, hash_algo=hash_algo,
        concurrency=concurrency,
        extra=dict(radix_tree=radix_tree, overlap=not disable_overlap_schedule, finish=finish,
                   eviction_amount=eviction_amount,
                   **({} if chunked_prefill_size is None else {"chunked_prefill_size": chunked_prefill_size})),
    )
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
    render_simulation(console, trace, runs, options, calibration=calib)
    if json_out is not None:
        from kvsim.outputs import write_json

        write_json(json_out, simulation_json(trace, runs, options, calibration=calib))
        console.print(f"summary written to {json_out}")
    if per_request is not None:
        from kvsim.outputs import write_jsonl

        write_jsonl(per_request, per_request_rows(trace, runs))
        console.print(f"per-request results written to {per_request}")
    if html is not None:
        from kvsim.cli.report import html_report
        from kvsim.report import ReportOptions

        html_report(html, trace, logs, ReportOptions(sim=options, calibration=calib), runs=runs)


def _check_settings(names: list[str], options) -> None:
    """Resolve each policy's settings once, so bad values fail before the log is read."""
    if "apc" in names:
        from kvsim.replay.apc import apc_settings

        apc_settings(options)
    if "radix" in names:
        from kvsim.replay.radix import radix_settings

        radix_settings(options)
