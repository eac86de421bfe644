"""vLLM APC's per-request arithmetic, in one place (docs/engines/apc.md).

The reference model, the compiled engine, the one-pass curves, the analyzer's bounds and
the GPU adapters all call these. Each function works on Python ints and on numpy arrays;
the compiled engine uses the ``*_jit`` copies, compiled by numba from the same source.
``L`` is a request's prompt length, ``M`` the tokens it generates (at least 1), ``B`` the
block size.
"""
from __future__ import annotations

import numpy as np


def lookup_cap_blocks(L, B):
    """Blocks a lookup may hit: ``(L - 1) // B``. At least one prompt token is recomputed to
    get logits, so a block-aligned prompt recomputes its whole last block (§2.2)."""
    return (L - 1) // B


def peak_blocks(L, M, B):
    """Blocks a request holds at its peak: ``ceil((L + M - 1) / B)``. The last sampled
    token is never computed, so it needs no slot (§4.1)."""
    return -(-(L + M - 1) // B)


def kept_blocks(L, M, B):
    """Full blocks a finished request leaves cached: ``floor((L + M - 1) / B)`` (§4.1)."""
    return (L + M - 1) // B


def block_openings(computed: int, k: int, B: int) -> int:
    """New blocks a decoding request takes over ``k`` steps from ``computed`` tokens: one
    each time the position it computes starts a block (§4.1)."""
    first = (-computed) % B
    return 0 if k <= first else 1 + (k - 1 - first) // B


def _fits_ever(peak):
    def fits_ever(L, M, B, num_gpu_blocks):
        """Whether a request can be scheduled at all, in an empty pool: a non-empty prompt
        whose peak fits the usable blocks (block 0 is the null block; §1 note)."""
        return (L > 0) & (peak(L, M, B) <= num_gpu_blocks - 1)
    return fits_ever


fits_ever = _fits_ever(peak_blocks)


def reads_cache(prompt_logprobs):
    """A request asking for prompt logprobs skips the lookup but still writes (§2.1)."""
    return ~np.asarray(prompt_logprobs, bool)


def capacity_tokens(num_gpu_blocks: int, B: int) -> int:
    """Usable KV tokens of a pool: ``(num_gpu_blocks - 1) * B`` (the null block excluded)."""
    return (num_gpu_blocks - 1) * B


def num_gpu_blocks_for_tokens(tokens: int, B: int) -> int:
    """The pool holding ``tokens`` usable tokens: ``floor(tokens / B) + 1`` (null block included)."""
    return tokens // B + 1


def unlimited_num_blocks(L: np.ndarray, M: np.ndarray, B: int) -> int:
    """A pool so large nothing is ever evicted: every block any request takes, plus the null block."""
    return int(np.where(L > 0, peak_blocks(L, M, B), 0).sum()) + 1


def __getattr__(name: str):
    """The ``*_jit`` copies, compiled (numba imported) on first use."""
    if name in ("lookup_cap_blocks_jit", "peak_blocks_jit", "kept_blocks_jit", "fits_ever_jit"):
        from kvsim.engines.vllm import rules_jit

        return getattr(rules_jit, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
