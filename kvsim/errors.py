"""User-facing errors. The CLI prints them as one line and exits with code 2."""
from __future__ import annotations

from pathlib import Path


class KvsimError(Exception):
    """An error the user can fix (bad input, bad option); never shown as a traceback."""

    exit_code = 2


class InputError(KvsimError):
    """A problem in an input file, located by file and (when known) line number."""

    def __init__(self, path: str | Path, problem: str, line: int | None = None):
        self.path = str(path)
        self.line = line
        self.problem = problem
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {problem}")


class ConfigError(KvsimError):
    """An invalid option or combination of options."""
