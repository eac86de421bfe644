"""The step clock shared by both engine models (docs/engines/vllm-scheduler.md §1).

Steps are numbered by scheduler steps. A request whose arrival step is t is handed to the
engine before step t is scheduled; while the engine holds no work the clock jumps to the
next arrival. Requests that arrive at the same step are added in log order.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np


class SteppedEngine(Protocol):
    def add(self, index: int) -> None:
        """Hand request ``index`` to the engine (it may reject it)."""

    def has_work(self) -> bool:
        """Whether the engine loop would run now rather than wait for input."""

    def step(self, step: int) -> bool:
        """One turn of the engine loop; True if it took a scheduler step (numbered ``step``)."""

    def idle(self) -> None:
        """The engine loop's idle pass (it runs before the clock jumps ahead)."""


def run_steps(engine: SteppedEngine, arrival_steps: np.ndarray) -> int:
    """Drive ``engine`` until every request has arrived and finished; returns the final clock."""
    arrival = np.asarray(arrival_steps, np.int64)
    order = np.argsort(arrival, kind="stable").tolist()
    arrival_of = arrival.tolist()
    n, nxt, step = len(order), 0, 0
    while True:
        if not engine.has_work():
            engine.idle()
            if nxt == n:
                return step
            step = max(step, arrival_of[order[nxt]])
        while nxt < n and arrival_of[order[nxt]] <= step:
            engine.add(order[nxt])
            nxt += 1
        if engine.step(step):
            step += 1
