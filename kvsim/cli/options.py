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
    """Load a trace with the CLI's options and a progress bar."""
    from kvsim.io.load import load_trace

    return load_trace(
        paths, format=fmt, tokenizer=tokenizer, chat_template=chat_template,
        trace_block_size=trace_block_size, on_error=on_error, limit=limit, progress=True,
    )
