"""The Typer application object and the output consoles shared by all commands."""
from __future__ import annotations

import typer
from rich.console import Console

from kvsim import __version__

app = typer.Typer(
    name="kvsim",
    help="Prefix-cache workload analyzer and faithful vLLM APC / SGLang RadixAttention simulator.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
console = Console()
err_console = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        console.print(f"kvsim {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Prefix-cache workload analyzer and KV-cache simulator for LLM serving."""
