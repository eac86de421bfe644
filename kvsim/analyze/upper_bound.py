"""Upper bounds of reuse with an unlimited cache, derived from the per-request reuse ``r``.

- token granularity: ``r`` tokens of request i were computed before (a radix tree with
  page size 1 can reuse all of them);
- block size B, full blocks only (APC never caches a partial block): ``floor(r/B)*B``;
- the one-token-recompute rule: an engine must compute at least the last prompt token,
  so APC matches at most ``floor((L-1)/B)`` blocks (docs/engines/apc.md §2.2) and SGLang
  at most ``L-1`` tokens, paged ``floor((L-1)/p)*p`` (docs/engines/radix.md §2.1);
- hash-id traces at their own block size: whole ids, the partial last block counted at
  its real length when it has an id (Mooncake) - the convention of the trace's authors.

Token-weighted = hit tokens / prompt tokens; request-weighted = mean of per-request
shares (requests with an empty prompt left out).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from kvsim.engines.vllm.rules import lookup_cap_blocks


def hit_tokens(reuse: np.ndarray, lengths: np.ndarray, block: int = 1, recompute: bool = False) -> np.ndarray:
    """Per-request reusable tokens at a block size (1 = token granularity)."""
    if recompute:   # the engines' lookup cap (kvsim.engines.vllm.rules; radix: L - 1 at block 1)
        cap = np.maximum(lookup_cap_blocks(lengths, block), 0)
        return np.minimum(reuse // block, cap) * block
    return reuse // block * block


def shares(hits: np.ndarray, lengths: np.ndarray) -> tuple[float, float]:
    """(token-weighted, request-weighted) share of prompt tokens hit."""
    total = int(lengths.sum())
    token_w = float(hits.sum()) / total if total else 0.0
    nz = lengths > 0
    req_w = float(np.mean(hits[nz] / lengths[nz])) if nz.any() else 0.0
    return token_w, req_w


def bound_row(reuse: np.ndarray, lengths: np.ndarray, block: int) -> dict[str, Any]:
    """One row of the block-size table: plain and with the one-token-recompute cap."""
    plain = hit_tokens(reuse, lengths, block)
    capped = hit_tokens(reuse, lengths, block, recompute=True)
    tw, rw = shares(plain, lengths)
    tw_c, rw_c = shares(capped, lengths)
    return {"block_size": block, "hit_tokens": int(plain.sum()), "token_weighted": tw, "request_weighted": rw,
            "hit_tokens_recompute": int(capped.sum()), "token_weighted_recompute": tw_c,
            "request_weighted_recompute": rw_c}


def bound_change(changed: dict[str, Any], base: dict[str, Any], word: str) -> dict[str, Any]:
    """``changed`` (a headline bound, :func:`kvsim.analyze.core.bound_summary`) with how far
    it moved from ``base`` at token level and at APC block 16, as ``<level>_<word>_tokens``
    and ``<level>_<word>_points`` (``word``: "gain" for moved content, "cost" for isolation)."""
    out = dict(changed)
    for key in ("token", "block16"):
        out[f"{key}_{word}_tokens"] = changed[f"{key}_tokens"] - base[f"{key}_tokens"]
        out[f"{key}_{word}_points"] = 100.0 * (changed[key] - base[key])
    return out


def upper_bounds(reuse: np.ndarray, lengths: np.ndarray, block_sizes: tuple[int, ...]) -> dict[str, Any]:
    """Section 2: the token-level bound and the block-size sensitivity table."""
    token = bound_row(reuse, lengths, 1)
    blocks = [bound_row(reuse, lengths, b) for b in block_sizes]
    return {"prompt_tokens": int(lengths.sum()), "token": token, "blocks": blocks,
            "fully_reused_requests": int(((reuse == lengths) & (lengths > 0)).sum()),
            "requests_with_reuse": int((reuse > 0).sum())}


def native_hash_bound(reuse: np.ndarray, lengths: np.ndarray, block: int, tail_has_id: bool,
                      warmup: float = 0.5) -> dict[str, Any]:
    """A hash-id trace at its own block size, under the definitions papers use.

    Matched ids are prefix-contiguous. Token-weighted counts each matched id at its real
    length (a matched partial last block at its length); block-weighted counts ids;
    request-weighted averages per-request token shares; the warm-up variant counts only
    the requests after the first ``warmup`` share (the kvcache.ai simulator's convention).
    """
    full = reuse // block
    tail = lengths % block
    whole = (reuse == lengths) & (lengths > 0)
    # a partial last block with its own id is hit exactly when the whole prompt is
    tail_hit = whole & (tail > 0) & tail_has_id
    hits = full * block + np.where(tail_hit, tail, 0)
    ids_total = lengths // block + ((tail > 0) & tail_has_id)
    ids_hit = full + tail_hit
    tw, rw = shares(hits, lengths)
    start = int(len(lengths) * warmup)
    tw2, _ = shares(hits[start:], lengths[start:])
    ids2 = int(ids_total[start:].sum())
    return {
        "block_size": block, "tail_has_id": bool(tail_has_id),
        "token_weighted": tw, "request_weighted": rw,
        "block_weighted": float(ids_hit.sum() / ids_total.sum()) if ids_total.sum() else 0.0,
        "after_warmup_token_weighted": tw2,
        "after_warmup_block_weighted": float(ids_hit[start:].sum() / ids2) if ids2 else 0.0,
        "warmup_share": warmup, "hit_tokens": int(hits.sum()), "ids": int(ids_total.sum()),
        "ids_hit": int(ids_hit.sum()),
    }
