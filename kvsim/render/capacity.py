"""`kvsim capacity` in the terminal: KV bytes per token and each engine's capacity."""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def render_capacity(console: Console, report: dict[str, Any]) -> None:
    """One row per figure, with the note that says how it was obtained."""
    table = Table(title=f"KV capacity: {report['model']}" + (f" on {report['gpu']}" if report["gpu"] else ""),
                  title_justify="left")
    table.add_column("")
    table.add_column("value", justify="right")
    table.add_column("", style="dim")
    for label, value, note in report["rows"]:
        table.add_row(label, value, note)
    console.print(table)
