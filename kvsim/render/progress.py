"""Progress bars on long work: one transient rich bar per task, on stderr.

Library code never imports rich; it reports through :mod:`kvsim.progress`, and the commands
install :class:`Bars` there (``kvsim.cli``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvsim.progress import UNITS


class Bars:
    """A rich ``Progress`` that shows nothing until its first task, and stops when closed.

    Starting late keeps a display thread from running while a process pool forks.
    """

    def __init__(self, unit: str = "count", only_on_terminal: bool = False) -> None:
        assert unit in UNITS
        self.unit = unit
        self.only_on_terminal = only_on_terminal
        self._bar: Any = None

    def _start(self) -> Any:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        console = Console(stderr=True)
        if self.only_on_terminal and not console.is_terminal:
            return None
        after = {"count": (MofNCompleteColumn(), TimeElapsedColumn()),
                 "percent": (TextColumn("{task.percentage:>3.0f}%"), TimeRemainingColumn()),
                 "bytes": (DownloadColumn(), TimeRemainingColumn())}[self.unit]
        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), *after, console=console,
                             transient=True)
        self._bar.__enter__()
        return self._bar

    def task(self, description: str, total: int) -> Callable[[int, int | None], None]:
        """A new bar; the returned ``update(done, total=None)`` sets how much is done."""
        bar = self._bar or self._start()
        if bar is None:
            return lambda done, total=None: None
        tid = bar.add_task(description, total=total)
        return lambda done, total=None: bar.update(tid, completed=done)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None

    def __enter__(self) -> "Bars":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
