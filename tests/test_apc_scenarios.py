"""Acceptance scenarios S1–S16 and M1–M2 of ``docs/engines/apc.md §6`` on the reference model.

"modern" is vLLM >= 0.24 (the 0.33 default), "legacy" <= 0.23 (``--engine-version 0.11``).
Modern numbers were re-checked against the real vLLM 0.33.0 manager.
"""
from __future__ import annotations

import pytest

from kvsim.engines.vllm import hashing
from kvsim.engines.vllm.hashing import BlockHasher
from kvsim.engines.vllm.manager import KVCacheManager as APCManager, Sequence
from kvsim.engines.vllm.settings import PROFILES
from kvsim.engines.vllm.metrics import CachingMetrics, PrefixCacheStats
from kvsim.engines.vllm.manager import BlockPool

B = 16
C48 = [0] * 16 + [1] * 16 + [2] * 16
MODES = ["modern", "legacy"]


def manager(n: int, mode: str = "modern", **kw) -> APCManager:
    return APCManager(n, kw.pop("block_size", B), profile=PROFILES["0.33" if mode == "modern" else "0.11"], **kw)


def seq(rid: str, tokens, algo: str = "sha256", block_size: int = B, **kw) -> Sequence:
    tokens = list(tokens)
    return Sequence(rid, tokens, len(tokens), BlockHasher(block_size, algo), **kw)


def ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


def admit(m: APCManager, s: Sequence, num_tokens: int | None = None):
    """Lookup + allocate, as the scheduler admits a waiting request."""
    hits, n = m.lookup(s)
    new = m.allocate_slots(s, (s.num_tokens if num_tokens is None else num_tokens) - n, n, hits)
    return hits, n, new


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor", "fast"])
@pytest.mark.parametrize("mode", MODES)
def test_s1_prefill(algo, mode):
    m = manager(11, mode)
    r0 = seq("r0", C48 + [3] * 7, algo)
    hits, n, new = admit(m, r0)
    assert (hits, n, len(r0.block_hashes)) == ([], 0, 3)
    assert ids(new) == [1, 2, 3, 4]
    assert [m.pool.blocks[i].block_hash for i in (1, 2, 3)] == r0.block_hashes
    assert m.pool.blocks[4].block_hash is None and all(m.pool.blocks[i].ref_cnt == 1 for i in (1, 2, 3, 4))
    r1 = seq("r1", C48 + [3] * 5, algo)
    hits, n, new = admit(m, r1)
    assert (ids(hits), n, ids(new)) == ([1, 2, 3], 48, [5])
    assert [m.pool.blocks[i].ref_cnt for i in (1, 2, 3)] == [2, 2, 2] and m.pool.num_free_blocks == 5
    m.free(r0)
    m.free(r1)
    assert m.pool.num_free_blocks == 10
    assert m.pool.free_block_ids() == {"legacy": [6, 7, 8, 9, 10, 4, 5, 3, 2, 1],
                                       "modern": [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]}[mode]
    r2 = seq("r2", C48 + [3] * 6, algo)
    hits, n, new = admit(m, r2)
    assert (ids(hits), n, ids(new)) == ([1, 2, 3], 48, {"legacy": [6], "modern": [5]}[mode])
    assert m.pool.num_free_blocks == 6
    m.free(r2)
    r3 = seq("r3", [99] * 160, algo)
    hits, n, new = admit(m, r3)
    assert n == 0 and ids(new) == {"legacy": [7, 8, 9, 10, 4, 5, 6, 3, 2, 1],
                                   "modern": [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]}[mode]
    assert m.pool.num_free_blocks == 0


@pytest.mark.parametrize("mode", MODES)
def test_s2_prompt_logprobs_write_but_do_not_read(mode):
    m = manager(11, mode)
    r0 = seq("r0", C48 + [3] * 7, skip_reading_prefix_cache=True)
    hits, n, new = admit(m, r0)
    assert (n, ids(new)) == (0, [1, 2, 3, 4]) and all(m.pool.blocks[i].block_hash for i in (1, 2, 3))
    r1 = seq("r1", C48 + [3] * 5)
    hits, n, new = admit(m, r1)
    assert (ids(hits), n, ids(new)) == ([1, 2, 3], 48, [5])
    m.free(r0)
    m.free(r1)
    r2 = seq("r2", C48 + [3] * 6, skip_reading_prefix_cache=True)
    hits, n, new = admit(m, r2)
    assert n == 0 and ids(new) == {"legacy": [6, 7, 8, 9], "modern": [5, 4, 6, 7]}[mode]
    assert all(b.ref_cnt == 1 for b in new)
    assert [b.block_hash for b in new[:3]] == r0.block_hashes  # duplicates in the map
    assert [m.pool.get_cached_block(h).block_id for h in r0.block_hashes] == [1, 2, 3]
    assert m.pool.num_free_blocks == 6


def test_s3_decode():
    m = manager(11)
    r0 = seq("r0", C48 + [3] * 7)
    _, _, new = admit(m, r0)
    assert ids(new) == [1, 2, 3, 4]
    r0.num_computed_tokens = 55
    r0.append([8] * 4)
    assert m.allocate_slots(r0, 4) == [] and m.pool.blocks[4].block_hash is None
    r0.num_computed_tokens = 59
    r0.append([8] * 19)
    assert ids(m.allocate_slots(r0, 19)) == [5]
    assert m.pool.blocks[4].block_hash == r0.block_hashes[3] and m.pool.blocks[5].block_hash is None


@pytest.mark.parametrize("mode", MODES)
def test_s4_evict(mode):
    m = manager(11, mode)
    r0, r1 = seq("r0", range(87)), seq("r1", range(87, 135))
    assert ids(admit(m, r0)[2]) == [1, 2, 3, 4, 5, 6]
    assert ids(admit(m, r1)[2]) == [7, 8, 9] and m.pool.num_free_blocks == 1
    m.free(r0)
    if mode == "modern":
        assert m.pool.free_block_ids() == [6, 10, 5, 4, 3, 2, 1]
    m.free(r1)
    assert m.pool.num_free_blocks == 10
    assert m.pool.free_block_ids() == {"legacy": [10, 6, 5, 4, 3, 2, 1, 9, 8, 7],
                                       "modern": [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]}[mode]
    hits, n, new = admit(m, seq("r2", range(35)))
    assert (ids(hits), n, ids(new)) == ([1, 2], 32, {"legacy": [10], "modern": [6]}[mode])
    assert m.pool.num_free_blocks == 7


def test_s5_hash_block_correct_reuse():
    m = manager(2)
    r0 = seq("r0", range(16))
    assert ids(admit(m, r0)[2]) == [1] and m.pool.blocks[1].block_hash is not None
    m.free(r0)
    _, n, new = admit(m, seq("r1", range(15)))
    assert (n, ids(new)) == (0, [1]) and m.pool.blocks[1].block_hash is None


def test_s6_computed_blocks_not_evicted():
    m = manager(3)
    r0, r1 = seq("r0", range(16)), seq("r1", range(16, 32))
    assert ids(admit(m, r0)[2]) == [1] and ids(admit(m, r1)[2]) == [2]
    m.free(r0)
    m.free(r1)
    assert m.pool.free_block_ids() == [1, 2]
    hits, n, new = admit(m, seq("r2", range(32)))
    assert (ids(hits), n, ids(new)) == ([1], 16, [2])


def test_s7_prefix_caching_disabled():
    m = manager(5, block_size=4, enable_caching=False)
    r1 = seq("r1", range(10), block_size=4)
    assert len(admit(m, r1)[2]) == 3
    m.free(r1)
    _, n, new = admit(m, seq("r2", range(16), block_size=4))
    assert n == 0 and len(new) == 4
    assert admit(m, seq("r3", range(4), block_size=4))[2] is None


def test_s9_multimodal_extra_keys():
    """mm items key the blocks they overlap with their offset inside the block (0.33 form)."""
    prompt = list(range(10)) + [-1] * 6 + [-1] * 4 + list(range(10, 20)) + [-1] * 2 + [-1] * 16
    mm = [(11, 10, "aaa"), (30, 18, "bbb"), (48, 7, "ccc")]
    assert hashing.extra_keys(0, 16, mm_items=mm) == (("mm", "aaa", 11),)
    assert hashing.extra_keys(16, 32, mm_items=mm) == (("mm", "aaa", -5), ("mm", "bbb", 14))
    assert hashing.extra_keys(32, 48, mm_items=mm) == (("mm", "bbb", -2),)
    assert hashing.extra_keys(48, 64, mm_items=mm) == (("mm", "ccc", 0),)
    m = manager(11)
    r0 = seq("r0", prompt + [-1] * 7 + [100] * 4, mm_items=mm)
    assert len(r0.block_hashes) == 3 and ids(admit(m, r0)[2]) == [1, 2, 3, 4]
    r0.num_computed_tokens = 59
    r0.append([8] * 5)
    assert m.allocate_slots(r0, 5) == [] and len(r0.block_hashes) == 4
    assert r0.block_hashes[3] == hashing.exact_block_hashes(
        r0.tokens, B, mm_items=mm, start_block=3, parent=r0.block_hashes[2])[0]
    r1 = seq("r1", prompt + [-1] * 7 + [200] * 5, mm_items=mm)
    assert admit(m, r1)[1] == 48
    other = [(11, 10, "zzz"), (30, 18, "bbb"), (48, 7, "ccc")]
    assert m.lookup(seq("r2", prompt + [-1] * 7 + [200] * 5, mm_items=other)) == ([], 0)


def test_s10_cache_salting():
    m = manager(11)
    r0 = seq("r0", C48 + [3] * 11, cache_salt="salt1")
    assert hashing.extra_keys(0, 16, cache_salt="salt1") == (("cache_salt", "salt1"),)
    assert ids(admit(m, r0)[2]) == [1, 2, 3, 4]
    r0.num_computed_tokens = 59
    r0.append([8] * 5)
    assert m.allocate_slots(r0, 5) == [] and len(r0.block_hashes) == 4
    assert admit(m, seq("r1", C48 + [3] * 11, cache_salt="salt1"))[1] == 48
    assert m.lookup(seq("r2", C48 + [4] * 11, cache_salt="salt2"))[1] == 0
    assert m.lookup(seq("r3", C48 + [4] * 11))[1] == 0


def test_s11_not_enough_free_blocks_with_computed_blocks():
    m = manager(11)
    r0 = seq("r0", C48)
    assert ids(admit(m, r0)[2]) == [1, 2, 3]
    r1 = seq("r1", C48 * 2)
    hits, n, new = admit(m, r1)
    assert (n, ids(new)) == (48, [4, 5, 6])
    m.free(r1)
    assert [m.pool.blocks[i].ref_cnt for i in range(1, 7)] == [1, 1, 1, 0, 0, 0]
    admit(m, seq("r2", [7] * 32))
    assert m.pool.num_free_blocks == 5
    r3 = seq("r3", C48 * 3)
    hits, n = m.lookup(r3)
    assert (ids(hits), n) == ([1, 2, 3, 4, 5, 6], 96)
    # 3 new blocks + 3 evictable hits = 6 > 5 free: refused, nothing changes
    assert m.allocate_slots(r3, 48, 96, hits) is None
    assert [m.pool.blocks[i].ref_cnt for i in range(1, 7)] == [1, 1, 1, 0, 0, 0]


def test_s12_reset_prefix_cache():
    m = manager(11)
    r0, r1 = seq("r0", C48 + [3] * 7), seq("r1", C48 + [4] * 7)
    assert ids(admit(m, r0)[2]) == [1, 2, 3, 4]
    _, n, new = admit(m, r1)
    assert (n, ids(new)) == (48, [5])
    assert not m.reset_prefix_cache()
    m.free(r0)
    m.free(r1)
    assert m.reset_prefix_cache()
    assert len(m.pool.cached) == 0 and all(b.block_hash is None for b in m.pool.blocks)


def test_s13_evict_one_of_duplicates():
    pool = BlockPool(4)
    for block, key in zip(pool.blocks, ["k0", "k1", "k2", "k0"]):
        pool.cache_block(block, key)
    pool.evict(pool.blocks[1])
    pool.evict(pool.blocks[0])
    assert pool.get_cached_block("k0") is pool.blocks[3] and pool.get_cached_block("k1") is None
    pool.evict(pool.blocks[2])
    pool.evict(pool.blocks[3])
    assert len(pool.cached) == 0


@pytest.mark.parametrize("blocks", [2, 3, 10])
def test_s14_kv_cache_events(blocks):
    m = manager(blocks + 1, record_events=True)
    r0 = seq("r0", range(16 * blocks))
    m.allocate_slots(r0, 16 * blocks)
    assert m.pool.events == [("stored", r0.block_hashes)] and len(m.pool.cached) == blocks
    m.free(r0)
    m.pool.events.clear()
    r1 = seq("r1", range(16 * blocks))
    m.allocate_slots(r1, 16 * blocks)  # no lookup: takes the same blocks, evicting each
    assert m.pool.events == [("removed", h) for h in reversed(r0.block_hashes)] + [("stored", r1.block_hashes)]
    m.free(r1)
    m.pool.events.clear()
    assert m.reset_prefix_cache() and m.pool.events == [("cleared",)] and len(m.pool.cached) == 0


@pytest.mark.parametrize("length", [48, 37])
def test_s15_eagle_drops_last_matched_block(length):
    m = manager(10, use_eagle=True)
    r0 = seq("r0", [0] * length)
    admit(m, r0)
    m.free(r0)
    hits, n = m.lookup(seq("r1", [0] * length))
    assert (len(hits), n) == (1, 16)


def test_s16_stats_disabled():
    m = manager(11, log_stats=False)
    r0 = seq("r0", C48 + [3] * 7)
    admit(m, r0)
    assert m.prefix_cache_stats is None and m.make_prefix_cache_stats() is None
    m.free(r0)
    assert m.reset_prefix_cache() and m.prefix_cache_stats is None


def test_stats_recorded_at_admission_and_reset_flag():
    """0.33 records once per admitted lookup (tokens = num_tokens); prompt-logprob requests are skipped."""
    m = manager(11)
    r0, r1 = seq("r0", [101] * 17), seq("r1", [101] * 17)
    for r in (r0, r1):
        _, n, _ = admit(m, r)
        m.record_prefix_cache_stats(r, n)
        m.free(r)
    plp = seq("r2", [101] * 17, skip_reading_prefix_cache=True)
    m.record_prefix_cache_stats(plp, 0)
    stats = m.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (2, 34, 16)
    assert m.reset_prefix_cache() and m.make_prefix_cache_stats().reset


def _observe(metrics, requests, queries, hits):
    metrics.observe(PrefixCacheStats(requests=requests, queries=queries, hits=hits))


def test_m1_sliding_window():
    metrics = CachingMetrics(max_recent_requests=5)
    assert metrics.empty and metrics.hit_rate == 0.0
    _observe(metrics, 1, 20, 9)
    assert metrics.hit_rate == pytest.approx(0.45)
    _observe(metrics, 4, 80, 16)
    assert metrics.hit_rate == pytest.approx(0.25)
    _observe(metrics, 1, 10, 2)
    assert (metrics.aggregated_requests, metrics.aggregated_query_total, metrics.aggregated_query_hit) == (5, 90, 18)
    assert metrics.hit_rate == pytest.approx(0.2)
    metrics.reset()
    assert metrics.hit_rate == 0.0 and metrics.empty and not metrics.query_queue


def test_m2_empty_steps_ignored_newest_kept():
    metrics = CachingMetrics(max_recent_requests=5)
    for r, q, h in [(1, 20, 9), (0, 0, 0), (4, 80, 16), (0, 0, 0), (1, 10, 2)]:
        _observe(metrics, r, q, h)
    assert (metrics.aggregated_requests, metrics.aggregated_query_total, metrics.aggregated_query_hit) == (5, 90, 18)
    assert metrics.hit_rate == pytest.approx(0.2)
    _observe(metrics, 11, 20, 10)
    assert len(metrics.query_queue) == 1 and metrics.hit_rate == pytest.approx(0.5)
    _observe(metrics, 22, 40, 30)
    assert len(metrics.query_queue) == 1 and metrics.hit_rate == pytest.approx(0.75)
    reset = PrefixCacheStats(reset=True)
    metrics.observe(reset)
    assert metrics.empty
