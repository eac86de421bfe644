"""The stepwise cache models as gpu-validate drives them: build one from :class:`SimOptions`,
and read a running request's block table after its decode steps.

Both models follow :class:`kvsim.engines.base.PrefixCache`; what differs is how capacity is
given, whether ids are pages or per-token slots, and how to see a running request's table.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kvsim.engines.base import PrefixCache, Request
from kvsim.errors import ConfigError
from kvsim.gpu.block_tables import pages_from_block_table
from kvsim.io.trace.columns import Trace
from kvsim.engines.options import SimOptions


@dataclass
class CacheModel:
    """A stepwise cache model and what the KV pool behind it must look like."""

    cache: PrefixCache
    page_size: int            # tokens per physical page of the pool
    num_pages: int            # pages in the pool (ids 0..num_pages-1 are valid)
    token_slots: bool         # admission tables list one slot per token instead of one id per page
    num_decodes: Callable[[Request], int]          # decode steps the replay runs after admission
    running_pages: Callable[[Request, int], np.ndarray | None]  # page ids of a running request's first n tokens


def build_apc(trace: Trace, options: SimOptions) -> CacheModel:
    """vLLM APC (:class:`kvsim.engines.vllm.sequential.APCReference`), as a replay's reference model is built."""
    from dataclasses import replace

    from kvsim.engines.vllm import rules
    from kvsim.engines.vllm.sequential import APCReference
    from kvsim.engines.vllm.settings import APCSettings

    st = APCSettings.from_options(options)
    b = st.block_size
    slice_blocks = rules.unlimited_num_blocks(trace.prompt_lengths, np.maximum(trace.output_lengths, 1), b)
    num_blocks = slice_blocks if st.num_gpu_blocks is None else st.num_gpu_blocks
    cache = APCReference(replace(st, num_gpu_blocks=num_blocks))

    def running_pages(req: Request, n: int) -> np.ndarray | None:
        table = cache.block_table(req)
        return None if table is None else pages_from_block_table(table, b, n)

    # Block ids leave vLLM's free queue lowest first (it starts as 1..N-1 and freed blocks
    # go behind or in front of the untouched ones), so a slice never touches an id above
    # the blocks it takes in all: the pool can stop there even when the capacity is larger.
    return CacheModel(cache, b, min(num_blocks, slice_blocks), False,
                      lambda req: len(req.output) - 1, running_pages)


def build_radix(trace: Trace, options: SimOptions) -> CacheModel:
    """SGLang RadixAttention (:class:`kvsim.engines.sglang.sequential.RadixReference`), as a
    replay's reference model is built.

    Admission tables hold one slot per token at page size 1 and page ids above it; a
    running request's ``row`` (SGLang's ``req_to_token``) holds one slot per token.
    Slot 0 / page 0 is SGLang's padding and never handed out.
    """
    from kvsim.engines.sglang.sequential import RadixReference
    from kvsim.engines.sglang.rules import ceil_page
    from kvsim.engines.sglang.settings import RadixSettings

    st = RadixSettings.from_options(options)
    if st.finish != "length":
        raise ConfigError("gpu-validate follows requests that finish by length only (finish='length')")
    p = st.page_size
    cache = RadixReference(st)
    # unlimited: slots are never reused; a request allocates at most L + M + 1 slots plus a page
    L = trace.prompt_lengths
    slice_pages = int(np.sum(ceil_page(L + np.maximum(trace.output_lengths, 1) + 1, p) // p + 1)) + 2
    num_pages = slice_pages if st.capacity is None else st.capacity // p + 1

    def running_pages(req: Request, n: int) -> np.ndarray | None:
        table = cache.block_table(req)    # one slot per token (req_to_token)
        return None if table is None else pages_from_block_table(table, p, n, token_slots=True)

    def num_decodes(req: Request) -> int:
        state = cache.active.get(req.request_id)
        return 0 if state is None else state.k - 1   # generation clipped to the pool (max_new)

    return CacheModel(cache, p, num_pages, False, num_decodes, running_pages)


BUILDERS: dict[str, Callable[[Trace, SimOptions], CacheModel]] = {"apc": build_apc, "radix": build_radix}


def build_cache_model(policy: str, trace: Trace, options: SimOptions) -> CacheModel:
    if policy not in BUILDERS:
        raise ConfigError(f"unknown --policy {policy!r}; choose apc or radix")
    return BUILDERS[policy](trace, options)
