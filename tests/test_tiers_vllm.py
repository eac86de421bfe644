"""vLLM 0.33's CPU offloading as kvsim models it: the acceptance scenarios of
``docs/engines/offload.md §1.13`` with exact numbers, and the manager's rules one by one.

The GPU hits are given (they are the GPU engine's); the same scenarios run through the
real vLLM scheduler in ``test_tiers_vllm_oracle.py``.
"""
from __future__ import annotations

import pytest

from kvsim.errors import ConfigError
from kvsim.tiers.vllm_connector import ConnectorMeta, InstantWorker, OffloadConnector, OffloadSettings
from kvsim.tiers.vllm_offload import CPUOffloadManager, LookupResult, num_cpu_chunks
from kvsim.tiers.vllm_policies import RequestContext
from kvsim.tiers.vllm_sequential import SequentialOffload

B = 16


def chain(tokens: list[int], block: int = B) -> list[int]:
    """Chained keys of the full blocks (kvsim's GPU block keys are prefix-chained ints)."""
    keys, parent = [], 0
    for i in range(len(tokens) // block):
        parent = hash((parent, tuple(tokens[i * block:(i + 1) * block])))
        keys.append(parent)
    return keys


FAMILY = {c: list(range(1000 * (k + 1), 1000 * (k + 1) + 48)) for k, c in enumerate("ABCXY")}


def w_request(i: int, family: str, unique: int = 24, out: int = 3) -> tuple[list[int], int]:
    """Workload W: a 48-token shared prefix + ``unique`` tokens of its own; tokens incl. outputs."""
    prompt = FAMILY[family] + list(range(100_000 + 100 * i, 100_000 + 100 * i + unique))
    return prompt + list(range(200_000 + 10 * i, 200_000 + 10 * i + out)), len(prompt)


def replay(seq: str, local: list[int], **settings) -> tuple[list[int], SequentialOffload]:
    """Sequential replay of W through kvsim's connector, with each request's GPU hit given."""
    tier = SequentialOffload(OffloadSettings(**{"num_chunks": 30, **settings}))
    external = []
    for i, (family, gpu_hit) in enumerate(zip(seq, local)):
        tokens, L = w_request(i, family)
        external.append(tier.serve(str(i), chain(tokens), L, len(tokens) - L, gpu_hit).external)
    return external, tier


def test_v1_no_pressure_the_tier_adds_nothing():
    """V1: with the GPU hits of a large GPU, every CPU lookup starts past them and misses."""
    external, _ = replay("ABCAA", [0, 0, 0, 48, 48])
    assert external == [0, 0, 0, 0, 0]


def test_v2_v3_tier_hit_then_promotion():
    """V2: A evicted from the GPU comes back from the CPU (48 tokens = its 3 shared blocks);
    V3: the next A hits those blocks on the GPU and its CPU lookup (block 3) misses."""
    external, tier = replay("ABCAA", [0, 0, 0, 0, 48])
    assert external == [0, 0, 0, 48, 0]
    assert tier.connector.manager.counters.loaded_chunks == 3


def test_v4_prompt_only_stores():
    """V4: 4 + 4 + 4 + 1 + 1 = 14 chunks: full prompt blocks, each stored once, no outputs."""
    _, tier = replay("ABCAA", [0, 0, 0, 0, 48])
    m = tier.connector.manager
    assert len(m) == 14 and m.counters.stored_chunks == 14
    _, all_tokens = replay("ABCAA", [0, 0, 0, 0, 48], offload_prompt_only=False)
    assert len(all_tokens.connector.manager) == 14   # 74 computed tokens: still 4 full blocks


def test_v5_external_ends_on_an_offload_block_boundary():
    """V5: offload block 64, GPU hit 48, CPU holding chunks 0-2 of a 200-token prompt:
    the lookup starts at chunk 0, external = 3 * 64 - 48 = 144."""
    tier = SequentialOffload(OffloadSettings(num_chunks=30, block_size=64))
    base = list(range(5000, 5200))
    assert tier.serve("0", chain(base + [1, 2]), 200, 2, local=0).external == 0
    assert len(tier.connector.manager) == 3          # 200 // 64 full chunks
    assert tier.serve("1", chain(base + [5]), 200, 1, local=48).external == 144


def test_v5_a_gain_under_one_offload_block_is_dropped():
    """The CPU chunk ending 16 tokens past the GPU hit is not loaded: external 0."""
    tier = SequentialOffload(OffloadSettings(num_chunks=30, block_size=64))
    base = list(range(5000, 5064)) + list(range(9000, 9040))
    tier.serve("0", chain(base + [1]), 104, 1, local=0)
    assert tier.serve("1", chain(base + [2]), 104, 1, local=48).external == 0


def test_v6_a_pending_store_defers_the_lookup():
    """V6: a lookup meeting a chunk whose store is still in flight answers None (wait);
    after the worker reports the store, it hits."""
    conn = OffloadConnector(OffloadSettings(num_chunks=30))
    worker = InstantWorker()

    class Req:
        def __init__(self, rid, tokens, L):
            self.request_id, self.block_hashes, self.num_prompt_tokens = rid, chain(tokens[:L]), L
            self.num_computed_tokens, self.skip_reading_prefix_cache = 0, False
            self.num_tokens, self.is_finished = L, False

    a = Req("a", *w_request(0, "A", out=0))
    conn.on_new_request(a)
    assert conn.get_num_new_matched_tokens(a, 0) == (0, False)
    meta = conn.build_connector_meta({"a": 72})
    assert [len(k) for k in meta.store_jobs.values()] == [4]
    done, _ = worker.step(meta)
    assert done == []                                    # stores complete one step later
    b = Req("b", *w_request(1, "A", out=0))
    conn.on_new_request(b)
    assert conn.get_num_new_matched_tokens(b, 0) == (None, False)
    done, _ = worker.step(conn.build_connector_meta({}))
    conn.update_connector_output(done)
    assert conn.get_num_new_matched_tokens(b, 0) == (48, True)


def test_v7_store_threshold_two():
    """V7: A X A Y A with A pushed out of the GPU each time: the first offer counts 1, the
    second reaches 2 and stores, the third occurrence loads A's 3 shared blocks."""
    external, tier = replay("AXAYA", [0, 0, 0, 0, 0], store_threshold=2)
    assert external == [0, 0, 0, 0, 48]
    assert tier.connector.manager.counters.stored_chunks == 3


# -- the manager's rules -------------------------------------------------------------------
def ctx_for(rid: str, keys: list[int]) -> RequestContext:
    return RequestContext(rid, {k: (i + 1) * B for i, k in enumerate(keys)})


def stored(m: CPUOffloadManager, rid: str, keys: list[int]) -> RequestContext:
    ctx = ctx_for(rid, keys)
    plan = m.prepare_store(keys, ctx)
    assert plan is not None
    m.complete_store(plan.keys_to_store)
    return ctx


def test_lru_evicts_a_requests_tail_before_its_head():
    """Within one request the chunk with the largest position goes first (rank (r, -pos))."""
    m = CPUOffloadManager(4, "lru")
    stored(m, "r", [1, 2, 3, 4])
    plan = m.prepare_store([9], ctx_for("s", [9]))
    assert plan.evicted == [4]


def test_lru_finish_reranks_tail_first_and_oldest_request_goes_first():
    """After finishing, a request's chunks are re-ranked tail first; an older request's
    chunks go before a newer one's."""
    m = CPUOffloadManager(6, "lru")
    old = stored(m, "old", [1, 2, 3])
    new = stored(m, "new", [4, 5, 6])
    m.on_request_finished(new)
    m.on_request_finished(old)            # finished last: most recent
    plan = m.prepare_store([7, 8, 9, 10], ctx_for("x", [7, 8, 9, 10]))
    assert plan.evicted == [6, 5, 4, 3]


def test_arc_reuse_moves_to_t2_and_t1_is_evicted_first():
    """A ready chunk reused by a later request moves T1 -> T2 at its finish; with T1's
    target at 0, eviction takes T1 (the chunk seen once) first."""
    m = CPUOffloadManager(3, "arc")
    r = stored(m, "r", [1, 2])
    m.on_request_finished(r)
    s = ctx_for("s", [1, 2])
    m.prepare_load([1], s)
    m.complete_load([1])
    m.on_request_finished(s)
    assert list(m.policy.t2) == [1] and list(m.policy.t1) == [2]
    stored(m, "t", [3])
    plan = m.prepare_store([4], ctx_for("u", [4]))
    assert plan.evicted == [2]


def test_no_room_when_every_chunk_is_pinned_or_pending():
    """prepare_store returns None (an allocation failure) when too few chunks are idle."""
    m = CPUOffloadManager(2, "lru")
    ctx = ctx_for("r", [1, 2])
    assert m.prepare_store([1, 2], ctx).keys_to_store == [1, 2]     # pending, not evictable
    assert m.prepare_store([3], ctx_for("s", [3])) is None
    assert m.counters.store_failures == 1
    assert m.lookup(1) is LookupResult.HIT_PENDING
    m.complete_store([1, 2])
    m.prepare_load([1, 2], ctx_for("t", [1, 2]))                    # pinned by a load
    assert m.prepare_store([3], ctx_for("u", [3])) is None


def test_store_threshold_counts_offers_not_lookups():
    """With store_threshold 2 a chunk is stored at its second offer; lookups do not count."""
    m = CPUOffloadManager(8, "lru", store_threshold=2)
    for _ in range(3):
        assert m.lookup(5) is LookupResult.MISS
    assert m.prepare_store([5], ctx_for("a", [5])).keys_to_store == []
    assert m.prepare_store([5], ctx_for("b", [5])).keys_to_store == [5]
    assert m.counters.skipped_by_threshold == 1


def test_reuse_tracker_is_bounded_and_keeps_the_keys_offered_now():
    """The tracker holds ``tracker_size`` keys; a new offer displaces the oldest key not in it."""
    m = CPUOffloadManager(8, "lru", store_threshold=2, tracker_size=2)
    m.prepare_store([1, 2], ctx_for("a", [1, 2]))
    m.prepare_store([2, 3], ctx_for("b", [2, 3]))     # 1 is displaced, 2 reaches 2
    assert list(m.counts.items()) == [(2, 2), (3, 1)]


def test_capacity_from_bytes_aligns_each_chunk_to_a_page():
    """cpu/spec.py: bytes // round_up(bytes per block * world size * blocks per chunk, 4096)."""
    assert num_cpu_chunks(30 * 4096, 4096) == 30
    assert num_cpu_chunks(30 * 4096, 128) == 30               # a 128-byte block still takes a page
    assert num_cpu_chunks(10 * 2**20, 131072, blocks_per_chunk=4, world_size=2) == 10
    assert num_cpu_chunks(100 * 2**30, 131072 * 32) == 25600  # 100 GiB of 4 MiB chunks
    with pytest.raises(ConfigError):
        num_cpu_chunks(0, 4096)


def test_offload_block_must_be_a_multiple_of_the_gpu_block():
    with pytest.raises(ConfigError, match="multiple"):
        OffloadSettings(num_chunks=4, block_size=24)
    assert OffloadSettings(num_chunks=4, block_size=64).blocks_per_chunk == 4


def test_instant_worker_reports_loads_now_and_stores_next_step():
    w = InstantWorker()
    done, recv = w.step(ConnectorMeta({0: [1]}, {1: [2]}, set(), {0: "r"}))
    assert done == [0] and recv == {"r"}
    done, _ = w.step(ConnectorMeta({}, {2: [3]}, {2}))          # flushed: now
    assert sorted(done) == [1, 2]
