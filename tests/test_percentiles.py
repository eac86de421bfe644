"""kvsim's percentile (no numpy.ma import) equals np.percentile's default bit for bit."""
import math
import subprocess
import sys

import numpy as np
import pytest

from kvsim.drive.percentiles import percentile

PS = (0, 1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9, 100)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a.hex() == b.hex()


@pytest.mark.parametrize("seed", range(4))
def test_percentile_is_numpys_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    for trial in range(400):
        n = int(rng.integers(1, 200))
        v = [rng.exponential(1.0, n), rng.integers(0, 5, n).astype(float), rng.normal(0, 1e6, n),
             np.round(rng.uniform(0, 10, n), 3)][trial % 4]
        if trial % 40 == 0:
            v[int(rng.integers(0, n))] = np.nan
        for p in (*PS, float(rng.uniform(0, 100))):
            assert _same(percentile(v, p), float(np.percentile(v, p))), (v, p)


def test_other_inputs_are_numpys():
    assert percentile(np.arange(10), 35) == float(np.percentile(np.arange(10), 35))      # ints
    assert percentile([1.5, 2.5], 50) == 2.0                                               # a list
    with np.errstate(invalid="ignore"):     # (inf - inf in numpy's interpolation)
        assert _same(percentile(np.array([np.inf, 1.0]), 100), float(np.percentile([np.inf, 1.0], 100)))
    with pytest.raises(ValueError):
        percentile(np.array([1.0]), 101)


def test_it_does_not_import_numpy_ma():
    code = ("import sys, numpy as np; from kvsim.drive.percentiles import percentile; "
            "percentile(np.arange(9.0), 90); print('numpy.ma' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
