"""SGLang 0.5.23's ``PrefillAdder``: which waiting requests join a prefill batch.

Section numbers (§) refer to ``docs/engines/sglang-scheduler.md``.

Re-states ``PrefillAdder`` and ``PrefillBudget`` (``schedule_policy.py``,
``mem_cache/prefill_budget.py``) for the default token pool. The budget is the free
slots plus the evictable tree, minus what running requests may still need: each
running request reserves ``min(max_new - generated, 4096)`` tokens, scaled by
``new_token_ratio`` unless it ignores EOS (§4.1). Admission never evicts; it only counts.
The admission test and the chunk lengths are the engine's rules (``rules.admits``,
``first_chunk``, ``next_chunk``), which a lone request meets through the same formulas.
"""
from __future__ import annotations

from kvsim.engines.sglang import rules
from kvsim.engines.sglang.rules import CLIP_MAX_NEW_TOKENS

CONTINUE, NO_TOKEN, OTHER = "continue", "no_token", "other"


def running_offset(req, new_token_ratio: float) -> float:
    """What a running request may still allocate (``_get_running_request_total_token_offset``)."""
    ratio = 1.0 if req.ignore_eos else new_token_ratio
    return min(req.max_new - req.out_count, CLIP_MAX_NEW_TOKENS) * ratio


class PrefillAdder:
    """One prefill round's admission state."""

    def __init__(self, cache, running_reqs, new_token_ratio: float, max_prefill_tokens: int,
                 chunked_prefill_size: int | None) -> None:
        self.cache = cache
        self.page = cache.page_size
        self.rem_input = max_prefill_tokens
        self.rem_chunk = chunked_prefill_size
        self.total_offset = sum(running_offset(r, new_token_ratio) for r in running_reqs)
        self.current_offset = 0
        self.can_run: list = []
        self.new_chunked_req = None

    def ceil_page(self, n: int) -> int:
        return -(-n // self.page) * self.page

    @property
    def remaining_total(self) -> float:
        return self.cache.available_size + self.cache.evictable_size - self.total_offset

    @property
    def remaining_current(self) -> float:
        return self.cache.available_size + self.cache.evictable_size - self.current_offset

    def budget_state(self) -> str:
        if not (self.remaining_total > 0 and self.remaining_current > 0):
            return NO_TOKEN
        if self.rem_input <= 0 or (self.rem_chunk is not None and self.rem_chunk <= 0):
            return OTHER
        return CONTINUE

    def _reserve(self, extend: int, max_new: int) -> None:
        """``_update_prefill_budget``: the page-rounded extend now, plus its future tokens (§4.2)."""
        ext = self.ceil_page(extend)
        self.total_offset += ext + self.page + max_new
        self.current_offset += ext + self.page
        self.rem_input -= ext
        if self.rem_chunk is not None:
            self.rem_chunk -= ext

    def add_chunked_req(self, req):
        """The next chunk of the request being chunked goes first; returns it if still unfinished."""
        kv = req.kv
        remaining = req.seq_len - kv.prefix_len
        # a continuing chunk must progress to free its KV: at least a chunk, whatever the room
        new_len = rules.next_chunk(remaining, self.remaining_total, self.rem_chunk)
        truncated = remaining > new_len
        kv.extend_end = kv.prefix_len + new_len
        self.can_run.append(req)
        self._reserve(new_len, 0 if truncated else min(req.max_new, CLIP_MAX_NEW_TOKENS))
        return req if truncated else None

    def _shape(self, req, extend: int):
        """``_select_prefill_admission``: (extend, chunked, reserved new tokens), or why not."""
        input_tokens = self.ceil_page(extend)
        if self.rem_chunk is None and self.can_run and input_tokens >= self.rem_input:
            return OTHER
        reserve_new = min(req.max_new, CLIP_MAX_NEW_TOKENS)
        if self.rem_chunk is not None:
            first = rules.first_chunk(extend, self.rem_chunk, self.page) if self.rem_chunk > 0 else 0
            if first <= 0:
                return OTHER
            if first < extend:
                return first, True, 0
        return extend, False, reserve_new

    def add_one_req(self, req) -> str:
        """Admit a waiting request whole, as the new chunked request, or not at all (§4.3).
        With HiCache the host part of its match is loaded back first, whole or not at all
        (``init_load_back``, docs/engines/offload.md §3.5)."""
        kv, p = req.kv, self.page
        max_new = max(req.max_new - req.out_count, 0)
        extend = req.seq_len - kv.prefix_len
        cache = self.cache
        pinned = kv.last_node
        cache.lock(pinned)             # a temporary pin: its prefix stops counting as evictable
        try:
            if not rules.admits(extend, max_new, p, self.remaining_total):
                return NO_TOKEN
            shape = self._shape(req, extend - kv.host_hit)
            if kv.host_hit and shape not in (NO_TOKEN, OTHER):
                loaded = cache.load_back(kv)
                if loaded < kv.host_hit:                  # nothing loaded: recomputation may not fit
                    if not rules.admits(extend, max_new, p, self.remaining_total):
                        return NO_TOKEN
                    shape = self._shape(req, extend)
            if shape in (NO_TOKEN, OTHER):
                return shape
            extend, chunked, reserve_new = shape
            kv.extend_end = kv.prefix_len + extend
            cache.lock(kv.last_node)
            self.can_run.append(req)
            if chunked:
                self.new_chunked_req = req
            self._reserve(extend, reserve_new)
        finally:
            cache.unlock(pinned)
        return self.budget_state()
