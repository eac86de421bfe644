"""``kvsim cache info|clear``: the persistent trace cache (see ``kvsim.io.trace.cache``)."""
from __future__ import annotations

import time
from pathlib import Path

import typer

from kvsim.cli.app import app, console

cache_app = typer.Typer(help="The trace cache: logs already read, stored as columnar traces.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


@cache_app.command("info")
def info() -> None:
    """Where the cache is, and what it holds (one row per stored trace)."""
    from rich.table import Table

    from kvsim.io.trace.cache import entries, traces_dir

    rows = entries()
    total = sum(e.bytes for e in rows)
    console.print(f"trace cache: {traces_dir()}  ({len(rows)} trace(s), {_size(total)})", highlight=False,
                  soft_wrap=True)
    if not rows:
        return
    table = Table(show_edge=False)
    for col, justify in (("log(s)", "left"), ("requests", "right"), ("prompt tokens", "right"),
                         ("size", "right"), ("last used", "right"), ("log now", "left")):
        table.add_column(col, justify=justify, overflow="fold")
    for e in rows:
        missing = [s for s in e.sources if not Path(s).exists()]
        table.add_row(", ".join(e.sources), f"{e.requests:,}", f"{e.prompt_tokens:,}", _size(e.bytes),
                      _ago(e.last_used_ns), "missing" if missing else "present")
    console.print(table)


@cache_app.command("clear")
def clear() -> None:
    """Remove every stored trace."""
    from kvsim.io.trace.cache import clear as clear_cache, traces_dir

    count, freed = clear_cache()
    console.print(f"removed {count} trace(s), {_size(freed)}, from {traces_dir()}", highlight=False, soft_wrap=True)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _ago(ns: int) -> str:
    s = max(0.0, time.time() - ns / 1e9)
    if s < 120:
        return f"{s:.0f} s ago"
    if s < 7200:
        return f"{s / 60:.0f} min ago"
    if s < 172800:
        return f"{s / 3600:.0f} h ago"
    return f"{s / 86400:.0f} days ago"
