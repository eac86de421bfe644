"""`kvsim serve`: an OpenAI-compatible endpoint whose usage reports the cache model's cached_tokens."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvsim.cli.app import app, console
from kvsim.cli.options import ENGINE, EngineOptions, with_groups
from kvsim.cli.replay_options import SCHEDULER
from kvsim.cli.options import INPUT_DEFAULT
from kvsim.cli.replay_options import CalibrationOpt, ServeReplayOpt, replay_mode
from kvsim.cli.options import TemplateOpt, TokenizerOpt

_SRV = "Server"
_REC = "Record and proxy"
_RAD = "SGLang radix settings"
_ENG = "Engine settings"


@app.command()
@with_groups(SCHEDULER, ENGINE)
def serve(
    policy: Annotated[str, typer.Option("--policy", "-p", help="apc (vLLM APC) or radix (SGLang RadixAttention).")]
    = "apc",
    replay: ServeReplayOpt = "sequential",
    calibration: CalibrationOpt = None,
    implementation: Annotated[str, typer.Option(
        "--implementation", help="fast (default: simulate's engines, the same answers sooner) or reference "
        "(the readable models, step by step).", rich_help_panel=_ENG)] = "fast",
    finish: Annotated[str, typer.Option("--finish", help="How synthetic replies end: length (at max_tokens) or "
                                        "stop (with the template's end-of-turn token).")] = "length",
    tokenizer: TokenizerOpt = INPUT_DEFAULT["tokenizer"],
    chat_template: TemplateOpt = INPUT_DEFAULT["chat_template"],
    host: Annotated[str, typer.Option("--host", help="Address to listen on (loopback only by default).",
                                      rich_help_panel=_SRV)] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port (0: any free port, printed at start).",
                                      rich_help_panel=_SRV)] = 8000,
    served_model_name: Annotated[Optional[str], typer.Option(
        "--served-model-name", help="The base model's name in requests and /v1/models; other names get 404, as "
        "vLLM (default: any name is answered, as SGLang, and /v1/models lists the tokenizer).",
        rich_help_panel=_SRV, show_default=False)] = None,
    lora_modules: Annotated[Optional[list[str]], typer.Option(
        "--lora-modules", help="LoRA adapters served by name, NAME=PATH (repeat or space-separate), as vLLM's.",
        rich_help_panel=_SRV, show_default=False)] = None,
    max_model_len: Annotated[Optional[int], typer.Option(
        "--max-model-len", help="Context length: prompt + max_tokens (default 32768, less if the cache is "
        "smaller).", rich_help_panel=_SRV, show_default=False)] = None,
    default_max_tokens: Annotated[int, typer.Option(
        "--default-max-tokens", help="Reply length of a chat request without max_tokens (0: vLLM's, the "
        "rest of the context).", rich_help_panel=_SRV)] = 256,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the synthetic replies.", rich_help_panel=_SRV)] = 0,
    api_key: Annotated[Optional[str], typer.Option(
        "--api-key", envvar="KVSIM_API_KEY", help="Require Authorization: Bearer KEY on every route but /health.",
        rich_help_panel=_SRV, show_default=False)] = None,
    max_body_bytes: Annotated[int, typer.Option("--max-body-bytes", help="Larger request bodies get 413.",
                                                rich_help_panel=_SRV)] = 16 * 1024 * 1024,
    record: Annotated[Optional[Path], typer.Option(
        "--record", help="Append every request to this JSONL log (token ids, no text), readable by "
        "simulate/analyze/report.", rich_help_panel=_REC, show_default=False)] = None,
    record_text: Annotated[bool, typer.Option("--record-text", help="Also keep messages, prompts and replies "
                                              "in the record.", rich_help_panel=_REC)] = False,
    upstream: Annotated[Optional[str], typer.Option(
        "--upstream", help="Proxy mode: forward to this OpenAI-compatible server and record its cached_tokens "
        "beside kvsim's prediction.", rich_help_panel=_REC, show_default=False)] = None,
    upstream_api_key: Annotated[Optional[str], typer.Option(
        "--upstream-api-key", envvar="KVSIM_UPSTREAM_API_KEY", help="Authorization sent to the upstream "
        "(default: the client's, unchanged).", rich_help_panel=_REC, show_default=False)] = None,
    upstream_timeout: Annotated[float, typer.Option("--upstream-timeout", help="Seconds to wait for the upstream.",
                                                    rich_help_panel=_REC)] = 600.0,
    scheduler: dict = None,
    engine: EngineOptions = None,
) -> None:
    """Serve an OpenAI-compatible API whose usage.prompt_tokens_details.cached_tokens is the cache model's.

    Point an [bold]openai[/] client at http://HOST:PORT/v1: chat and completion requests
    (streaming too) get deterministic synthetic replies, and each response reports the
    prompt tokens the chosen cache model (vLLM APC or SGLang radix, the same model as
    [bold]kvsim simulate[/]) serves from its cache at that point of the request stream.
    Requests are applied one at a time in arrival order; with [bold]--replay timed[/] they go
    through the engine's scheduler model in wall-clock time instead (shared batches, queueing,
    preemption) and each reply takes its modelled time. [bold]--record[/] writes a log that
    [bold]kvsim simulate[/] replays to the same numbers; [bold]--upstream[/] forwards to a
    real server instead and records its cached_tokens beside kvsim's prediction
    ([bold]kvsim report RECORD.jsonl --agreement[/] compares them). Metrics at /metrics use the
    engine's own names.
    """
    from kvsim.errors import ConfigError
    from kvsim.serve.config import ServeConfig, parse_lora_modules
    from kvsim.serve.server import serve as run_server

    if replay not in ("sequential", "timed"):
        raise ConfigError(f"unknown --replay {replay!r} for serve; choose sequential or timed")
    if calibration is not None and replay == "sequential":
        raise ConfigError("--calibration needs --replay timed")
    mode = replay_mode(replay, None, None, "logged", 1.0, calibration, **scheduler)
    options = engine.sim_options()
    config = ServeConfig(
        policy=policy, implementation=implementation, options=options, tokenizer=tokenizer, chat_template=chat_template,
        served_model_name=served_model_name, lora_modules=parse_lora_modules(lora_modules),
        max_model_len=max_model_len, default_max_tokens=default_max_tokens or None, finish=finish, seed=seed,
        host=host, port=port, api_key=api_key, max_body_bytes=max_body_bytes, record=record,
        record_text=record_text, upstream=upstream, upstream_api_key=upstream_api_key,
        upstream_timeout=upstream_timeout, replay_mode=mode)
    run_server(config, announce=lambda line: console.print(line, highlight=False, markup=False, soft_wrap=True))
