"""``--router-option KEY=VALUE`` pairs parsed into a router's frozen settings dataclass.

A router's options are the fields of its ``Settings`` dataclass, named as the real router
names them and defaulting to its release's defaults. Values are parsed by the field's type
(int, float, bool, str); a field's ``metadata["choices"]`` limits a string. An option the
router does not have (e.g. one of another router) is a one-line ``ConfigError`` that lists
the router's options.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from kvsim.errors import ConfigError

T = TypeVar("T")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def choice(default: str, *choices: str) -> Any:
    """A string option limited to ``choices`` (the default first)."""
    return dataclasses.field(default=default, metadata={"choices": (default, *choices)})


def _parse(router: str, key: str, kind: Any, text: str) -> Any:
    try:
        if kind is bool:
            low = text.strip().lower()
            if low in _TRUE or low in _FALSE:
                return low in _TRUE
            raise ValueError(text)
        if kind is int:
            return int(text)
        if kind is float:
            value = float(text)
            if not math.isfinite(value):
                raise ValueError(text)
            return value
        return str(text)
    except ValueError:
        raise ConfigError(f"router {router}: option {key}={text!r} is not a valid "
                          f"{getattr(kind, '__name__', kind)}") from None


def parse_settings(router: str, settings: type[T], options: Mapping[str, str]) -> T:
    """Build ``settings`` from ``options`` (strings), raising ``ConfigError`` on an unknown key or bad value."""
    fields = {f.name: f for f in dataclasses.fields(settings)}  # type: ignore[arg-type]
    hints = typing.get_type_hints(settings)
    values: dict[str, Any] = {}
    for key, text in options.items():
        if key not in fields:
            names = ", ".join(fields) or "none"
            raise ConfigError(f"router {router} has no option {key!r}; its options: {names}")
        value = _parse(router, key, hints[key], text)
        allowed = fields[key].metadata.get("choices")
        if allowed and value not in allowed:
            raise ConfigError(f"router {router}: option {key}={text!r} must be one of {', '.join(allowed)}")
        values[key] = value
    try:
        return settings(**values)
    except ValueError as err:
        raise ConfigError(f"router {router}: {err}") from None


def check(condition: bool, message: str) -> None:
    """Raise ``ValueError(message)`` (reported as a ConfigError by ``parse_settings``) unless ``condition``."""
    if not condition:
        raise ValueError(message)
