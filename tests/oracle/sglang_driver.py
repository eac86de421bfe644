"""Drive the REAL SGLang 0.5.23 prefix cache the way its scheduler does, one request at a time.

Runs under the oracle interpreter (``.oracle-venv/bin/python``), never under kvsim's venv.

    sglang_driver.py WORKLOAD.npz [WORKLOAD.npz ...] --out RESULT.json

Each workload file holds the requests (prompt and output token ids, LoRA / cache-salt
namespace) and a JSON list of configurations. For every configuration the driver builds
a fresh tree of the requested class with the real allocator and request-to-token pool,
then replays the requests in order through the scheduler's own call sequence for a lone
request (``scheduler.event_loop_normal`` / ``event_loop_overlap`` with an empty waiting
queue between requests), calling SGLang's real functions wherever they exist:

1. ``SchedulePolicy.calc_priority`` (fcfs; refreshes waiting prefixes every 32nd pass)
2. ``Req.init_next_round_input`` (the len-1, page-aligned match, capped at a logprob
   request's ``logprob_start_len`` as ``handle_generate_request`` sets it)
3. ``PrefillAdder.add_one_req`` / ``add_chunked_req`` (admission, lock, chunking)
4. ``alloc_token_slots`` / ``alloc_paged_token_slots_extend`` (evict, allocate)
5. after the prefill ``checkpoint_kv_cache`` (the prompt enters the tree), or
   ``release_kv_cache`` if the request already finished; chunks are stashed with
   ``checkpoint_kv_cache`` at the start of the next pass
6. per decode step ``check_decode_mem`` then ``alloc_token_slots`` /
   ``alloc_paged_token_slots_decode``; with the overlap scheduler the first decode step
   is prepared before the prefill result (and so before the prompt checkpoint)
7. on the last token ``release_kv_cache(checkpoint=True)``

Only the glue between those calls (building the batch tensors, writing the request's
row) is written here, following ``alloc_for_extend`` / ``alloc_for_decode_default``.
The classic ``RadixCache`` reads ``time.monotonic()``; it is replaced by a counter so
that timestamp ties cannot depend on the machine's clock resolution.
"""
from __future__ import annotations

import json
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("SGLANG_DISABLE_REQUEST_LOGGING", "1")

from array import array  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402


def _publish(page_size: int, policy: str, chunked_prefill_size: int) -> None:
    args = ServerArgs(model_path="dummy", page_size=page_size, device="cpu",
                      radix_eviction_policy=policy if policy in ("lru", "lfu", "slru", "priority", "tlru") else "lru",
                      chunked_prefill_size=chunked_prefill_size)
    set_global_server_args_for_scheduler(args)
    # non-CLI policies (fifo, mru, filo) are only reachable through CacheInitParams;
    # the scheduler's waiting-prefix refresh reads this field, so mirror the choice.
    from sglang.srt.runtime_context import get_memory
    get_memory()._set("radix_eviction_policy", policy)


_publish(1, "lru", 4096)

from sglang.srt.managers.schedule_batch import Req  # noqa: E402
from sglang.srt.managers.schedule_policy import PrefillAdder, SchedulePolicy  # noqa: E402
from sglang.srt.mem_cache import radix_cache as radix_cache_module  # noqa: E402
from sglang.srt.mem_cache.allocation import (  # noqa: E402
    alloc_paged_token_slots_decode,
    alloc_paged_token_slots_extend,
    alloc_token_slots,
)
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402

CLIP_MAX_NEW_TOKENS = 4096
SYNTHETIC_BASE = 1 << 40   # above every real token id


class _Clock:
    """Stand-in for time.monotonic in radix_cache.py: strictly increasing."""

    def __init__(self) -> None:
        self.t = 0.0

    def monotonic(self) -> float:
        self.t += 1.0
        return self.t

    perf_counter = staticmethod(time.perf_counter)


def build_cache(cfg: dict, capacity: int):
    p = int(cfg["page_size"])
    policy = cfg["eviction_policy"]
    _publish(p, policy, int(cfg.get("chunked_prefill_size", 4096)))
    pool = ReqToTokenPool(size=4, max_context_len=int(cfg["max_context_len"]), device="cpu",
                          enable_memory_saver=False)
    if p == 1:
        alloc = TokenToKVPoolAllocator(size=capacity, dtype=torch.bfloat16, device="cpu",
                                       kvcache=None, need_sort=False)
    else:
        alloc = PagedTokenToKVPoolAllocator(size=capacity, page_size=p, dtype=torch.bfloat16,
                                            device="cpu", kvcache=None, need_sort=False)
        alloc.use_triton_kernels = False
    policy_config = cfg.get("eviction_policy_config") or None
    tree = cfg["tree"]
    if tree == "radix":
        radix_cache_module.time = _Clock()  # module-level time source of RadixCache
        params = CacheInitParams(disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc,
                                 page_size=p, eviction_policy=policy, eviction_policy_config=policy_config)
        cache = RadixCache(params)
    else:
        backend = {"unified": "rust", "unified-rust": "rust", "unified-python": "python"}[tree]
        params = CacheInitParams(disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc,
                                 page_size=p, eviction_policy=policy, eviction_policy_config=policy_config,
                                 tree_components=(ComponentType.FULL,), tree_core_backend=backend)
        cache = UnifiedRadixCache(params)
        assert type(cache.tree_core).__name__ == ("RustUnifiedTreeCore" if backend == "rust" else "UnifiedTreeCore")
    return cache, alloc, pool


class Counters:
    """Evicted tokens and leaves, counted where the cache frees tree values."""

    def __init__(self, cache) -> None:
        self.tokens = 0
        self.leaves = 0
        if isinstance(cache, RadixCache):
            orig_delete = cache._delete_leaf

            def delete_leaf(node):
                self.leaves += 1
                self.tokens += len(node.value)
                return orig_delete(node)
            cache._delete_leaf = delete_leaf
        else:
            orig_evict = cache._evict

            def evict(params, *a, **kw):
                res = orig_evict(params, *a, **kw)
                self.tokens += res.num_tokens_evicted
                return res
            cache._evict = evict
            orig_leaf = cache._evict_device_leaf

            def evict_leaf(node_id, tracker):
                self.leaves += 1
                return orig_leaf(node_id, tracker)
            cache._evict_device_leaf = evict_leaf


def _write_row(pool, req, start: int, values: torch.Tensor) -> None:
    pool.write((req.kv.req_pool_idx, slice(start, start + len(values))), values.to(torch.int32))


def run_extend(cache, alloc, pool, req) -> None:
    """alloc_for_extend for a batch holding one request (mem_cache/allocation.py)."""
    p = alloc.page_size
    if req.kv.holds_kv:
        prefix = pool.req_to_token[req.kv.req_pool_idx][: req.prefix_len].to(torch.int64)
    else:
        prefix = (cache.prefix_device_indices(req) if req.prefix_len > 0
                  else torch.empty((0,), dtype=torch.int64))
        pool.alloc([req])
    prefix_len, seq_len = req.prefix_len, req.extend_end
    extend = seq_len - prefix_len
    if p == 1:
        out = alloc_token_slots(cache, extend)
    else:
        last_loc = prefix[-1:] if len(prefix) > 0 else torch.full((1,), -1, dtype=torch.int64)
        t = lambda x: torch.tensor([x], dtype=torch.int64)  # noqa: E731
        out = alloc_paged_token_slots_extend(
            tree_cache=cache, prefix_lens=t(prefix_len), prefix_lens_cpu=t(prefix_len),
            seq_lens=t(seq_len), seq_lens_cpu=t(seq_len), last_loc=last_loc.to(torch.int64),
            extend_num_tokens=extend)
    _write_row(pool, req, 0, prefix)
    _write_row(pool, req, prefix_len, out)
    req.kv.kv_allocated_len = seq_len
    req.kv.kv_committed_len = seq_len


def run_decode_step(cache, alloc, pool, req) -> None:
    """update_running_batch + prepare_for_decode for a batch holding one request."""
    p = alloc.page_size
    c = req.kv.kv_committed_len
    need = p if c % p == 0 else 0                       # new_tokens_required_next_decode
    ok = alloc.check_decode_capacity(num_tokens=need, tree_cache=cache)
    assert ok, "decode out of memory for a lone request"
    if p == 1:
        out = alloc_token_slots(cache, 1)
    else:
        row = pool.req_to_token[req.kv.req_pool_idx]
        last_loc = row[c - 1: c].to(torch.int64)
        out = alloc_paged_token_slots_decode(
            tree_cache=cache, seq_lens=torch.tensor([c + 1]), seq_lens_cpu=torch.tensor([c + 1]),
            last_loc=last_loc)
    _write_row(pool, req, c, out)
    req.kv.kv_allocated_len += 1
    req.kv.kv_committed_len += 1


def new_adder(cache, alloc, cfg):
    chunk = int(cfg.get("chunked_prefill_size", 4096))
    return PrefillAdder(
        alloc.page_size, cache, alloc, None, 0.7, 16384, chunk if chunk > 0 else None,
        max_running_requests=None)


def replay(cfg: dict, w: dict) -> dict:
    capacity = int(cfg["capacity"])
    cache, alloc, pool = build_cache(cfg, capacity)
    overlap = bool(cfg.get("overlap", True))
    stop_finish = cfg.get("finish", "length") == "stop"
    cap = cfg.get("max_new_tokens")           # the client's max_tokens in stop mode
    policy = SchedulePolicy("fcfs", cache, False, False, False)
    counters = Counters(cache)
    n = len(w["prompt_off"]) - 1
    out = {k: [] for k in ("cached", "rejected", "aborted", "evicted_tokens", "evicted_leaves",
                           "max_new", "available", "tree_total", "evictable")}
    hit_tokens = 0
    input_tokens = 0
    for i in range(n):
        prompt = w["prompt_tok"][w["prompt_off"][i]:w["prompt_off"][i + 1]].tolist()
        outputs = w["out_tok"][w["out_off"][i]:w["out_off"][i + 1]].tolist()
        lora = w["names"][w["lora"][i]] if w["lora"][i] >= 0 else None
        salt = w["names"][w["salt"][i]] if w["salt"][i] >= 0 else None
        tok0, lv0 = counters.tokens, counters.leaves
        if stop_finish:   # ends with a stop token after its logged output, unless capped
            wanted = (1 << 30) if cap is None else int(cap)
            sampling = SamplingParams(temperature=0, max_new_tokens=wanted, ignore_eos=False)
        else:             # ends by length (ignore_eos, max_tokens = logged output length)
            sampling = SamplingParams(temperature=0, max_new_tokens=len(outputs), ignore_eos=True)
        sampling.normalize(None)
        req = Req(rid=str(i), origin_input_text="", origin_input_ids=array("q", prompt),
                  sampling_params=sampling, lora_id=lora, cache_salt=salt,
                  return_logprob=bool(w["return_logprob"][i]))
        # Scheduler.init_req_max_new_tokens: clip generation to the empty pool
        req.sampling_params.max_new_tokens = alloc.max_new_tokens_for_memory(
            len(prompt), req.sampling_params.max_new_tokens, token_capacity=capacity,
            sliding_window_size=None, chunk_size=None)
        max_new = req.sampling_params.max_new_tokens
        out["max_new"].append(max_new)
        set_logprob_start(req, int(w["logprob_start"][i]))
        out["aborted"].append(req.to_finish is not None)
        # -- the prefill pass: calc_priority, match, admission -----------------------
        policy.calc_priority([req], None)
        req.init_next_round_input(cache)
        adder = new_adder(cache, alloc, cfg)
        adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
        if not adder.can_run_list:
            out["rejected"].append(True)
            out["cached"].append(0)
        else:
            out["rejected"].append(False)
            out["cached"].append(req.prefix_len)
            hit_tokens += adder.log_hit_tokens
            input_tokens += adder.log_input_tokens
            chunked = adder.new_chunked_req is not None
            run_extend(cache, alloc, pool, req)
            while chunked:  # next pass: stash the chunk, then schedule the rest
                checkpoint_kv_cache(req, cache)
                adder = new_adder(cache, alloc, cfg)
                req.init_next_round_input()
                chunked = adder.add_chunked_req(req) is not None
                input_tokens += adder.log_input_tokens
                run_extend(cache, alloc, pool, req)
            finish_prefill_and_decode(cache, alloc, pool, req, outputs, overlap, stop_finish)
        out["evicted_tokens"].append(counters.tokens - tok0)
        out["evicted_leaves"].append(counters.leaves - lv0)
        out["available"].append(int(alloc.available_size()))
        total = cache.total_size()
        out["tree_total"].append(int(total[0] if isinstance(total, tuple) else total))
        out["evictable"].append(int(cache.evictable_size()))
    out["log_hit_tokens"] = hit_tokens
    out["log_input_tokens"] = input_tokens
    out["paths"] = tree_paths(cache)
    return out


def set_logprob_start(req, start: int) -> None:
    """Scheduler.handle_generate_request: the logprob start, after the max_new clip."""
    return_logprob = req.return_logprob
    if not return_logprob and start != -1:
        start = -1   # ignored without return_logprob
    if start == -1:
        # logprobs of the output only (token_ids_logprob is None), or none at all
        req.logprob_start_len = len(req.origin_input_ids) if return_logprob else -1
    else:
        req.logprob_start_len = start
    if req.logprob_start_len > len(req.origin_input_ids):
        req.logprob_start_len = -1
        from sglang.srt.runtime_context import get_parallel
        with get_parallel().override(tp_rank=0):   # it logs the error on rank 0
            req.set_finish_with_abort("logprob_start_len is higher than the number of input tokens")


def tree_paths(cache) -> list | None:
    """Each node as the edge lengths from the root down to it (Python trees only)."""
    if isinstance(cache, RadixCache):
        root = cache.root_node
    elif type(cache.tree_core).__name__ == "UnifiedTreeCore":
        root = cache.tree_core.root_node
    else:
        return None   # the Rust core does not expose its nodes
    paths = []

    def walk(node, prefix):
        for child in node.children.values():
            path = prefix + [len(child.key)]
            paths.append(path)
            walk(child, path)
    walk(root, [])
    return sorted(paths)


def _sample(req, outputs: list[int], stop_finish: bool) -> None:
    """process_batch_result_*: append the sampled token and check the finish."""
    j = len(req.output_ids)
    tok = outputs[j] if j < len(outputs) else 0
    if tok < 0:
        # kvsim synthesizes unknown replies as distinct negative ids that match nothing;
        # SGLang would take a negative id for a NaN and stop, so shift them out of range
        tok = SYNTHETIC_BASE - tok
    req.output_ids.append(tok)
    if stop_finish and j + 1 == len(outputs):
        req.eos_token_ids = {tok}       # the logged reply ends here with a stop token
    req.update_finish_state()
    req.eos_token_ids = None


def finish_prefill_and_decode(cache, alloc, pool, req, outputs, overlap: bool, stop_finish: bool) -> None:
    """The prefill result, the decode steps and the release, in the event loop's order."""
    if not overlap:  # event_loop_normal: each result is processed before the next batch
        _sample(req, outputs, stop_finish)
        if req.finished():
            release_kv_cache(req, cache, checkpoint=True)
            return
        checkpoint_kv_cache(req, cache)
        while True:
            run_decode_step(cache, alloc, pool, req)
            _sample(req, outputs, stop_finish)
            if req.finished():
                release_kv_cache(req, cache, checkpoint=True)
                return
    # event_loop_overlap: the next decode batch is built before the last result is
    # processed, unless that result finishes the request by length (skip-finishing-decode)
    pending_prefill = True
    while True:
        if not req.next_output_finishes_by_length():
            run_decode_step(cache, alloc, pool, req)
        _sample(req, outputs, stop_finish)
        if req.finished():
            release_kv_cache(req, cache, checkpoint=True)
            return
        if pending_prefill:
            checkpoint_kv_cache(req, cache)
            pending_prefill = False


def load_workload(path: str) -> tuple[dict, list[dict]]:
    z = np.load(path, allow_pickle=False)
    w = {k: z[k] for k in ("prompt_tok", "prompt_off", "out_tok", "out_off", "lora", "salt",
                           "return_logprob", "logprob_start")}
    w["names"] = json.loads(str(z["names"]))
    configs = json.loads(str(z["configs"]))
    return w, configs


def main(argv: list[str]) -> int:
    out_path = argv[argv.index("--out") + 1]
    inputs = [a for a in argv[1:argv.index("--out")]]
    results: dict[str, list[dict]] = {}
    for i, path in enumerate(inputs):
        w, configs = load_workload(path)
        results[str(i)] = []
        for cfg in configs:
            t0 = time.perf_counter()
            res = replay(cfg, w)
            res["elapsed_s"] = time.perf_counter() - t0
            res["config"] = cfg
            results[str(i)].append(res)
    with open(out_path, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
