"""Drive the REAL SGLang 0.5.23 scheduler with the hierarchical cache (HiCache) on a CPU.

Runs under the oracle interpreter, never imports kvsim. Usage:
``offload_hicache_driver.py JOBS.json``. The scheduler and its event loop are
``sglang_sched_driver.py``'s (the real ``Scheduler`` methods, ``PrefillAdder``,
``ScheduleBatch``; ``get_next_batch_to_run`` calls ``check_hicache_events()`` and
``get_new_batch_prefill`` calls ``ready_to_load_host_cache()``, as the server does); here
the server args turn ``enable_hierarchical_cache`` on with the job's ``hicache_ratio`` /
``hicache_size`` / ``hicache_write_policy``, the ``direct`` I/O backend and ``layer_first``
layout, and the tree is built as ``mem_cache/registry.py`` builds it: ``UnifiedRadixCache``
(FULL component, Rust core) then ``init_hicache``, which attaches the host pool group
(``MHATokenToKVPoolHost``) and the ``HybridCacheController`` over a real CPU
``MHATokenToKVPool``. Two stubs: ``cudaHostRegister`` (pinning) is a no-op, and
``transfer_kv_direct`` (``sgl_kernel``, absent on a CPU) is a torch index copy per layer.

``mode`` ``"sequential"``: a request is added only when the scheduler is idle and the
host transfers it started are acknowledged; ``"steps"``: arrivals on the step clock.
Per request: ``cached`` (``cached_tokens``), ``device`` / ``host``
(``split_cached_prefix_by_tier``), ``rejected``; per run ``info``: the host pool's size in
tokens and the device pool's.
"""
from __future__ import annotations

import json
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import sglang_sched_driver as base  # noqa: E402  (publishes default server args, imports the scheduler)
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402

import sglang.srt.mem_cache.pool_host.common as pool_host_common  # noqa: E402
import sglang.srt.mem_cache.pool_host.mha as pool_host_mha  # noqa: E402
from sglang.srt.managers.schedule_policy import SchedulePolicy  # noqa: E402
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402


def _transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):
    """sgl_kernel's transfer_kv_direct: copy the rows ``src_indices`` -> ``dst_indices``."""
    for src, dst in zip(src_layers, dst_layers):
        dst[dst_indices.to(dst.device)] = src[src_indices.to(src.device)].to(dst.dtype)


pool_host_common._cuda_host_register = lambda *a, **k: None
pool_host_mha.transfer_kv_direct = _transfer_kv_direct
_ARGS: dict = {}


def publish(job: dict) -> None:
    """The ServerArgs of a HiCache server, published for the scheduler role."""
    chunk = int(job.get("chunked_prefill_size", 8192))
    args = ServerArgs(model_path="dummy", device="cpu", page_size=int(job.get("page_size", 1)),
                      radix_eviction_policy="lru", chunked_prefill_size=chunk,
                      schedule_policy=job.get("schedule_policy", "fcfs"),
                      max_prefill_tokens=int(job.get("max_prefill_tokens", 16384)),
                      max_running_requests=int(job["max_running_requests"]),
                      disable_overlap_schedule=not job.get("overlap", False),
                      random_seed=int(job.get("random_seed", 0)),
                      enable_hierarchical_cache=True, hicache_ratio=float(job.get("hicache_ratio", 2.0)),
                      hicache_size=float(job.get("hicache_size", 0)),
                      hicache_write_policy=job.get("hicache_write_policy", "write_through"),
                      hicache_io_backend="direct", hicache_mem_layout="layer_first")
    set_global_server_args_for_scheduler(args)
    from sglang.srt.runtime_context import get_memory
    get_memory()._set("radix_eviction_policy", "lru")
    _ARGS["args"] = args


def build_cache(job: dict):
    """registry.create_unified_radix_cache with the hierarchical cache on."""
    p, capacity = int(job.get("page_size", 1)), int(job["capacity"])
    context = int(job.get("context_len") or base.MAX_CONTEXT)
    pool = ReqToTokenPool(size=int(job["max_running_requests"]), max_context_len=context + 16, device="cpu",
                          enable_memory_saver=False)
    kv = MHATokenToKVPool(size=capacity, page_size=p, dtype=torch.float32, head_num=1,
                          head_dim=int(job.get("head_dim", 4)), layer_num=int(job.get("layers", 2)), device="cpu",
                          enable_memory_saver=False)
    if p == 1:
        alloc = TokenToKVPoolAllocator(size=capacity, dtype=torch.float32, device="cpu", kvcache=kv, need_sort=False)
    else:
        alloc = PagedTokenToKVPoolAllocator(size=capacity, page_size=p, dtype=torch.float32, device="cpu",
                                            kvcache=kv, need_sort=False)
        alloc.use_triton_kernels = False
    params = CacheInitParams(disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=alloc,
                             page_size=p, eviction_policy="lru", tree_components=(ComponentType.FULL,),
                             tree_core_backend="rust")
    tree = UnifiedRadixCache(params)
    tree.init_hicache(_ARGS["args"], params)
    return tree, alloc, pool


base.publish = publish
base.build_cache = build_cache


class Replay(base.Replay):
    """The base replay with HiCache on, recording each request's device / host split."""

    def __init__(self, job: dict) -> None:
        job.setdefault("chunked_prefill_size", 8192)
        super().__init__(job)
        s = self.s
        s.enable_hierarchical_cache = True
        s.policy = SchedulePolicy(job.get("schedule_policy", "fcfs"), s.tree_cache, True, False, False)
        s.tp_worker.model_runner.forward_stream = torch.cuda.current_stream() if torch.cuda.is_available() else None
        ctrl = s.tree_cache.cache_controller
        ctrl.load_fence_stream = ctrl.write_fence_stream = s.tp_worker.model_runner.forward_stream
        n = self.work.n
        self.device = np.full(n, -1, np.int64)
        self.host = np.full(n, -1, np.int64)

    def process(self, batch, result) -> None:
        done = {r.rid for r in batch.reqs if r.rid in self.live and not r.finished()}
        super().process(batch, result)
        for req in batch.reqs:
            if req.rid in done and req.finished():
                i = int(req.rid)
                self.device[i], self.host[i] = req.cached_tokens_device, req.cached_tokens_host

    def settle(self) -> None:
        """Poll the cache until every host transfer it started is acknowledged."""
        tree = self.s.tree_cache
        for _ in range(100):
            tree.check_hicache_events()
            if not tree.ongoing_backup and not getattr(tree, "ongoing_load_back", None):
                return
        raise AssertionError("host transfers never acknowledged")

    def run(self) -> int:
        if self.job.get("mode", "sequential") != "sequential":
            return super().run()
        step = 0
        for i in range(self.work.n):
            self.settle()
            self.add(i)
            while self.has_work():
                self.iteration(step)
                step += 1
            self.idle()
        self.settle()
        assert not self.live, f"requests never finished: {sorted(self.live)[:5]}"
        return step


def run_job(job: dict) -> None:
    t0 = time.perf_counter()
    r = Replay(job)
    steps = r.run()
    tree = r.s.tree_cache
    host = tree.cache_controller.mem_pool_host
    info = {"host_tokens": int(host.size), "device_tokens": int(r.s.max_total_num_tokens),
            "host_pool": type(host).__name__, "controller": type(tree.cache_controller).__name__}
    np.savez(job["out"], cached=r.cached, device=r.device, host=r.host, rejected=r.rejected, steps=steps,
             first_token_step=r.first, finish_step=r.finish,
             elapsed=time.perf_counter() - t0, info=np.array(json.dumps(info)))


def main() -> None:
    with open(sys.argv[1]) as f:
        jobs = json.load(f)
    for job in jobs:
        run_job(job)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
