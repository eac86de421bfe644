"""Options shared by several commands, defined once so their names and help agree."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

LogPaths = Annotated[
    list[Path],
    typer.Argument(help="Prompt log(s): JSONL (plain or .gz), Mooncake hash-id JSONL, ShareGPT, Azure CSV.",
                   show_default=False),
]
FormatOpt = Annotated[
    str,
    typer.Option("--format", "-f", help="Input format: auto, chat, completion, tokens, mooncake, sharegpt, "
                 "kvcache-tester, azure-csv.", rich_help_panel="Input"),
]
TokenizerOpt = Annotated[
    str,
    typer.Option("--tokenizer", help="cl100k_base (default), any tiktoken encoding, hf:PATH/tokenizer.json, or bytes.",
                 rich_help_panel="Input"),
]
TemplateOpt = Annotated[
    str,
    typer.Option("--chat-template", help="Chat template: llama3 (default), chatml, mistral, plain, or a Jinja file.",
                 rich_help_panel="Input"),
]
TraceBlockOpt = Annotated[
    int,
    typer.Option("--trace-block-size", help="Tokens per hash id in hash-id traces (Mooncake: 512).",
                 rich_help_panel="Input"),
]
OnErrorOpt = Annotated[
    str,
    typer.Option("--on-error", help="What to do with a bad input line: fail (exit 2) or skip (count and report).",
                 rich_help_panel="Input"),
]
LimitOpt = Annotated[
    Optional[int],
    typer.Option("--limit", help="Read at most this many requests.", rich_help_panel="Input", show_default=False),
]
ShowTextOpt = Annotated[
    bool,
    typer.Option("--show-text", help="Include raw prompt text in output (off by default: logs are sensitive)."),
]


def load_from_cli(
    paths: list[Path],
    fmt: str = "auto",
    tokenizer: str = "cl100k_base",
    chat_template: str = "llama3",
    trace_block_size: int = 512,
    on_error: str = "fail",
    limit: int | None = None,
):
    """Load a trace with the CLI's options and a progress bar.

    Says on stderr which tokenizer was used when it was a fallback, and how many bad
    lines ``--on-error skip`` skipped.
    """
    from kvsim.cli.app import err_console
    from kvsim.io.load import load_trace

    trace = load_trace(
        paths, format=fmt, tokenizer=tokenizer, chat_template=chat_template,
        trace_block_size=trace_block_size, on_error=on_error, limit=limit, progress=True,
    )
    for note in trace.meta.notes:
        if note.startswith("tokenizer:"):
            err_console.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
    if trace.meta.skipped_lines:
        per_file = ", ".join(f"{Path(s).name}: {k}" for s, k in zip(trace.meta.sources, trace.meta.source_skipped) if k)
        err_console.print(f"skipped {trace.meta.skipped_lines} bad line(s) ({per_file}) because of --on-error skip",
                          highlight=False, markup=False, soft_wrap=True)
    return trace
