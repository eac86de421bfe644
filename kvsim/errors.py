"""User-facing errors. The CLI prints them as one line and exits with code 2."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


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


def read_json_input(path: Path, what: str) -> Any:
    """The JSON value in the input file ``path``; InputError when the file is missing or
    is not readable JSON (``what`` names the expected file, e.g. "calibration JSON")."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(path, f"not a readable {what} ({e.__class__.__name__})") from None
