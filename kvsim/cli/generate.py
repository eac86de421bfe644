"""``kvsim generate``: write a deterministic synthetic workload as JSONL."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvsim.cli.app import app, console
from kvsim.errors import ConfigError

_SIZE = "Size"
_SHAPE = "Scenario"
_OUT = "Output"


@app.command("generate")
def generate_cmd(
    scenario: Annotated[str | None, typer.Argument(
        help="Scenario to generate, or 'list' to show them.", show_default=False)] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", "-o", help="Where to write the JSONL (.gz compresses).", rich_help_panel=_OUT,
        show_default=False)] = None,
    seed: Annotated[int, typer.Option(help="Random seed: same seed and flags, same bytes.")] = 0,
    requests: Annotated[int | None, typer.Option(
        help="Number of requests.", rich_help_panel=_SIZE, show_default=False)] = None,
    sessions: Annotated[int | None, typer.Option(
        help="Conversations (support_chat).", rich_help_panel=_SIZE, show_default=False)] = None,
    turns: Annotated[int | None, typer.Option(
        help="Mean turns per conversation (each has N/2 to 3N/2).", rich_help_panel=_SIZE,
        show_default=False)] = None,
    tenants: Annotated[int | None, typer.Option(
        help="Tenants, each with its own cache_salt (multi_tenant).", rich_help_panel=_SIZE,
        show_default=False)] = None,
    adapters: Annotated[int | None, typer.Option(
        help="LoRA adapters, one per team (multi_lora).", rich_help_panel=_SIZE,
        show_default=False)] = None,
    rate: Annotated[float | None, typer.Option(
        help="Mean arrival rate, requests per second.", rich_help_panel=_SIZE,
        show_default=False)] = None,
    system_tokens: Annotated[int | None, typer.Option(
        help="Approximate tokens of the shared system prompt.", rich_help_panel=_SHAPE,
        show_default=False)] = None,
    doc_tokens: Annotated[int | None, typer.Option(
        help="Approximate tokens per retrieved document (rag).", rich_help_panel=_SHAPE,
        show_default=False)] = None,
    popular_last: Annotated[bool, typer.Option(
        "--popular-last", help="rag: put the popular document after the varying ones.",
        rich_help_panel=_SHAPE)] = False,
    mix: Annotated[str | None, typer.Option(
        help="mixture: scenario=weight,... (default code_review=0.25,support_chat=0.3,rag=0.2,"
             "multi_tenant=0.15,multi_lora=0.1).", rich_help_panel=_SHAPE, show_default=False)] = None,
    burstiness: Annotated[float | None, typer.Option(
        help="mixture: burst rate / quiet rate (default 5).", rich_help_panel=_SHAPE,
        show_default=False)] = None,
    model: Annotated[str | None, typer.Option(
        help="Model name written in each request (default meta-llama/Meta-Llama-3-8B-Instruct).",
        rich_help_panel=_SHAPE, show_default=False)] = None,
    fmt: Annotated[str, typer.Option(
        "--format", help="chat (OpenAI chat request log) or tokens (pre-tokenized).",
        rich_help_panel=_OUT)] = "chat",
    tokenizer: Annotated[str, typer.Option(
        help="Tokenizer that counts output_length and, with --format tokens, encodes prompts: "
             "cl100k_base, a tiktoken encoding, hf:PATH, bytes.",
        rich_help_panel=_OUT)] = "cl100k_base",
    chat_template: Annotated[str, typer.Option(
        "--chat-template", help="Chat template of the server (its end-of-turn token counts in "
        "output_length): llama3, chatml, mistral, plain, or a file.", rich_help_panel=_OUT)] = "llama3",
    force: Annotated[bool, typer.Option("--force", help="Overwrite an existing output file.",
                                        rich_help_panel=_OUT)] = False,
    list_: Annotated[bool, typer.Option("--list", help="List the scenarios and exit.")] = False,
) -> None:
    """Write a deterministic synthetic workload (chat request log or pre-tokenized JSONL).

    Example: [bold]kvsim generate support_chat -o chat.jsonl --sessions 20 --turns 5[/]
    """
    from kvsim.workloads import generate, scenarios, write_requests

    if list_ or scenario == "list" or scenario is None:
        if scenario is None and not list_:
            raise ConfigError("name a scenario (kvsim generate --list shows them)")
        for s in scenarios().values():
            console.print(f"[bold]{s.name:<16}[/] {s.summary}", highlight=False)
        return
    if output is None:
        raise ConfigError("missing -o/--output PATH")
    if fmt not in ("chat", "tokens"):
        raise ConfigError(f"--format must be chat or tokens, not {fmt!r}")
    if output.exists() and not force:  # fail before the work, not after
        raise ConfigError(f"{output} already exists; pass --force to overwrite it")
    reqs = generate(scenario, seed=seed, requests=requests, sessions=sessions, turns=turns,
                    tenants=tenants, adapters=adapters, rate=rate, system_tokens=system_tokens,
                    doc_tokens=doc_tokens, popular_last=popular_last or None, mix=mix,
                    burstiness=burstiness, model=model)
    summary = write_requests(reqs, output, fmt=fmt, tokenizer=tokenizer,
                             chat_template=chat_template, force=force)
    how = f"{fmt} format, {summary.tokenizer} + {summary.chat_template}"
    span = reqs[-1].timestamp if reqs else 0.0
    console.print(f"wrote {summary.requests} requests to {output} ({how}, "
                  f"{summary.bytes / 1024:.0f} KiB; {scenario}, seed {seed}, {span:.0f} s of arrivals)",
                  highlight=False, soft_wrap=True)
