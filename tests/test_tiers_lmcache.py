"""LMCache 0.5.6 as kvsim models it: the acceptance scenarios of ``docs/engines/offload.md
offload.md §2.8`` with exact numbers, and the vLLM adapter's arithmetic (``need``, saves) by hand.

The storage rules are checked against the real engine in ``test_tiers_lmcache_oracle.py``;
the adapter's arithmetic is re-stated from ``integration/vllm/vllm_v1_adapter.py``.
"""
from __future__ import annotations

import pytest

from kvsim.errors import ConfigError
from kvsim.tiers.lmcache import (LMCacheSettings, LMCacheStorage, LRUTier, SaveTracker, chunk_keys, need_tokens,
                                 num_cpu_chunks)

C = 16
A = list(range(1000, 1064))
B = list(range(2000, 2064))


def serve(storage: LMCacheStorage, rid: str, prompt: list[int], local: int = 0,
          settings: LMCacheSettings | None = None) -> tuple[int, int]:
    """One request as vLLM's LMCache connector handles it: a pinned lookup, ``need``, then the
    save of the prompt's full chunks past what LMCache held, and the unpin."""
    s = settings or LMCacheSettings(chunk_bytes=4096, chunk_size=C)
    keys = chunk_keys(prompt, C)
    hit = min(storage.lookup(keys, rid, pin=True) * C, len(prompt))
    need, held = need_tokens(hit, local, len(prompt), s)
    save = SaveTracker(len(prompt), held, s).step(len(prompt), len(prompt) - local - need, first=True)
    storage.lookup_unpin(rid)
    if save is not None:
        storage.store(keys[save[0] // C:save[1] // C])
    return hit, need


def test_l1_hits_and_the_full_prompt_rule():
    """L1: A(64)+8 | B(64)+16 | A+16 | A[:32] | B[:48]+5 -> hits 0, 0, 64, 32, 48; the
    full-prompt hit of request 3 loads 32 - 0 - 1 = 31."""
    storage = LMCacheStorage(cpu_chunks=100)
    prompts = [A + list(range(8)), B + list(range(16)), A + list(range(50, 66)), A[:32], B[:48] + [7] * 5]
    out = [serve(storage, str(i), p) for i, p in enumerate(prompts)]
    assert [h for h, _ in out] == [0, 0, 64, 32, 48]
    assert [n for _, n in out] == [0, 0, 64, 31, 48]


def test_l2_lru_eviction():
    """L2: with 6 CPU chunks, request 1's 5 chunks push A's head out: request 2 hits 0."""
    storage = LMCacheStorage(cpu_chunks=6)
    serve(storage, "0", A + list(range(8)))
    serve(storage, "1", B + list(range(16)))
    assert storage.cpu.evictions == 3
    assert serve(storage, "2", A + list(range(50, 66)))[0] == 0


def test_l3_need_arithmetic():
    """L3, chunk 256: need = hit - GPU hit (minus one on a full-prompt hit), floored at 0,
    zeroed below min_retrieve_tokens."""
    s = LMCacheSettings(chunk_bytes=4096)
    assert need_tokens(256, 48, 300, s) == (208, 256)
    assert need_tokens(512, 0, 512, s) == (511, 512)
    assert need_tokens(256, 288, 300, s) == (0, 256)
    assert need_tokens(256, 48, 300, LMCacheSettings(chunk_bytes=4096, min_retrieve_tokens=256)) == (0, 256)


def test_max_tokens_per_load_caps_to_whole_chunks():
    """The cap rounds down to chunks and LMCache then counts only the chunks up to it as held;
    min_retrieve_tokens is judged on the uncapped need."""
    s = LMCacheSettings(chunk_bytes=4096, max_tokens_per_load=600)
    assert need_tokens(1024, 0, 2000, s) == (512, 512)
    assert need_tokens(1024, 100, 2000, s) == (512, 512)       # (100 + 512) // 256 * 256
    both = LMCacheSettings(chunk_bytes=4096, max_tokens_per_load=300, min_retrieve_tokens=400)
    assert need_tokens(1024, 0, 2000, both) == (256, 256)


def test_l4_a_hit_spans_tiers():
    """L4: each tier continues where the previous one stopped; a tier with none is skipped."""
    disk = LRUTier("LocalDiskBackend", 100)
    storage = LMCacheStorage(cpu_chunks=100, more=[disk])
    k = chunk_keys(list(range(64)), C)
    for key in k[:2]:
        storage.cpu.put(key)
    for key in k:
        disk.put(key)
    assert storage.lookup(k) == 4
    storage.cpu.chunks.clear()
    for key in k[2:]:
        storage.cpu.put(key)
    disk.chunks.clear()
    for key in k[:2]:
        disk.put(key)
    assert storage.lookup(k) == 2
    assert [(t.name, n) for t, n in storage.batched_contains(k)] == [("LocalDiskBackend", 2)]


def test_keys_chain_tokens_only_and_drop_the_partial_tail():
    """A chunk's key names its whole prefix; equal prefixes, equal keys; no LoRA or salt in
    it; the partial tail has a key only with save_unfull_chunk."""
    x, y = list(range(40)), list(range(32)) + [99] * 8
    assert chunk_keys(x, C) == chunk_keys(x[:32] + [5] * 3, C)
    assert chunk_keys(x, C)[:2] == chunk_keys(y, C)[:2] and len(chunk_keys(x, C)) == 2
    assert chunk_keys([9] + x[1:32], C)[1] != chunk_keys(x, C)[1]       # chained: a different head
    assert len(chunk_keys(x, C, save_unfull_chunk=True)) == 3


def test_a_pinned_chunk_is_not_evicted_and_a_full_pool_ends_the_store():
    storage = LMCacheStorage(cpu_chunks=2)
    k = chunk_keys(list(range(48)), C)
    storage.store(k[:2])
    assert storage.lookup(k, "r", pin=True) == 2
    res = storage.store([10, 11])
    assert res.dropped == [10, 11] and list(storage.cpu.chunks) == [k[1], k[0]]   # touched tail first
    storage.lookup_unpin("r")
    assert storage.store([10]).stored == [10] and list(storage.cpu.chunks) == [k[0], 10]


def test_a_pinned_lookup_makes_the_head_most_recent():
    """vLLM's lookup moves its hits to the recent end tail first: the head is evicted last."""
    storage = LMCacheStorage(cpu_chunks=4)
    k = chunk_keys(list(range(48)), C)
    storage.store(k)
    storage.store([7])
    storage.lookup(k, "r", pin=True)
    assert list(storage.cpu.chunks) == [7, k[2], k[1], k[0]]
    assert storage.lookup(k[:1], "q") == 1 and list(storage.cpu.chunks)[-1] == k[0]   # unpinned: no move


def test_save_rule_chunked_prefill_and_decode():
    """Saves at chunk boundaries as the prompt is computed, nothing in decode by default;
    a prompt whose next boundary lies past it saves nothing after a hit."""
    s = LMCacheSettings(chunk_bytes=4096)
    t = SaveTracker(600, 0, s)
    assert t.step(300, 300, first=True) == (0, 256)
    assert t.step(600, 300) == (256, 512)
    assert t.step(601, 1) is None
    assert SaveTracker(300, 256, s).step(300, 300, first=True) is None
    unfull = SaveTracker(600, 0, LMCacheSettings(chunk_bytes=4096, save_unfull_chunk=True))
    assert unfull.step(600, 600, first=True) == (0, 600)
    decode = SaveTracker(512, 0, LMCacheSettings(chunk_bytes=4096, save_decode_cache=True))
    assert decode.step(512, 512, first=True) == (0, 512)
    assert decode.step(768, 1) == (512, 768)


def test_capacity_from_bytes():
    assert num_cpu_chunks(5.0, 32 * 2**20) == 160           # Llama-3.1-8B: 32 MiB chunks in 5 GiB
    assert num_cpu_chunks(12 * 4096 / 2**30, 6016) == 6      # an 8 KiB slot each
    with pytest.raises(ConfigError):
        LMCacheSettings(chunk_bytes=0)
