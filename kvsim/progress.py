"""Progress on long work: library code reports through this small protocol, and only the
commands decide how it is drawn.

A library function asks :func:`bars` for a :class:`Tasks` and calls ``task(description,
total)`` for an ``update(done)`` callback per pass. Without a drawer installed (a library
user, a test) every update is dropped; ``kvsim.cli`` installs the terminal's rich bars
(:class:`kvsim.render.progress.Bars`) before a command runs.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

#: what a bar shows after it: done/total, a percentage, or bytes read
UNITS = ("count", "percent", "bytes")


class Tasks(Protocol):
    """One display of progress bars."""

    def task(self, description: str, total: int) -> Callable[..., None]:
        """A new bar; the returned ``update(done)`` sets how much of ``total`` is done."""


class _Silent:
    def task(self, description: str, total: int) -> Callable[..., None]:
        return lambda done, total=None: None


_drawer: Callable[..., Any] | None = None


def install(drawer: Callable[..., Any] | None) -> None:
    """Draw progress with ``drawer(unit, only_on_terminal=...)``, a context manager giving
    :class:`Tasks` (None: draw nothing)."""
    global _drawer
    _drawer = drawer


@contextmanager
def bars(unit: str = "count", only_on_terminal: bool = False) -> Iterator[Tasks]:
    """The installed display for one piece of work, closed when it ends."""
    assert unit in UNITS
    if _drawer is None:
        yield _Silent()
        return
    with _drawer(unit, only_on_terminal=only_on_terminal) as shown:
        yield shown
