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
#: settings of the current invocation given before the command (``kvsim --no-trace-cache ...``)
session = {"trace_cache": True}


def _version(value: bool) -> None:
    if value:
        console.print(f"kvsim {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
    no_trace_cache: bool = typer.Option(False, "--no-trace-cache",
                                        help="Read logs afresh: neither use nor store the trace cache "
                                             "(see kvsim cache info)."),
    engine_plugin: list[str] = typer.Option([], "--engine-plugin", metavar="MODULE:CLASS",
                                            help="Register an extra engine (an EngineSpec class; module or "
                                                 "file.py path), usable as --policy NAME (docs/engines/plugins.md)."),
) -> None:
    """Prefix-cache workload analyzer and KV-cache simulator for LLM serving."""
    from kvsim.io.trace.cache import enabled_by_default

    if engine_plugin:
        from kvsim.engines.registry import load_plugin

        for path in engine_plugin:
            load_plugin(path)

    session["trace_cache"] = enabled_by_default() and not no_trace_cache
