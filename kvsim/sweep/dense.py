"""Exact replays placed densely enough to draw a curve: start log-spaced, then add a replay
between every two neighbours whose hit rates differ by more than ``step``.

Used where no one-pass model tracks the engine within a point (SGLang's radix tree: it
evicts whole leaves and refreshes whole edges, ``docs/engines/radix.md §2``, ``§5.2``). Where the
hit rate grows with capacity between two replays, the straight line joining them is within
their difference of the truth, so once every step is at most ``step`` the joined replays
are within ``step`` everywhere in between (``scripts/radix_curve_error.py`` measures it).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def dense_capacities(replay: Callable[[Sequence[float]], Sequence[float]], lo: float, hi: float,
                     start: int = 16, step: float = 0.01, max_points: int = 64,
                     extra: Sequence[float] = (), quantum: float = 16.0) -> tuple[np.ndarray, np.ndarray]:
    """``(capacities, hit rates)``: exact replays from ``lo`` to ``hi`` tokens, refined until
    neighbours differ by at most ``step`` or ``max_points`` replays ran.

    ``replay(capacities) -> hit rates`` runs a batch (in parallel if it likes); capacities are
    rounded to ``quantum`` tokens, and a gap narrower than ``quantum`` is never split. ``extra``
    capacities are replayed too, but only gaps inside ``[lo, hi]`` are refined.
    """
    def rounded(values) -> set[float]:
        return {float(max(quantum, round(v / quantum) * quantum)) for v in values}

    done: dict[float, float] = {}
    todo = sorted(rounded(np.geomspace(lo, hi, max(2, start))) | rounded(extra))
    while todo and len(done) < max_points:
        todo = todo[: max_points - len(done)]
        for cap, rate in zip(todo, replay(todo)):
            done[cap] = float(rate)
        caps = sorted(done)
        rates = [done[c] for c in caps]
        gaps = [(abs(rates[i + 1] - rates[i]), i) for i in range(len(caps) - 1)
                if abs(rates[i + 1] - rates[i]) > step and caps[i + 1] - caps[i] > quantum
                and caps[i] >= lo - quantum and caps[i + 1] <= hi + quantum]
        gaps.sort(reverse=True)                     # widest steps first, if the budget runs out
        todo = sorted(rounded(np.sqrt(caps[i] * caps[i + 1]) for _, i in gaps) - set(done))
    caps = np.array(sorted(done))
    return caps, np.array([done[c] for c in caps])


def largest_step(rates: np.ndarray) -> float:
    """The largest difference between neighbouring replays (the joined line's resolution)."""
    return float(np.abs(np.diff(rates)).max()) if len(rates) > 1 else 0.0
