"""Drive the REAL vLLM 0.33.0 CPU offloading: its manager alone, or the whole v1 scheduler.

Runs under the oracle interpreter, never imports kvsim. Usage:
``offload_vllm_driver.py JOBS.json``; each job has ``kind``:

- ``"manager"``: a script of :mod:`offload_manager_ops` applied to the real
  ``CPUOffloadingManager`` (``capacity`` chunks, ``policy`` lru|arc, ``store_threshold``,
  ``tracker_size``); writes the answer log as JSON to ``out``.
- ``"sched"``: a workload ``.npz`` (``offload_client.write_workload``) replayed through the
  real ``Scheduler`` built with ``KVTransferConfig(kv_connector="OffloadingConnector",
  kv_role="kv_both", kv_connector_extra_config=...)``: the real connector scheduler and
  manager, and a fake worker that completes transfers instantly, as the real
  ``OffloadingConnectorWorker`` would with transfers that take no time (loads reported
  in the step they are issued, stores one step later; flushed stores at once). Only
  ``get_worker()`` refuses a CPU, and it is never called on the scheduler side.
  ``mode`` ``"sequential"``: each request is added after the previous one finished and
  the engine has nothing left to do (its stores completed); ``"steps"``: arrivals on a
  step clock, as ``vllm_sched_driver.py``. Per request: ``local`` / ``external`` (its
  first ``prefill_stats``), ``first_token_step``, ``finish_step``, ``preemptions``,
  ``rejected``; per run: ``counters`` (stores, chunks stored, loads, store failures,
  evictions, threshold skips). With ``record`` the connector calls the scheduler made,
  and what they returned, are written to ``out + ".calls.json"`` (block hashes as ints,
  numbered by first appearance) for replaying kvsim's connector on the same calls.
- ``"storage"``: an LMCache job of ``offload_lmcache_driver.py``, run in this process;
- ``"hicache"``: a SGLang HiCache job of ``offload_hicache_driver.py``, run in this process.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections import deque

warnings.filterwarnings("ignore")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import logging  # noqa: E402

import numpy as np  # noqa: E402

from offload_manager_ops import interpret  # noqa: E402
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402

MAX_MODEL_LEN = 1 << 16
BATCH_QUEUE_SIZE = 2


# -- the manager alone ----------------------------------------------------------------
class RealManager:
    """The script adapter over vLLM's CPUOffloadingManager (int keys <-> OffloadKey bytes)."""

    ANSWER = {LookupResult.HIT: "hit", LookupResult.HIT_PENDING: "pending", LookupResult.MISS: "miss"}

    def __init__(self, job: dict) -> None:
        self.m = CPUOffloadingManager(num_chunks=int(job["capacity"]), cache_policy=job.get("policy", "lru"),
                                      store_threshold=int(job.get("store_threshold", 0)),
                                      max_tracker_size=int(job.get("tracker_size", 64_000)))
        self.ctx: dict[str, ReqContext] = {}

    @staticmethod
    def key(k: int):
        return make_offload_key(int(k).to_bytes(32, "big"), 0)

    @staticmethod
    def unkey(key) -> int:
        return int.from_bytes(key[:-4], "big")

    def new(self, rid, positions):
        ctx = ReqContext(req_id=rid)
        for k, p in positions.items():
            ctx.set_offload_key_position(self.key(k), p)
        self.ctx[rid] = ctx
        self.m.on_new_request(ctx)

    def lookup(self, rid, k):
        return self.ANSWER[self.m.lookup(self.key(k), self.ctx[rid])]

    def prepare_load(self, rid, keys):
        self.m.prepare_load([self.key(k) for k in keys], self.ctx[rid])

    def complete_load(self, rid, keys):
        self.m.complete_load([self.key(k) for k in keys], self.ctx[rid])

    def prepare_store(self, rid, keys):
        out = self.m.prepare_store([self.key(k) for k in keys], self.ctx[rid])
        if out is None:
            return None
        return [self.unkey(k) for k in out.keys_to_store], [self.unkey(k) for k in out.evicted_keys]

    def complete_store(self, rid, keys):
        self.m.complete_store([self.key(k) for k in keys], self.ctx[rid])

    def finished(self, rid):
        self.m.on_request_finished(self.ctx[rid])


def run_manager_job(job: dict) -> None:
    with open(job["script"]) as f:
        script = json.load(f)
    log = interpret(script, RealManager(job))
    with open(job["out"], "w") as f:
        json.dump(log, f)


# -- the whole scheduler ----------------------------------------------------------------
def _model_dir() -> str:
    d = tempfile.mkdtemp(prefix="kvsim-vllm-model-")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": MAX_MODEL_LEN,
                   "rms_norm_eps": 1e-5, "torch_dtype": "float32"}, f)
    return d


_SCHED = None


def _sched_modules():
    """vLLM's scheduler stack, imported once and only for scheduler jobs."""
    global _SCHED
    if _SCHED is None:
        import torch
        from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig,
                                 VllmConfig)
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
        from vllm.v1.request import Request
        from vllm.v1.structured_output import StructuredOutputManager
        logging.disable(logging.WARNING)
        _SCHED = {
            "torch": torch, "CacheConfig": CacheConfig, "DeviceConfig": DeviceConfig,
            "KVTransferConfig": KVTransferConfig, "ModelConfig": ModelConfig,
            "SchedulerConfig": SchedulerConfig, "VllmConfig": VllmConfig,
            "OffloadingWorkerMetadata": OffloadingWorkerMetadata, "LoRARequest": LoRARequest,
            "SamplingParams": SamplingParams, "get_hash_fn_by_name": get_hash_fn_by_name,
            "get_request_block_hasher": get_request_block_hasher, "init_none_hash": init_none_hash,
            "FullAttentionSpec": FullAttentionSpec, "KVCacheConfig": KVCacheConfig,
            "KVCacheGroupSpec": KVCacheGroupSpec, "KVConnectorOutput": KVConnectorOutput,
            "ModelRunnerOutput": ModelRunnerOutput, "Request": Request,
            "StructuredOutputManager": StructuredOutputManager,
        }
        _SCHED["model_dir"] = _model_dir()
    return _SCHED


def make_scheduler(job: dict):
    """The real Scheduler with the OffloadingConnector (prefix caching on)."""
    V = _sched_modules()
    B, N = int(job["block_size"]), int(job["num_gpu_blocks"])
    model = V["ModelConfig"](model=V["model_dir"], skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN,
                             dtype="float32")
    sched = V["SchedulerConfig"](
        max_num_batched_tokens=int(job.get("max_num_batched_tokens", 8192)),
        max_num_seqs=int(job.get("max_num_seqs", 16)), max_model_len=MAX_MODEL_LEN, is_encoder_decoder=False,
        enable_chunked_prefill=True, async_scheduling=bool(job.get("async_scheduling", False)))
    cache = V["CacheConfig"](block_size=B, enable_prefix_caching=True)
    cache.num_gpu_blocks = N
    extra = {"cpu_bytes_to_use": int(job["cpu_bytes_to_use"]),
             "eviction_policy": job.get("eviction_policy", "lru"),
             "store_threshold": int(job.get("store_threshold", 0))}
    if job.get("offload_block_size"):
        extra["block_size"] = int(job["offload_block_size"])
    kvt = V["KVTransferConfig"](kv_connector="OffloadingConnector", kv_role="kv_both",
                                kv_connector_extra_config=extra)
    config = V["VllmConfig"](model_config=model, scheduler_config=sched, cache_config=cache,
                             device_config=V["DeviceConfig"](device="cpu"), kv_transfer_config=kvt)
    # one layer, page = 2 * B * heads * head_size * 4 bytes (job's kv_heads / head_size)
    spec = V["FullAttentionSpec"](block_size=B, num_kv_heads=int(job.get("kv_heads", 1)),
                                  head_size=int(job.get("head_size", 1)), dtype=V["torch"].float32)
    kv = V["KVCacheConfig"](num_blocks=N, kv_cache_tensors=[],
                            kv_cache_groups=[V["KVCacheGroupSpec"](["layer.0"], spec)])
    cls = config.scheduler_config.get_scheduler_cls()
    s = cls(config, kv, V["StructuredOutputManager"](config), block_size=B, log_stats=True)
    assert type(s.connector).__name__ == "OffloadingConnector"
    if job.get("finish_order") == "insertion":
        # finished_req_ids is a set: the connector signals the requests that finished in one
        # step in its iteration order, which PYTHONHASHSEED randomizes. This job makes it
        # the order they finished in (the order kvsim signals them), nothing else changes.
        s.finished_req_ids = InsertionOrderedSet()
        update_after = s._update_after_schedule

        def _update_after_schedule(scheduler_output):
            update_after(scheduler_output)
            s.finished_req_ids = InsertionOrderedSet()
        s._update_after_schedule = _update_after_schedule
    return s


class InsertionOrderedSet(set):
    """A set that iterates in insertion order (scheduler.finished_req_ids, see make_scheduler)."""

    def __init__(self) -> None:
        super().__init__()
        self._order: dict = {}

    def add(self, item) -> None:
        super().add(item)
        self._order.setdefault(item, None)

    def discard(self, item) -> None:
        super().discard(item)
        self._order.pop(item, None)

    def remove(self, item) -> None:
        super().remove(item)
        self._order.pop(item, None)

    def __iter__(self):
        return iter(list(self._order))


class FakeWorker:
    """OffloadingConnectorWorker's job protocol with instantaneous transfers (worker.py:219-321)."""

    def __init__(self) -> None:
        self.unsubmitted: list[int] = []

    def step(self, meta) -> tuple[dict[int, int], set[str]]:
        done: list[int] = []
        stores = dict(meta.store_jobs)
        for job_id in meta.jobs_to_flush or ():         # handle_preemptions: flushed stores now
            if stores.pop(job_id, None) is not None:
                self.unsubmitted.append(job_id)
        done += self.unsubmitted                          # submitted at this step's start
        self.unsubmitted = list(stores)                   # prepare_store_kv: next step
        recving = set()
        for job_id, entry in meta.load_jobs.items():
            done.append(job_id)
            if not entry.sync:
                recving.add(entry.req_id)
        return {j: 1 for j in done}, recving


class Recorder:
    """Wraps the real connector scheduler's hooks and logs each call with its answer."""

    def __init__(self, conn_sched) -> None:
        self.cs = conn_sched
        self.calls: list = []
        self.hash_ids: dict[bytes, int] = {}

    def hashes(self, req) -> list[int]:
        return [self.hash_ids.setdefault(bytes(h), len(self.hash_ids)) for h in req.block_hashes]

    def state(self, req) -> dict:
        return {"rid": req.request_id, "hashes": self.hashes(req), "num_tokens": req.num_tokens,
                "num_prompt_tokens": req.num_prompt_tokens, "num_computed_tokens": req.num_computed_tokens,
                "finished": req.is_finished(), "skip": bool(req.skip_reading_prefix_cache)}

    def unkey(self, key) -> int:
        return self.hash_ids[bytes(key[:-4])]

    def install(self, sched) -> None:
        cs, rec = self.cs, self
        orig = {n: getattr(cs, n) for n in ("on_new_request", "get_num_new_matched_tokens",
                                            "update_state_after_alloc", "build_connector_meta",
                                            "update_connector_output", "request_finished")}

        def on_new_request(request):
            rec.calls.append(["new", rec.state(request)])
            return orig["on_new_request"](request)

        def get_num_new_matched_tokens(request, num_computed_tokens, max_num_new_tokens=None):
            out = orig["get_num_new_matched_tokens"](request, num_computed_tokens, max_num_new_tokens)
            rec.calls.append(["match", rec.state(request), int(num_computed_tokens), [out[0], bool(out[1])]])
            return out

        def update_state_after_alloc(request, blocks, num_external_tokens):
            out = orig["update_state_after_alloc"](request, blocks, num_external_tokens)
            rec.calls.append(["alloc", rec.state(request), int(num_external_tokens)])
            return out

        def build_connector_meta(scheduler_output):
            rec.evicted = []
            reqs = {r.request_id: rec.state(r) for r in sched.requests.values()}
            scheduled = dict(scheduler_output.num_scheduled_tokens)
            finished = list(scheduler_output.finished_req_ids or ())   # set order: PYTHONHASHSEED
            meta = orig["build_connector_meta"](scheduler_output)
            finished_states = {rid: reqs.get(rid) or rec.finished_states.get(rid) for rid in finished}
            rec.calls.append(["meta", [reqs[r] for r in scheduled], scheduled, list(finished),
                              finished_states, sorted(scheduler_output.preempted_req_ids or ()),
                              {str(j): [rec.unkey(k) for k in sorted(cs._jobs[j].keys, key=rec.unkey)]
                               for j in meta.load_jobs},
                              {str(j): [rec.unkey(k) for k in sorted(cs._jobs[j].keys, key=rec.unkey)]
                               for j in meta.store_jobs}, rec.evicted])
            return meta

        def update_connector_output(connector_output):
            meta = connector_output.kv_connector_worker_meta
            done = sorted(meta.completed_jobs) if meta is not None else []
            rec.calls.append(["output", done])
            return orig["update_connector_output"](connector_output)

        def request_finished(request):
            rec.finished_states[request.request_id] = rec.state(request)
            rec.calls.append(["finished", rec.state(request)])
            return orig["request_finished"](request)

        self.finished_states: dict[str, dict] = {}
        self.evicted: list[int] = []
        prepare_store = cs.manager.prepare_store

        def recorded_prepare_store(keys, ctx):
            out = prepare_store(keys, ctx)
            if out is not None:
                rec.evicted += [rec.unkey(k) for k in out.evicted_keys]
            return out
        cs.manager.prepare_store = recorded_prepare_store
        for name, fn in list(locals().items()):
            if name in orig:
                setattr(cs, name, fn)


class Workload:
    def __init__(self, path: str) -> None:
        z = np.load(path, allow_pickle=False)
        self.prompt_tok, self.prompt_off = z["prompt_tok"], z["prompt_off"]
        self.out_tok, self.out_off = z["out_tok"], z["out_off"]
        self.arrival = z["arrival"]
        self.lora, self.salt = z["lora"], z["salt"]
        self.names = json.loads(str(z["names"]))
        self.n = len(self.prompt_off) - 1

    def namespace(self, i: int) -> dict:
        V = _sched_modules()
        out = {}
        if self.lora[i] >= 0:
            name = self.names[int(self.lora[i])]
            out["lora_request"] = V["LoRARequest"](lora_name=name, lora_int_id=int(self.lora[i]) + 1, lora_path=name)
        if self.salt[i] >= 0:
            out["cache_salt"] = self.names[int(self.salt[i])]
        return out

    def prompt(self, i: int) -> list[int]:
        return self.prompt_tok[self.prompt_off[i]:self.prompt_off[i + 1]].tolist()

    def output(self, i: int) -> list[int]:
        return self.out_tok[self.out_off[i]:self.out_off[i + 1]].tolist()


def run_sched_job(job: dict) -> None:
    V = _sched_modules()
    work = Workload(job["workload"])
    B, N = int(job["block_size"]), int(job["num_gpu_blocks"])
    V["init_none_hash"](V["get_hash_fn_by_name"]("sha256"))
    hasher = V["get_request_block_hasher"](B, V["get_hash_fn_by_name"]("sha256"))
    sched = make_scheduler(job)
    cs = sched.connector.scheduler
    rec = Recorder(cs) if job.get("record") else None
    if rec:
        rec.install(sched)
    worker = FakeWorker()
    n = work.n
    local = np.full(n, -1, np.int64)
    external = np.full(n, -1, np.int64)
    first = np.full(n, -1, np.int64)
    finish = np.full(n, -1, np.int64)
    preempt = np.zeros(n, np.int64)
    rejected = np.zeros(n, bool)
    outputs: dict[str, list[int]] = {}
    live: dict = {}
    counters = {"store_jobs": 0, "stored_chunks": 0, "load_jobs": 0, "loaded_chunks": 0, "store_failures": 0,
                "evicted_chunks": 0, "skipped_by_threshold": 0}
    manager = cs.manager
    orig_prepare_store = manager.prepare_store

    def prepare_store(keys, ctx):
        before = manager.stores_skipped_in_current_batch        # reset by get_stats each step
        out = orig_prepare_store(keys, ctx)
        counters["skipped_by_threshold"] += manager.stores_skipped_in_current_batch - before
        if out is None:
            counters["store_failures"] += 1
        else:
            counters["evicted_chunks"] += len(out.evicted_keys)
        return out
    manager.prepare_store = prepare_store

    def execute(out):
        """The model runner: samples logged outputs, runs the connector's worker side."""
        meta = out.kv_connector_metadata
        done, recving = worker.step(meta)
        counters["store_jobs"] += len(meta.store_jobs)
        counters["stored_chunks"] += sum(len(cs._jobs[j].keys) for j in meta.store_jobs)
        counters["load_jobs"] += len(meta.load_jobs)
        counters["loaded_chunks"] += sum(len(cs._jobs[j].keys) for j in meta.load_jobs)
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = sched.requests[rid]
            if req.is_prefill_chunk:
                sampled.append([])
                continue
            k = req.num_computed_tokens - req.num_prompt_tokens
            seq = outputs[rid]
            assert 0 <= k < len(seq), f"request {rid} sampled output {k} of {len(seq)}"
            sampled.append([seq[k]])
        kvo = V["KVConnectorOutput"](finished_recving=recving or None,
                                     kv_connector_worker_meta=V["OffloadingWorkerMetadata"](completed_jobs=done)
                                     if done else None)
        return V["ModelRunnerOutput"](req_ids=ids, req_id_to_index={r: j for j, r in enumerate(ids)},
                                      sampled_token_ids=sampled, kv_connector_output=kvo)

    def record(engine_outputs, s: int) -> None:
        for eco in engine_outputs.values():
            for o in eco.outputs:
                i = int(o.request_id)
                if o.prefill_stats is not None and local[i] < 0:
                    local[i] = o.prefill_stats.num_local_cached_tokens
                    external[i] = o.prefill_stats.num_external_cached_tokens
                if o.new_token_ids and first[i] < 0:
                    first[i] = s
                if o.finish_reason is not None:
                    finish[i] = s
                    preempt[i] = live.pop(o.request_id).num_preemptions

    sequential = job.get("mode", "sequential") == "sequential"
    order = sorted(range(n), key=lambda i: (0 if sequential else int(work.arrival[i]), i))
    use_queue = bool(job.get("async_scheduling", False))
    nxt, step = 0, 0
    queue: deque = deque()
    t0 = time.perf_counter()

    def add(i: int) -> None:
        prompt, out = work.prompt(i), work.output(i) or [0]
        if not prompt or -(-(len(prompt) + len(out) - 1) // B) > N - 1:
            rejected[i] = True
            return
        req = V["Request"](str(i), prompt, V["SamplingParams"](max_tokens=len(out)), None, arrival_time=float(i),
                           block_hasher=hasher, **work.namespace(i))
        outputs[str(i)] = out
        live[str(i)] = req
        sched.add_request(req)

    while True:
        busy = sched.has_requests() or queue
        if not busy:
            if nxt == len(order):
                break
            if not sequential:
                step = max(step, int(work.arrival[order[nxt]]))
        if sequential:
            if not busy:
                add(order[nxt])
                nxt += 1
        else:
            while nxt < len(order) and int(work.arrival[order[nxt]]) <= step:
                add(order[nxt])
                nxt += 1
        if not use_queue:
            if not sched.has_requests():
                continue
            out = sched.schedule()
            record(sched.update_from_output(out, execute(out)), step)
            step += 1
            continue
        if sched.has_requests():
            out = sched.schedule()
            queue.appendleft((execute(out), out, step))
            step += 1
            if len(queue) < BATCH_QUEUE_SIZE and (out.total_num_scheduled_tokens > 0 or sched.has_requests()):
                continue
        elif not queue:
            continue
        result, out, s = queue.pop()
        record(sched.update_from_output(out, result), s)
    assert not live, f"requests never finished: {sorted(live)[:5]}"
    counters["num_chunks"] = int(manager._num_chunks)
    counters["resident_chunks"] = int(manager._num_allocated_chunks - len(manager._free_list))
    np.savez(job["out"], local=local, external=external, first_token_step=first, finish_step=finish,
             preemptions=preempt, rejected=rejected, steps=step, elapsed=time.perf_counter() - t0,
             counters=np.array(json.dumps(counters)))
    if rec:
        with open(job["out"] + ".calls.json", "w") as f:
            json.dump(rec.calls, f)


def run_storage_job(job: dict, k: int) -> None:
    """An LMCache job (``offload_lmcache_driver.py``), in this process: LMCache's token
    database imports vLLM anyway, so one process pays for the import once."""
    import offload_lmcache_driver
    offload_lmcache_driver.run_storage_job(job, k)


def main() -> None:
    code = 1
    try:
        with open(sys.argv[1]) as f:
            jobs = json.load(f)
        for k, job in enumerate(jobs):
            if job["kind"] == "storage":
                run_storage_job(job, k)
            elif job["kind"] == "hicache":
                import offload_hicache_driver     # SGLang imports vLLM too: one process for all
                offload_hicache_driver.run_job(job)
            else:
                {"manager": run_manager_job, "sched": run_sched_job}[job["kind"]](job)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)   # LMCache's engines leave threads running


if __name__ == "__main__":
    main()
