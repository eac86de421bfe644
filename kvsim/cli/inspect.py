"""``kvsim inspect``: what was read from each log, and optionally export it pre-tokenized."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvsim.cli.options import INPUT, LogInput, with_groups
from kvsim.cli.app import app, console
from kvsim.cli.options import LogPaths


@app.command()
@with_groups(INPUT)
def inspect(
    logs: LogPaths,
    export: Annotated[Optional[Path], typer.Option(
        "--export", help="Write the trace as pre-tokenized JSONL (.jsonl or .jsonl.gz): token ids, "
        "lengths, ids; no text.", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="Overwrite the --export file if it exists.")] = False,
    log_input: LogInput = None,
) -> None:
    """Show what was read from each log: format, requests, tokens, sessions, tenants, adapters."""
    from kvsim.io.export import write_tokens_jsonl
    from kvsim.outputs import check_output_path
    from kvsim.render.inspect import summary_table

    if export is not None:  # fail before reading anything
        check_output_path(export, logs, force)
    trace = log_input.load(logs)
    console.print(summary_table(trace))
    if export is not None:
        n = write_tokens_jsonl(trace, export)
        console.print(f"wrote {n:,} requests to {export}")
