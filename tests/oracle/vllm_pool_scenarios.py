"""Block-pool scenarios of ``docs/engines/apc.md §6`` that need no manager (S8), written once.

``s8(pool, cache_full, map_size)`` runs S8 on any pool with ``get_new_blocks(n)`` whose blocks
have ``block_id`` and ``block_hash``; ``cache_full(blocks, num_cached, num_full)`` registers
blocks under the request's hashes (range(14) at B=4: 3 full blocks) and ``map_size()`` counts
the hash map's keys. kvsim's test runs it on its own pool; run as a script under the oracle
interpreter, this file runs it on the real vLLM 0.33.0 ``BlockPool`` and prints JSON:

    vllm_pool_scenarios.py        (JSON on stdout)
"""
from __future__ import annotations

import json
import os
import sys
import warnings

BLOCK_SIZE = 4
TOKENS = list(range(14))


def s8(pool, cache_full, map_size) -> list:
    """S8 ``test_cache_blocks``: cache two fresh blocks 0 -> 2, then a third 2 -> 3."""
    blocks = pool.get_new_blocks(2)
    cache_full(blocks, 0, 2)
    first = [map_size(), [b.block_hash is not None for b in blocks], [b.block_id for b in blocks]]
    blocks += pool.get_new_blocks(1)
    cache_full(blocks, 2, 3)
    second = [map_size(), [b.block_hash is not None for b in blocks], [b.block_id for b in blocks]]
    return [first, second]


def _real_vllm() -> dict:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    request = Request("r", TOKENS, SamplingParams(max_tokens=1), None,
                      block_hasher=get_request_block_hasher(BLOCK_SIZE, hash_fn))
    pool = BlockPool(5, enable_caching=True, hash_block_size=BLOCK_SIZE)

    def cache_full(blocks, num_cached, num_full):
        pool.cache_full_blocks(request, blocks, num_cached, num_full, BLOCK_SIZE, 0)

    return {"hashes": len(request.block_hashes),
            "S8": s8(pool, cache_full, lambda: len(pool.cached_block_hash_to_block))}


if __name__ == "__main__":
    json.dump(_real_vllm(), sys.stdout)
