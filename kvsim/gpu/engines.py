"""The stepwise cache models as gpu-validate drives them: build one from :class:`SimOptions`,
and read a running request's block table after its decode steps.

Both models follow :class:`kvsim.cache.base.PrefixCache`; what differs is how capacity is
given, whether ids are pages or per-token slots, and how to see a running request's table.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from kvsim.cache.base import PrefixCache, Request
from kvsim.errors import ConfigError
from kvsim.io.trace import Trace
from kvsim.replay.options import SimOptions


@dataclass
class CacheModel:
    """A stepwise cache model and what the KV pool behind it must look like."""

    cache: PrefixCache
    page_size: int            # tokens per physical page of the pool
    num_pages: int            # pages in the pool (ids 0..num_pages-1 are valid)
    token_slots: bool         # block tables list one slot per token (SGLang) instead of one page per block
    running_table: Callable[[Request], np.ndarray | None]


def _peak_tokens(trace: Trace) -> np.ndarray:
    """Tokens each request holds at its peak: prompt + outputs - the never-computed last one."""
    return trace.prompt_lengths + np.maximum(trace.output_lengths, 1) - 1


def build_apc(trace: Trace, options: SimOptions) -> CacheModel:
    """vLLM APC (:class:`kvsim.cache.apc.APCCache`), built as ``replay_apc``'s reference engine builds it."""
    from kvsim.cache.apc import APCCache
    from kvsim.replay.apc import apc_settings, unlimited_num_blocks

    st = apc_settings(options)
    b = st.block_size
    L = trace.prompt_lengths
    slice_blocks = unlimited_num_blocks(np.where(L > 0, -(-_peak_tokens(trace) // b), 0))
    num_blocks = slice_blocks if st.num_gpu_blocks is None else st.num_gpu_blocks
    cache = APCCache(num_blocks, b, st.hash_algo, st.profile.version, st.lora_paths)

    def running_table(req: Request) -> np.ndarray | None:
        fn = getattr(cache, "block_table", None)
        if fn is not None:
            return np.asarray(fn(req), np.int64)
        seq = cache._seqs.get(req.request_id)  # NOTE: no public accessor yet (reported)
        return None if seq is None else np.asarray(cache.manager.block_ids(seq), np.int64)

    # Block ids leave vLLM's free queue lowest first (it starts as 1..N-1 and freed blocks
    # go behind or in front of the untouched ones), so a slice never touches an id above
    # the blocks it takes in all: the pool can stop there even when the capacity is larger.
    return CacheModel(cache, b, min(num_blocks, slice_blocks), False, running_table)


def build_radix(trace: Trace, options: SimOptions) -> CacheModel:
    """SGLang RadixAttention (the stepwise radix model); slot tables are per token."""
    import importlib

    from kvsim.models import radix_max_total_tokens

    mod = None
    for name in ("kvsim.cache.radix", "kvsim.cache.radix_cache"):
        if importlib.util.find_spec(name) is not None:
            mod = importlib.import_module(name)
            break
    if mod is None:
        raise ConfigError("the radix cache model is not available in this build")
    cls = getattr(mod, "RadixCache", None) or getattr(mod, "RadixPrefixCache", None)
    if cls is None:
        raise ConfigError("the radix cache model has no stepwise RadixCache class")
    p = int(options.page_size)
    slice_tokens = int(np.sum(-(-_peak_tokens(trace) // p) * p)) + p
    tokens = radix_max_total_tokens(options)
    total = slice_tokens if tokens is None else int(tokens)
    cache = cls.from_options(options, max_total_tokens=total) if hasattr(cls, "from_options") else cls(total, p)

    def running_table(req: Request) -> np.ndarray | None:
        fn = getattr(cache, "block_table", None)
        return None if fn is None else np.asarray(fn(req), np.int64)

    # slot 0 is SGLang's padding slot; slots are 1..max_total_tokens
    pages = (min(total, slice_tokens) + p) // p + 1
    return CacheModel(cache, p, pages, True, running_table)


BUILDERS: dict[str, Callable[[Trace, SimOptions], CacheModel]] = {"apc": build_apc, "radix": build_radix}


def build_cache_model(policy: str, trace: Trace, options: SimOptions) -> CacheModel:
    if policy not in BUILDERS:
        raise ConfigError(f"unknown --policy {policy!r}; choose apc or radix")
    return BUILDERS[policy](trace, options)
