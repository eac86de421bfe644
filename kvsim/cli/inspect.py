"""``kvsim inspect``: what was read from each log, and optionally export it pre-tokenized."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvsim.cli.app import app, console
from kvsim.cli.options import INPUT_DEFAULT
from kvsim.cli.options import (FormatOpt, LimitOpt, LogPaths, OnErrorOpt, TemplateOpt, TokenizerOpt,
                               TraceBlockOpt, load_from_cli)


@app.command()
def inspect(
    logs: LogPaths,
    fmt: FormatOpt = INPUT_DEFAULT["format"],
    tokenizer: TokenizerOpt = INPUT_DEFAULT["tokenizer"],
    chat_template: TemplateOpt = INPUT_DEFAULT["chat_template"],
    trace_block_size: TraceBlockOpt = INPUT_DEFAULT["trace_block_size"],
    on_error: OnErrorOpt = INPUT_DEFAULT["on_error"],
    limit: LimitOpt = None,
    export: Annotated[Optional[Path], typer.Option(
        "--export", help="Write the trace as pre-tokenized JSONL (.jsonl or .jsonl.gz): token ids, "
        "lengths, ids; no text.", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite the --export file if it exists.")] = False,
) -> None:
    """Show what was read from each log: format, requests, tokens, sessions, tenants, adapters."""
    from kvsim.io.export import write_tokens_jsonl
    from kvsim.outputs import check_output_path
    from kvsim.render.inspect import summary_table

    if export is not None:  # fail before reading anything
        check_output_path(export, logs, force)
    trace = load_from_cli(logs, fmt, tokenizer, chat_template, trace_block_size, on_error, limit)
    console.print(summary_table(trace))
    if export is not None:
        n = write_tokens_jsonl(trace, export)
        console.print(f"wrote {n:,} requests to {export}")
