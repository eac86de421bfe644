"""kvsim's LMCache storage model against the REAL LMCache 0.5.6 engine (``docs/engines/offload.md §5``).

``LMCacheEngineBuilder.get_or_create`` with LMCache's own ``MockGPUConnector`` and the local
CPU backend (the token database, storage manager, allocator and LRU policy are LMCache's):
random scripts of vLLM-style lookups (pinned, then unpinned later), stores past the hit
(the adapter's ``wait_for_save`` mask), and plain lookups, over shared prefixes and
multi-turn continuations, under pressure; chunk sizes whose slots are and are not a
multiple of 4 KiB, with and without ``save_unfull_chunk``. After every operation the hit
and the CPU tier's chunks in LRU order are equal.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "oracle"))
import offload_runs  # noqa: E402
from offload_lmcache_ops import chunk_ids  # noqa: E402

from kvsim.tiers.lmcache import LMCacheStorage, num_cpu_chunks  # noqa: E402

pytestmark = pytest.mark.oracle


@pytest.fixture(scope="module")
def real():
    runs = offload_runs.all_systems()
    if "skip" in runs:
        pytest.skip(runs["skip"])
    if not runs["lmcache"]:
        pytest.skip(runs["lmcache_skip"])
    return runs["lmcache"]


def kvsim_log(job: dict) -> list:
    """The script through kvsim's storage, logged as the driver logs the real engine."""
    chunk, unfull = job["chunk_size"], job["save_unfull_chunk"]
    storage = LMCacheStorage(num_cpu_chunks(job["max_local_cpu_size"], job["chunk_bytes"]))
    log, last = [], 0
    for op in job["script"]:
        if op[0] == "lookup":
            _, tokens, rid, pin = op
            hit = storage.lookup(chunk_ids(tokens, chunk, unfull), rid, pin)
            last = min(hit * chunk, len(tokens))
            log.append(["lookup", rid, last])
        elif op[0] == "store":
            _, tokens, skip = op
            skip = last // chunk if skip < 0 else skip
            storage.store(chunk_ids(tokens, chunk, unfull)[skip:])
            log.append(["store"])
        else:
            storage.lookup_unpin(op[1])
            log.append(["unpin"])
        log[-1].append(list(storage.cpu.chunks))
    return log


def test_storage_equals_the_real_engine_after_every_operation(real):
    """Same hits, same chunks in the same LRU order, after every lookup, store and unpin."""
    hits = evictions = 0
    for job, res in real:
        got, want = json.loads(json.dumps(kvsim_log(job))), res["log"]
        first = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), None)
        assert got == want, f"{job['chunk_bytes']} B chunks: op {first}: {job['script'][first][0]}: " \
                            f"kvsim {got[first]}, LMCache {want[first]}"
        hits += sum(e[2] for e in want if e[0] == "lookup")
        resident = [len(e[-1]) for e in want]
        evictions += sum(1 for a, b, e in zip(resident, resident[1:], want[1:]) if e[0] == "store" and b <= a)
    assert hits > 1000 and evictions > 50, (hits, evictions)


def test_capacity_in_chunks_follows_the_4096_byte_slots(real):
    """The most chunks the CPU tier ever held is max_local_cpu_size // round_up(chunk bytes, 4096)."""
    for job, res in real:
        assert res["most_chunks"] == num_cpu_chunks(job["max_local_cpu_size"], job["chunk_bytes"])
    slots = {(j["chunk_bytes"], round(j["max_local_cpu_size"] * 2**30 / 4096)): r["most_chunks"] for j, r in real}
    assert slots[(6016, 12)] == 6          # an 8 KiB slot for a 6016-byte chunk: half the chunks
    assert slots[(2048, 14)] == 14         # a 2 KiB chunk still takes a 4 KiB slot
