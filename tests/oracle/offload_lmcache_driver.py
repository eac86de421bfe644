"""Drive the REAL LMCache 0.5.6 engine on a CPU: ``LMCacheEngine`` with the local CPU backend.

Runs under the oracle interpreter, never imports kvsim. Usage:
``offload_lmcache_driver.py JOBS.json``; each job (``kind`` ``"storage"``) builds an engine
with ``LMCacheEngineBuilder.get_or_create`` (LMCache's own ``MockGPUConnector``, which
moves no data; everything else, token database, storage manager, allocator, LRU policy,
is the real code), with ``chunk_size``, ``max_local_cpu_size`` (GiB), ``save_unfull_chunk``
and a mock KV shape of ``chunk_bytes`` per chunk, then applies a script of
:mod:`offload_lmcache_ops`: ``lookup`` -> ``engine.lookup(tokens, lookup_id=, pin=)`` (vLLM's
lookup server pins), ``store`` -> ``engine.store(tokens, mask=...)`` as the vLLM adapter's
``wait_for_save`` does (the first chunks masked off), ``unpin`` -> ``engine.lookup_unpin``.
It writes, per operation, the hit (lookups) and the local CPU tier's chunks in LRU order
(named by :func:`offload_lmcache_ops.prefix_id`), plus ``capacity`` (slots of the
allocator) to ``out`` as JSON.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import traceback
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from lmcache.v1.cache_engine import LMCacheEngineBuilder  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.gpu_connector.mock_gpu_connector import MockGPUConnector  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402
from offload_lmcache_ops import chunk_ids  # noqa: E402

logging.disable(logging.WARNING)


def kv_shape(chunk: int, chunk_bytes: int) -> tuple[int, int, int, int, int]:
    """(layers, K/V, chunk tokens, heads, head dim) of fp32 with ``chunk_bytes`` per chunk."""
    per_token = chunk_bytes // (2 * chunk * 4)
    assert per_token * 2 * chunk * 4 == chunk_bytes, "chunk_bytes must be a multiple of 8 * chunk"
    return (1, 2, chunk, per_token, 1)


def make_engine(job: dict, name: str):
    chunk = int(job["chunk_size"])
    shape = kv_shape(chunk, int(job["chunk_bytes"]))
    cfg = LMCacheEngineConfig.from_defaults(chunk_size=chunk, local_cpu=True,
                                            max_local_cpu_size=float(job["max_local_cpu_size"]),
                                            save_unfull_chunk=bool(job.get("save_unfull_chunk", False)),
                                            cache_policy="LRU")
    meta = LMCacheMetadata(model_name="kvsim-oracle", world_size=1, local_world_size=1, worker_id=0,
                           local_worker_id=0, kv_dtype=torch.float32, kv_shape=shape, chunk_size=chunk)
    engine = LMCacheEngineBuilder.get_or_create(name, cfg, meta, MockGPUConnector(shape), None, None)
    engine.post_init()
    return engine


def run_storage_job(job: dict, k: int) -> None:
    with open(job["script"]) as f:
        script = json.load(f)
    chunk = int(job["chunk_size"])
    unfull = bool(job.get("save_unfull_chunk", False))
    engine = make_engine(job, f"kvsim-{k}")
    backend = engine.storage_manager.storage_backends["LocalCPUBackend"]
    names: dict[int, int] = {}            # LMCache chunk hash -> prefix id

    def name_chunks(tokens):
        for (_, _, h), pid in zip(engine.token_database.process_tokens(tokens, make_key=False),
                                  chunk_ids(tokens, chunk, unfull)):
            names[h] = pid

    log, last_hit, most = [], 0, 0
    for op in script:
        kind = op[0]
        if kind == "lookup":
            _, tokens, rid, pin = op
            name_chunks(tokens)
            last_hit = engine.lookup(tokens, lookup_id=rid, pin=bool(pin))
            log.append(["lookup", rid, last_hit])
        elif kind == "store":
            _, tokens, skip = op
            name_chunks(tokens)
            skip = last_hit // chunk if skip < 0 else skip
            end = len(tokens) if unfull else len(tokens) // chunk * chunk
            if skip * chunk < end:
                mask = torch.ones(end, dtype=torch.bool)
                mask[:skip * chunk] = False
                engine.store(tokens[:end], mask=mask, kvcaches=None, slot_mapping=torch.arange(end))
            log.append(["store"])
        elif kind == "unpin":
            engine.lookup_unpin(op[1])
            log.append(["unpin"])
        else:
            raise ValueError(kind)
        hot = [names[key.chunk_hash] for key in backend.hot_cache]
        most = max(most, len(hot))
        log[-1].append(hot)
    with open(job["out"], "w") as f:
        json.dump({"log": log, "most_chunks": most}, f)


def main() -> None:
    code = 1
    try:
        with open(sys.argv[1]) as f:
            jobs = json.load(f)
        for k, job in enumerate(jobs):
            run_storage_job(job, k)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)   # the engines' background threads would keep the process alive


if __name__ == "__main__":
    main()
