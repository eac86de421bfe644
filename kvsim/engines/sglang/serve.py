"""SGLang RadixAttention behind ``kvsim serve``: one ``serve`` call per request, with the settings
``simulate`` resolves: the fast engine (``implementation="fast"``, what ``simulate`` runs) or the
reference model."""
from __future__ import annotations

from typing import Any

import numpy as np

from kvsim.engines.base import Request
from kvsim.engines.options import SimOptions
from kvsim.engines.serving import EngineState, Served, ServeEngine


class RadixServeEngine(ServeEngine):
    """SGLang radix serving one request at a time."""

    policy = "radix"
    family = "sglang"

    def __init__(self, options: SimOptions, implementation: str = "fast") -> None:
        from kvsim.engines.sglang.sequential import RadixFast
        from kvsim.engines.sglang.sequential import RadixReference
        from kvsim.engines.sglang.settings import RadixSettings

        s = self._settings = RadixSettings.from_options(options)
        self.capacity_tokens = s.capacity
        self._fast = implementation == "fast"
        self._make = lambda: (RadixFast if self._fast else RadixReference)(s)
        self.model = self._make()

    def serve(self, request_id, prompt, output, lora=None, cache_salt=None, prompt_logprobs=False,
              logprob_start_len=-1) -> Served:
        from kvsim.engines.sglang.rules import namespace

        prompt, output = np.asarray(prompt, np.int64), np.asarray(output, np.int64)
        if self._fast:
            o = self.model.serve_tokens(prompt, output, namespace(lora, cache_salt), logprob_start_len)
        else:
            o = self.model.serve(Request(request_id, prompt, output, lora=lora, cache_salt=cache_salt,
                                         prompt_logprobs=prompt_logprobs, logprob_start_len=logprob_start_len))
        if o.rejected:
            return Served(0, 0, True, o.evicted_tokens, 0)
        generated = min(len(output), max(o.max_new, 1))  # RadixReference.new_state
        return Served(o.cached_tokens, generated, False, o.evicted_tokens, o.extend_tokens)

    def reset(self) -> bool:
        if not self._fast and self.model.active:
            return False
        self.model = self._make()  # SGLang flush_cache: a fresh tree and allocator when idle
        return True

    def state(self) -> EngineState:
        m = self.model
        cap = self.capacity_tokens
        held, available, evictable = m.used_tokens(), m.available(), m.evictable
        available = None if cap is None else int(available)
        usage = 0.0 if cap is None else (cap - available - int(evictable)) / cap
        return EngineState(prefix_queries=0, prefix_hits=0, held_tokens=int(held), capacity_tokens=cap,
                           available_tokens=available, evictable_tokens=int(evictable), usage=usage)

    def refuses(self, prompt_len: int, logprob_start_len: int) -> bool:
        """SGLang refuses a ``logprob_start_len`` past the prompt's end (radix.md §2.1)."""
        from kvsim.engines.sglang.rules import logprob_aborts

        return logprob_aborts(prompt_len, logprob_start_len)

    def max_request_tokens(self) -> int | None:
        # SGLang admits when extend + min(M, 4096) + page < free + evictable and clips M to
        # capacity - ceil_page(L) - page - 1 (radix/rules.py admits, max_new_tokens_for_memory): both hold
        # in an idle cache for every L + M <= capacity - 2 * page.
        if self.capacity_tokens is None:
            return None
        return self.capacity_tokens - 2 * self._settings.page_size

    def settings(self) -> dict[str, Any]:
        s = self._settings
        return {"page_size": s.page_size, "max_total_tokens": s.capacity, "eviction_policy": s.eviction_policy,
                "radix_tree": s.tree, "overlap": s.overlap, "chunked_prefill_size": s.chunked_prefill_size,
                "finish": s.finish}
