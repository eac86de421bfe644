"""One percentile of a 1-D float array, exactly as ``np.percentile`` computes it by default.

numpy 2's ``percentile`` imports its masked-array module (``numpy.ma``, about 8 ms) on its
first call, for one ``np.ma.is_masked`` check; a timed command's summary needs only a few
percentiles of its latencies. :func:`percentile` computes numpy's default (``method="linear"``)
with numpy's own steps: the virtual index ``(n - 1) * q``, its floor, and numpy's
interpolation (``_lerp``, which counts back from the upper value when the weight is at
least one half). ``tests/test_percentiles.py`` holds the two equal bit for bit.
"""
from __future__ import annotations

import math

import numpy as np


def percentile(values, p: float) -> float:
    """``float(np.percentile(values, p))``; a NaN among ``values`` gives NaN, as numpy's does."""
    v = np.asarray(values)
    if v.ndim != 1 or v.dtype != np.float64 or not len(v) or not 0 <= p <= 100:
        return float(np.percentile(v, p))       # (any other input: numpy's own)
    v = np.sort(v)                              # NaN sorts last
    if math.isnan(v[-1]):
        return math.nan
    n = len(v)
    index = (n - 1) * (p / 100)
    if index >= n - 1:                          # numpy takes the last value, its lower index -1
        lower, upper, below = n - 1, n - 1, -1
    else:
        lower = math.floor(index)
        upper, below = lower + 1, lower
    weight = index - below
    a, b = float(v[lower]), float(v[upper])
    diff = b - a
    return b - diff * (1 - weight) if weight >= 0.5 else a + diff * weight
