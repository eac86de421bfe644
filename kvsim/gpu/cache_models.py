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


def build_cache_model(policy: str, trace: Trace, options: SimOptions) -> CacheModel:
    """The reference model of ``policy``, sized for ``trace``, as a replay builds it.

    The model says (``for_validation``) how many pages the pool must hold, whether a running
    request's table lists one slot per token (SGLang's ``req_to_token`` row, ``token_slots``)
    or one id per page, and how many decode steps follow an admission; admission tables are
    page ids; slot 0 / block 0 is never handed out.
    """
    from kvsim.engines import registry

    spec = registry.engine(policy)
    model = spec.implementation("reference")
    if not hasattr(model, "for_validation"):
        raise ConfigError(f"gpu-validate cannot drive the {policy!r} engine (its reference model has no "
                          "for_validation)")
    cache, num_pages = model.for_validation(spec.settings(options), trace)
    p = cache.page_size

    def running_pages(req: Request, n: int) -> np.ndarray | None:
        table = cache.block_table(req)
        return None if table is None else pages_from_block_table(table, p, n, token_slots=cache.token_slots)

    return CacheModel(cache, p, num_pages, False, cache.decodes_after_admission, running_pages)
