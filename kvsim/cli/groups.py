"""Option groups: options several commands share, declared once and added to each command whole.

A :class:`Group` is a set of options (name -> (annotation, default)) and a function that turns
their values into one object. ``@with_groups(INPUT, CAPACITY)`` appends the groups' options to a
command's signature (so Typer offers them, with one name, help and default everywhere) and
passes the command one keyword argument per group, named after it, holding that object.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Group:
    """Options that travel together; ``build(**values)`` makes what the command receives."""

    name: str
    options: dict[str, tuple[Any, Any]]          # parameter name -> (Annotated type, default)
    build: Callable[..., Any] = dict

    def but(self, **changes: tuple[Any, Any] | None) -> "Group":
        """The same group with some options replaced (a new annotation or default) or dropped (None)."""
        options = dict(self.options)
        for name, value in changes.items():
            if value is None:
                options.pop(name)
            else:
                options[name] = value
        return Group(self.name, options, self.build)


def with_groups(*groups: Group) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the groups' options to a command; it receives one object per group."""
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(command, eval_str=True)
        params = [p for p in own.parameters.values() if p.name not in {g.name for g in groups}]
        for group in groups:
            for name, (annotation, default) in group.options.items():
                params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                                annotation=annotation))

        @functools.wraps(command)
        def run(**values: Any) -> Any:
            for group in groups:
                values[group.name] = group.build(**{name: values.pop(name) for name in group.options})
            return command(**values)

        run.__signature__ = own.replace(parameters=params)
        run.__annotations__ = {p.name: p.annotation for p in params}
        del run.__wrapped__        # Typer reads the signature above, not the command's own
        return run
    return decorate
