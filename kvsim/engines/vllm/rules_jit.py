"""numba copies of :mod:`kvsim.engines.vllm.rules` for the compiled engine, compiled from the
same source (kept apart so that the rules import without numba)."""
from __future__ import annotations

from kvsim.engines.vllm.rules import _fits_ever, kept_blocks, lookup_cap_blocks, peak_blocks
from kvsim.kernels.jit import njit

lookup_cap_blocks_jit = njit(cache=True, inline="always")(lookup_cap_blocks)
peak_blocks_jit = njit(cache=True, inline="always")(peak_blocks)
kept_blocks_jit = njit(cache=True, inline="always")(kept_blocks)
fits_ever_jit = njit(cache=True, inline="always")(_fits_ever(peak_blocks_jit))
