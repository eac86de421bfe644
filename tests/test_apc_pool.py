"""The reference block pool: free queue, hash map with duplicates, lazy eviction, free orders."""
from __future__ import annotations

import pytest

from kvsim.engines.vllm.manager import BlockHashMap, BlockPool, FreeQueue


def test_free_queue_operations():
    q = FreeQueue(range(1, 6))
    assert list(q) == [1, 2, 3, 4, 5] and len(q) == 5
    q.remove(3)
    assert q.popleft() == 1
    q.append_n([7, 8])
    q.prepend_n([9, 6])
    assert list(q) == [9, 6, 2, 4, 5, 7, 8] and len(q) == 7
    assert 9 in q and 3 not in q
    for _ in range(7):
        q.popleft()
    with pytest.raises(ValueError):
        q.popleft()


def test_hash_map_multiple_blocks_per_key():
    """S13 companion: the earliest-inserted block answers; popping one keeps the others."""
    pool = BlockPool(4)
    m = BlockHashMap()
    b0, b1 = pool.blocks[1], pool.blocks[2]
    m.insert("k0", b0)
    m.insert("k0", b1)
    assert m.get_one("k0") is b0 and len(m) == 1 and m.num_blocks() == 2
    assert m.pop("k0", 1) is b0
    assert m.get_one("k0") is b1
    assert m.pop("k0", 2) is b1
    assert m.get_one("k0") is None and len(m) == 0
    assert m.pop("k0", 2) is None and m.pop("k9", 1) is None


def test_maybe_evict_cached_block_s13():
    """S13: blocks 0..3 under k0,k1,k2,k0; evicting one block of a shared key keeps the key."""
    pool = BlockPool(4)
    for block, key in zip(pool.blocks, ["k0", "k1", "k2", "k0"]):
        pool.cache_block(block, key)
    assert len(pool.cached) == 3 and pool.cached.num_blocks() == 4
    pool.evict(pool.blocks[1])
    assert pool.cached.get_one("k1") is None and len(pool.cached) == 2
    pool.evict(pool.blocks[0])
    assert pool.cached.get_one("k0") is pool.blocks[3]
    pool.evict(pool.blocks[2])
    assert len(pool.cached) == 1 and pool.cached.num_blocks() == 1
    pool.evict(pool.blocks[3])
    assert len(pool.cached) == 0
    assert not pool.evict(pool.blocks[3])  # no hash: nothing to evict


def _kvsim_s8() -> dict:
    from kvsim.engines.vllm.hashing import BlockHasher
    from kvsim.engines.vllm.manager import Sequence
    from tests.oracle.vllm_pool_scenarios import BLOCK_SIZE, TOKENS, s8

    seq = Sequence("r", list(TOKENS), len(TOKENS), hasher=BlockHasher(BLOCK_SIZE, "sha256"))
    pool = BlockPool(5)
    return {"hashes": len(seq.block_hashes),
            "S8": s8(pool, lambda blocks, a, b: pool.cache_full_blocks(blocks, seq.block_hashes, a, b),
                     lambda: len(pool.cached))}


def test_cache_full_blocks_s8():
    """S8 (docs/engines/apc.md §6): bare BlockPool(5), B=4, range(14) has 3 hashes; caching
    two fresh blocks 0 -> 2 maps 2 keys, both blocks hashed; a third, 2 -> 3, maps 3."""
    got = _kvsim_s8()
    assert got["hashes"] == 3
    # blocks come from the free queue's head: ids 1, 2, then 3 (block 0 is the null block)
    assert got["S8"] == [[2, [True, True], [1, 2]], [3, [True, True, True], [1, 2, 3]]]


def test_s8_matches_the_real_block_pool():
    """The same scenario on vLLM 0.33.0's own BlockPool gives the same observations."""
    import json
    import subprocess
    from pathlib import Path

    from tests.oracle import vllm_client

    python = vllm_client.oracle_python()
    if python is None:
        pytest.skip(f"vLLM oracle unavailable: {vllm_client.REASON}")
    script = Path(__file__).with_name("oracle") / "vllm_pool_scenarios.py"
    proc = subprocess.run([str(python), str(script)], capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout) == _kvsim_s8()


def test_null_block_and_lazy_eviction():
    """Block 0 is never handed out; a freed cached block keeps its hash until it is popped again."""
    pool = BlockPool(3)
    assert pool.null_block.block_id == 0 and pool.num_free_blocks == 2
    (a,) = pool.get_new_blocks(1)
    pool.cache_full_blocks([a], ["x"], 0, 1)
    pool.free_blocks([a])
    assert pool.get_cached_block("x") is a and pool.used_blocks == 1
    got = pool.get_new_blocks(2)
    assert [b.block_id for b in got] == [2, 1]
    assert pool.get_cached_block("x") is None and a.block_hash is None and pool.num_evicted == 1
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)


@pytest.mark.parametrize("to_head, order", [(True, [4, 3, 5, 6, 2, 1]), (False, [5, 6, 4, 3, 2, 1])])
def test_free_order(to_head, order):
    """0.24+: unhashed blocks to the head, hashed to the tail; <=0.23: all to the tail (docs/engines/apc.md §3.5)."""
    pool = BlockPool(7, free_unhashed_to_head=to_head)
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(blocks, ["a", "b"], 0, 2)
    pool.free_blocks(reversed(blocks))
    assert pool.free_block_ids() == order


def test_touch_and_shared_blocks():
    """A touched free block leaves the queue; a shared block returns only with its last holder."""
    pool = BlockPool(4)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks([a], ["k"], 0, 1)
    pool.free_blocks([b, a])
    assert pool.free_block_ids() == [2, 3, 1]
    pool.touch([a])
    pool.touch([a])
    assert a.ref_cnt == 2 and pool.free_block_ids() == [2, 3]
    pool.free_blocks([a])
    assert pool.free_block_ids() == [2, 3]
    pool.free_blocks([a])
    assert pool.free_block_ids() == [2, 3, 1]


def test_used_blocks_and_usage():
    pool = BlockPool(11)
    blocks = pool.get_new_blocks(4)
    pool.cache_full_blocks(blocks, ["a", "b", "c"], 0, 3)
    assert pool.used_blocks == 4 and pool.usage() == pytest.approx(0.4)
    pool.free_blocks(reversed(blocks))
    assert pool.used_blocks == 3 and pool.usage() == 0.0  # cached blocks count as free for vLLM
    assert pool.peak_used_blocks == 4


def test_reset_only_when_idle_keeps_queue_order():
    pool = BlockPool(4)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, ["a", "b"], 0, 2)
    assert not pool.reset_prefix_cache()
    pool.free_blocks(reversed(blocks))
    order = pool.free_block_ids()
    assert pool.reset_prefix_cache()
    assert len(pool.cached) == 0 and all(b.block_hash is None for b in pool.blocks)
    assert pool.free_block_ids() == order and pool.used_blocks == 0
