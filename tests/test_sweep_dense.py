"""Dense exact replays (kvsim.sweep.dense): refined until neighbours are a step apart."""
from __future__ import annotations

import numpy as np

from kvsim.sweep.dense import dense_capacities, largest_step


def test_refines_until_every_step_is_small_and_keeps_the_extra_points():
    calls: list[list[float]] = []

    def replay(batch):
        calls.append(list(batch))
        return [1 - 1 / np.sqrt(c / 100) for c in batch]     # steep at first, flat later

    caps, rates = dense_capacities(replay, 1000, 1e6, start=8, step=0.01, max_points=500, extra=[4000])
    assert 4000.0 in caps and np.all(np.diff(caps) > 0)
    assert largest_step(rates) <= 0.01
    assert len(calls) > 1 and sum(map(len, calls)) == len(caps)     # each capacity replayed once
    assert np.allclose(rates, [1 - 1 / np.sqrt(c / 100) for c in caps])


def test_stops_at_the_budget_and_never_splits_below_the_quantum():
    caps, rates = dense_capacities(lambda b: [float(c > 5000) for c in b], 16, 1e5, start=6, step=0.01,
                                   max_points=30)
    assert len(caps) <= 30
    jump = np.flatnonzero(np.diff(rates) > 0)[0]
    assert caps[jump + 1] - caps[jump] <= 16            # the jump is pinned down to one quantum
    caps, _ = dense_capacities(lambda b: [float(c > 5000) for c in b], 16, 1e5, start=6, max_points=12)
    assert len(caps) == 12


def test_extra_points_outside_the_range_are_replayed_but_not_refined():
    caps, _ = dense_capacities(lambda b: [c / 1e5 for c in b], 10_000, 20_000, start=4, step=0.01, extra=[160])
    assert caps[0] == 160 and caps[1] >= 10_000 - 16
