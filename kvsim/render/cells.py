"""One table cell from a value and a format pattern, shared by the command tables."""
from __future__ import annotations

from typing import Any


def cell(value: Any, pattern: str, missing: str = "-") -> str:
    """``pattern.format(value)``; ``missing`` for None or NaN; ``str(value)`` when the pattern does not fit."""
    if value is None or (isinstance(value, float) and value != value):
        return missing
    try:
        return pattern.format(value)
    except (ValueError, TypeError):
        return str(value)
