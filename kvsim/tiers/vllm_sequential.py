"""One request at a time through vLLM's offloading connector (``docs/engines/offload.md §4``).

A sequential replay means: each request arrives when the engine is idle, i.e. after the
previous one finished and every store it issued completed. :class:`SequentialOffload`
makes, for one such request, the connector calls vLLM 0.33's scheduler makes, step by
step (the order the real scheduler was recorded making them, offload.md §4):

1. first step: ``get_num_new_matched_tokens`` after the GPU hit; ``update_state_after_alloc``;
   with an external hit the step only loads (the request waits for it, then its loaded
   blocks join the GPU prefix cache and a full-prompt hit recomputes its last token);
2. prefill steps of at most ``token_budget`` tokens, then one decode step per output token;
   every step ends with ``build_connector_meta`` (stores) and the worker's completions;
3. after the last token, ``request_finished``, then steps with nothing scheduled until the
   connector has no job left (the first of them signals the finish to the manager).

The GPU side (the hit, the promotion of loaded blocks) is the caller's: kvsim's vLLM
engine calls :meth:`SequentialOffload.serve` with the request's GPU hit and caches
``local + external`` tokens. The connector is vLLM's native one
(:class:`~kvsim.tiers.vllm_connector.OffloadConnector`) or LMCache's
(:class:`~kvsim.tiers.lmcache_connector.LMCacheConnector`), whose loads are synchronous:
the request runs in the step that loads (offload.md §2.5).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvsim.tiers.vllm_connector import InstantWorker, OffloadConnector, OffloadSettings
from kvsim.tiers.vllm_policies import Key


@dataclass(eq=False)
class _Req:
    """The request as the connector reads it; hashes revealed as tokens are appended."""

    request_id: str
    all_hashes: Sequence[Key]
    num_prompt_tokens: int
    block_size: int
    skip_reading_prefix_cache: bool = False
    num_computed_tokens: int = 0
    _num_tokens: int = 0
    _finished: bool = False
    block_hashes: list[Key] = field(default_factory=list)
    all_tokens: Sequence[int] = ()       # prompt and outputs (LMCache keys tokens)

    @property
    def token_ids(self) -> Sequence[int]:
        """The prompt and the outputs sampled so far."""
        return self.all_tokens[:self._num_tokens]

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def is_finished(self) -> bool:
        return self._finished

    def grow(self, num_tokens: int) -> None:
        self._num_tokens = num_tokens
        full = min(num_tokens // self.block_size, len(self.all_hashes))
        self.block_hashes.extend(self.all_hashes[len(self.block_hashes):full])


class Served(NamedTuple):
    """What vLLM reports for the request (``PrefillStats``)."""

    local: int          # num_local_cached_tokens (the GPU hit)
    external: int       # num_external_cached_tokens (loaded from the CPU tier)

    @property
    def cached(self) -> int:
        return self.local + self.external


class SequentialOffload:
    """vLLM's CPU tier under a sequential replay (``offload_vllm_driver.py`` mode sequential)."""

    def __init__(self, settings: OffloadSettings | Any, token_budget: int = 8192, block_size: int | None = None) -> None:
        """``settings``: the native connector's, or a connector (LMCache's) and its GPU ``block_size``."""
        if isinstance(settings, OffloadSettings):
            self.connector, block_size = OffloadConnector(settings), settings.gpu_block_size
        else:
            self.connector = settings
        assert block_size is not None
        self.worker = InstantWorker()
        self.block_size = block_size
        self.token_budget = token_budget
        self.steps = 0

    def _step(self, scheduled: dict[str, int], finished: Sequence[str] = ()) -> None:
        meta = self.connector.build_connector_meta(scheduled, finished)
        done, _ = self.worker.step(meta)
        self.connector.update_connector_output(done)
        self.steps += 1

    def serve(self, request_id: str, block_hashes: Sequence[Key], num_prompt_tokens: int,
              num_output_tokens: int, local: int, skip_reading_prefix_cache: bool = False,
              tokens: Sequence[int] = ()) -> Served:
        """Serve one request whose GPU prefix hit is ``local`` tokens.

        ``block_hashes``: the chained keys of every full GPU block of the prompt and its
        outputs (the last output token never fills a block that is hashed before finish);
        ``tokens``: the prompt and outputs (read by LMCache)."""
        L, M = num_prompt_tokens, max(num_output_tokens, 1)
        req = _Req(request_id, block_hashes, L, self.block_size, skip_reading_prefix_cache, all_tokens=tokens)
        req.grow(L)
        conn = self.connector
        conn.on_new_request(req)
        external, load_async = conn.get_num_new_matched_tokens(req, local)
        assert external is not None, "a sequential replay never meets a pending chunk"
        conn.update_state_after_alloc(req, external)
        req.num_computed_tokens = local
        if external and load_async:
            self._step({})                      # the load step: the request waits
            req.num_computed_tokens = min(local + external, L - 1)
        elif external:                          # a synchronous load: computed before the forward
            req.num_computed_tokens = local + external
        generated = 0
        while generated < M:
            n = min(L - req.num_computed_tokens, self.token_budget) if req.num_computed_tokens < L else 1
            self._step({request_id: n})
            req.num_computed_tokens += n
            if req.num_computed_tokens >= L:   # this step sampled a token
                generated += 1
                req.grow(L + generated)
        req._finished = True
        conn.request_finished(req)
        self._step({}, finished=[request_id])
        while conn.has_pending_work():
            self._step({})
        return Served(local, external)
