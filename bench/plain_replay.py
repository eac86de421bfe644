"""The baseline of bench_ingest.py: a plain script that reads a pre-tokenized JSONL log with
``json.loads`` per line and replays it through the REAL engine code, one request at a time.

Runs under the oracle interpreter (``.oracle-venv/bin/python``), never imports kvsim:

    plain_replay.py LOG.jsonl apc|radix CAPACITY_TOKENS OUT.json

- ``apc``: vLLM 0.33.0's ``KVCacheManager`` (block size 16, ``CAPACITY // 16 + 1`` blocks with
  the null block, sha256 block hashes as vLLM defaults to), driven as its scheduler drives it
  (``tests/oracle/vllm_driver.py``);
- ``radix``: SGLang 0.5.23's ``UnifiedRadixCache`` (what a default server builds; page size 1,
  LRU, overlap scheduler, chunked prefill 4096), driven through the real ``Req``,
  ``PrefillAdder`` and allocator (``tests/oracle/sglang_driver.py``).

Writes the per-request cached tokens and the elapsed seconds (reading included) to OUT.json.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ORACLE = Path(__file__).resolve().parents[1] / "tests" / "oracle"
sys.path.insert(0, str(ORACLE))


def read_log(path: str) -> tuple[list[list[int]], list[list[int]]]:
    prompts, outputs = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            prompts.append(rec["prompt_token_ids"])
            outputs.append(rec.get("output_token_ids") or [0])
    return prompts, outputs


def replay_apc(path: str, capacity: int) -> list[int]:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request
    from vllm_driver import make_manager, serve

    block, blocks = 16, capacity // 16 + 1
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(block, hash_fn)
    manager = make_manager(blocks, block, None)
    prompts, outputs = read_log(path)
    cached = []
    for i, (prompt, out) in enumerate(zip(prompts, outputs)):
        if -(-(len(prompt) + len(out) - 1) // block) > blocks - 1:
            cached.append(0)  # can never fit: rejected, as kvsim and the vLLM driver do
            continue
        request = Request(str(i), prompt, SamplingParams(max_tokens=len(out)), None, block_hasher=hasher)
        assert serve(manager, request, out) == -1
        manager.free(request)
        cached.append(request.prefill_stats.num_cached_tokens)
    return cached


def replay_radix(path: str, capacity: int) -> list[int]:
    import numpy as np
    from sglang_driver import replay

    prompts, outputs = read_log(path)
    offsets = np.cumsum([0] + [len(p) for p in prompts])
    out_offsets = np.cumsum([0] + [len(o) for o in outputs])
    w = {"prompt_tok": np.fromiter((t for p in prompts for t in p), np.int64, int(offsets[-1])),
         "prompt_off": offsets,
         "out_tok": np.fromiter((t for o in outputs for t in o), np.int64, int(out_offsets[-1])),
         "out_off": out_offsets, "lora": np.full(len(prompts), -1), "salt": np.full(len(prompts), -1),
         "return_logprob": np.zeros(len(prompts), bool), "logprob_start": np.full(len(prompts), -1),
         "names": []}
    cfg = dict(tree="unified", page_size=1, eviction_policy="lru", capacity=capacity,
               max_context_len=int(max(map(len, prompts)) + max(map(len, outputs)) + 8), overlap=True,
               chunked_prefill_size=4096, finish="length", max_new_tokens=None, eviction_policy_config=None)
    return [int(c) for c in replay(cfg, w)["cached"]]


def main() -> None:
    path, policy, capacity, out = sys.argv[1], sys.argv[2], int(float(sys.argv[3])), sys.argv[4]
    t0 = time.perf_counter()
    cached = replay_apc(path, capacity) if policy == "apc" else replay_radix(path, capacity)
    elapsed = time.perf_counter() - t0
    Path(out).write_text(json.dumps({"elapsed_s": elapsed, "cached": cached}))


if __name__ == "__main__":
    main()
