"""``kvsim convert``: write logs as one trace file (Parquet, or pre-tokenized JSONL)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvsim.cli.options import INPUT, LogInput, with_groups
from kvsim.cli.app import app, console
from kvsim.cli.options import LogPaths


@app.command()
@with_groups(INPUT)
def convert(
    logs: LogPaths,
    output: Annotated[Path, typer.Option(
        "--output", "-o", help="trace.parquet (one row per request), or .jsonl / .jsonl.gz (the tokens "
        "format). Token ids, lengths, names and ids; no text.", show_default=False)],
    force: Annotated[bool, typer.Option("--force", help="Overwrite the output file if it exists.")] = False,
    log_input: LogInput = None,
) -> None:
    """Read logs and write them as one trace: Parquet for pandas, DuckDB or Spark, read back by
    every kvsim command.

    Example: [bold]kvsim convert logs/*.jsonl.gz -o trace.parquet[/]
    """
    from kvsim.errors import ConfigError
    from kvsim.outputs import check_output_path

    name = output.name.lower()
    parquet = name.endswith(".parquet")
    if not parquet and not name.endswith((".jsonl", ".jsonl.gz")):
        raise ConfigError(f"--output {output}: use a .parquet, .jsonl or .jsonl.gz file name")
    if parquet:
        from kvsim.io.trace.parquet import pyarrow

        pyarrow()  # fail before reading a large log
    check_output_path(output, logs, force)
    trace = log_input.load(logs)
    if parquet:
        from kvsim.io.trace.parquet import write_parquet

        n = write_parquet(trace, output)
    else:
        from kvsim.io.export import write_tokens_jsonl

        n = write_tokens_jsonl(trace, output)
    console.print(f"wrote {n:,} requests ({trace.num_prompt_tokens:,} prompt tokens) to {output}", highlight=False)
