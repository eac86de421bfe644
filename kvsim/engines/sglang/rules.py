"""SGLang RadixAttention's per-request arithmetic, in one place (docs/engines/radix.md).

The reference model, the fast engine, the one-pass curves and the GPU adapters all call
these; the tree itself (match, split, insert, lock, evict) is :mod:`kvsim.engines.sglang.tree`.
Functions taking lengths accept Python ints; those marked so also take numpy arrays.
"""
from __future__ import annotations

from typing import Hashable

import numpy as np

CLIP_MAX_NEW_TOKENS = 4096          # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION (§7.2)
REFRESH_INTERVAL = 32               # WAITING_PREFIX_REFRESH_INTERVAL (§5.4)
UNCAPPED_MAX_NEW = 1 << 30          # an OpenAI request without max_tokens


def namespace(lora: str | None, cache_salt: str | None) -> Hashable:
    """SGLang's cache namespace: ``extra_key`` (LoRA id appended) and ``cache_salt`` (§1)."""
    salt = cache_salt or None
    if lora is None and salt is None:
        return None
    return (lora, salt)


# -- pages -----------------------------------------------------------------------------

def ceil_page(x, p: int):
    """``x`` rounded up to whole pages (ints or arrays)."""
    return -(-x // p) * p


def floor_page(x, p: int):
    """``x`` rounded down to whole pages: what a key or a match keeps (ints or arrays; §1)."""
    return x - x % p


# -- match (§2.1) ----------------------------------------------------------------------

def max_prefix_len(prompt_len: int, logprob_start_len: int = -1) -> int:
    """Req._compute_max_prefix_len: at most ``len - 1`` tokens are matched, so that one is
    computed for the logits; a logprob request at most its ``logprob_start_len`` (§2.1).

    -1 means no start: no logprobs, or logprobs of the output only (the scheduler then
    sets the start to ``len``, which adds no limit).
    """
    limit = prompt_len - 1
    if logprob_start_len >= 0:
        limit = min(limit, logprob_start_len)
    return max(limit, 0)


def max_prefix_lens(prompt_len: np.ndarray, logprob_start_len: np.ndarray) -> np.ndarray:
    """:func:`max_prefix_len` of every request (arrays)."""
    limit = np.where(logprob_start_len >= 0, np.minimum(prompt_len - 1, logprob_start_len), prompt_len - 1)
    return np.maximum(limit, 0)


def match_capped(prompt_len: np.ndarray, logprob_start_len: np.ndarray) -> np.ndarray:
    """Requests whose logprob start cuts the match below ``len - 1`` (arrays; 0 skips the read)."""
    return (logprob_start_len >= 0) & (logprob_start_len < np.maximum(prompt_len - 1, 0))


def logprob_aborts(prompt_len: int, logprob_start_len: int) -> bool:
    """Scheduler.handle_generate_request refuses a start past the prompt's end (HTTP 400);
    the request still runs as the one-token prompt ``[0]`` (``set_finish_with_abort``)
    and finishes at its first sampled token."""
    return logprob_start_len > prompt_len


# -- admission (§7.2) ------------------------------------------------------------------

def max_new_tokens_for_memory(prompt_len: int, wanted: int, capacity: int | None, p: int) -> int:
    """Scheduler.init_req_max_new_tokens: generation clipped to the empty pool."""
    if capacity is None:
        return wanted
    return max(0, min(wanted, capacity - ceil_page(prompt_len, p) - p - 1))


def max_new_tokens_for_memory_all(prompt_len: np.ndarray, wanted: np.ndarray, capacity: int, p: int) -> np.ndarray:
    """:func:`max_new_tokens_for_memory` of every request (arrays, a finite pool)."""
    return np.maximum(0, np.minimum(wanted, capacity - ceil_page(prompt_len, p) - p - 1))


def admits_all(extend: np.ndarray, max_new: np.ndarray, p: int, room: int) -> np.ndarray:
    """:func:`admits` of every request against the same ``room`` (arrays)."""
    return extend + np.minimum(max_new, CLIP_MAX_NEW_TOKENS) + p < room


def prefill_pages(prompt_len, p: int):
    """Pages a prefill of ``prompt_len`` tokens holds while it allocates: its pages plus the
    spare page the paged extend allocator demands (ints or arrays; :func:`extend_demand`)."""
    return ceil_page(prompt_len, p) // p + (1 if p > 1 else 0)


def admission_need(prompt_len, p: int):
    """Free tokens an empty pool must hold to admit a prompt (ints or arrays):
    ``ceil_page(L) + page + 1`` (with ``max_new`` clipped to the pool, §7.2)."""
    return ceil_page(prompt_len, p) + p + 1


def admits(extend: int, max_new: int, p: int, room: int | float) -> bool:
    """PrefillAdder.add_one_req: ``extend + min(max_new, 4096) + page < free + evictable``
    (the prefix pinned)."""
    return extend + min(max_new, CLIP_MAX_NEW_TOKENS) + p < room


def first_chunk(extend: int, chunk: int, p: int) -> int:
    """The first prefill round of an admitted request: all of it, or a page-floored chunk
    when it is longer than ``chunked_prefill_size`` (0: cannot be scheduled) (§7.4)."""
    if chunk > 0 and ceil_page(extend, p) > chunk:
        return chunk // p * p
    return extend


def next_chunk(remaining: int, room: int | float, chunk: int) -> int:
    """PrefillAdder.add_chunked_req: the next chunk, bounded by free + evictable tokens."""
    rem = min(chunk, int(min(room, 2**62)))
    if rem <= 0:
        rem = chunk
    return min(remaining, rem)


# -- allocation and eviction (§5.5) ------------------------------------------------------

def extend_demand(start: int, end: int, p: int) -> int:
    """alloc_for_extend: the tokens made allocatable for a prefill round; the paged
    allocator demands one extra page per request."""
    return end - start + (p if p > 1 else 0)


def decode_starts_page(committed: int, p: int) -> bool:
    """check_decode_mem / alloc_paged_token_slots_decode: the next decode token opens a new
    page (and a page is made allocatable first) when the committed length is page-aligned."""
    return committed % p == 0


def eviction_amount(need: int, available: int | float, amount: str) -> int:
    """evict_to_free_tokens: tokens to evict so ``need`` can be allocated: the shortfall
    ``need - free`` (0.5.23), or the whole need (``"need"``, older releases); 0 if it fits."""
    if need <= available:
        return 0
    return int(need if amount == "need" else need - available)


def inserted_on_release(committed: int, p: int) -> int:
    """release_kv_cache: the tokens that enter the tree, ``floor_page(L + k - 1)`` for a
    finish by length (the last sampled token has no KV; §3.3)."""
    return floor_page(committed, p)
