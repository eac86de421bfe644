"""Progress of a long step replay: how many requests have finished, reported as it runs."""
from __future__ import annotations

from collections.abc import Callable

EVERY = 256     # steps between two reports


class Watched:
    """A stepped engine (``clock.SteppedEngine``) that calls ``update(finished, total)`` now and then.

    Everything else is the wrapped engine's: the clock sees the same engine, step for step.
    """

    def __init__(self, engine, update: Callable[[int, int], object]) -> None:
        object.__setattr__(self, "_engine", engine)
        object.__setattr__(self, "_update", update)
        object.__setattr__(self, "_steps", 0)
        object.__setattr__(self, "_total", len(engine.result.rejected))

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def __setattr__(self, name: str, value) -> None:       # the clock sets on_batch on the engine
        setattr(self._engine, name, value)

    def _tick(self, steps: int) -> None:
        n = self._steps + steps
        object.__setattr__(self, "_steps", n)
        if n // EVERY != (n - steps) // EVERY:
            self._update(len(self._engine.result.finished), self._total)

    def step(self, step: int) -> bool:
        took = self._engine.step(step)
        self._tick(1)
        return took

    def idle(self) -> None:
        self._engine.idle()
        self._update(len(self._engine.result.finished), self._total)
