"""Drive the REAL Dynamo KV router (ai-dynamo-runtime 1.6.1) through an operation script.

Run in the oracle venv: ``python router_dynamo_driver.py JOB.json OUT.json``. The job holds
``block_size``, ``workers``, ``mode`` (``events``/``approx``), ``config`` (KvRouterConfig
keywords) and ``ops``, a list of:

- ``route``: ``rid, tokens, lora, salt, choice``: before anything changes, read
  ``get_potential_loads`` and record the min-cost set (the cost of
  ``docs/engines/routers.md §3.3``, in exact fractions) and a query-only ``best_worker``;
  then send the request to worker ``choice`` (kvsim's pick) with
  ``generate_from_request(routing.backend_instance_id)``, which books it and, in approx
  mode, inserts its blocks.
- ``prefill_done`` / ``finished``: ``rid``: the fake worker yields the first token / ends
  the stream; the router marks prefill complete / frees the request.
- ``store`` / ``remove``: ``worker, hashes, parent, tokens, lora, salt``: a
  ``KvEventPublisher`` publishes the block event; ``probe`` (tokens) and ``expect`` (device
  blocks) say when the router has applied it.

Offline: file discovery in a fresh folder, TCP request plane and ZMQ event plane on
127.0.0.1. Worker ``k`` is the k-th registered one. Output: one record per route op.
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from fractions import Fraction

os.environ["DYN_FILE_KV"] = tempfile.mkdtemp(prefix="kvsim-dynamo-")
for var in ("DYN_EVENT_PLANE_HOST", "DYN_TCP_RPC_HOST", "DYN_TCP_RESPONSE_STREAM_HOST", "DYN_SYSTEM_HOST"):
    os.environ[var] = "127.0.0.1"
os.environ.setdefault("DYN_LOG", "error")

from dynamo._core import (DistributedRuntime, KvEventPublisher, KvRouter, KvRouterConfig,  # noqa: E402
                          ModelInput, ModelType, WorkerType, register_model)

ENDPOINT = "kvsim.worker.generate"
GATES: dict[str, tuple[asyncio.Event, asyncio.Event]] = {}


async def handler(request, context=None):
    """A fake worker: one token when told prefill is done, then the end when told finished."""
    gate = GATES[request["extra_args"]["kvsim_id"]]
    await gate[0].wait()
    yield {"token_ids": [1], "finish_reason": None}
    await gate[1].wait()
    yield {"token_ids": [2], "finish_reason": "stop"}


async def until(check, what: str, timeout: float = 10.0) -> None:
    """Poll the async predicate ``check`` until it holds."""
    end = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > end:
            raise TimeoutError(f"the router never showed {what}")
        await asyncio.sleep(0.002)


class Fleet:
    """Fake workers, their publishers and the real router."""

    def __init__(self, job: dict) -> None:
        self.job = job
        self.bs = job["block_size"]
        self.cfg = job.get("config", {})
        self.ids: list[int] = []
        self.pubs: list[KvEventPublisher] = []
        self.streams: dict[str, dict] = {}

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.runtimes = []
        for _ in range(self.job["workers"]):
            rt = DistributedRuntime(loop, "file", "tcp", event_plane="zmq")
            ep = rt.endpoint(ENDPOINT)
            await register_model(ModelInput.Tokens, ModelType.Chat, ep, "fake", "fake",
                                 worker_type=WorkerType.Aggregated, kv_cache_block_size=self.bs,
                                 skip_model_assets=True)
            asyncio.ensure_future(ep.serve_endpoint(handler))
            self.runtimes.append(rt)
            self.ids.append(ep.connection_id())
            if self.job["mode"] == "events":
                self.pubs.append(KvEventPublisher(ep, kv_block_size=self.bs))
        rrt = DistributedRuntime(loop, "file", "tcp", event_plane="zmq")
        self.runtimes.append(rrt)
        config = KvRouterConfig(use_kv_events=self.job["mode"] == "events", **self.cfg)
        self.router = KvRouter(rrt.endpoint(ENDPOINT), self.bs, config)

        async def all_seen() -> bool:
            return len(await self.router.get_potential_loads([0] * self.bs)) == len(self.ids)
        await until(all_seen, "every worker")

    async def loads(self, tokens: list[int], lora, salt) -> dict[int, dict]:
        rows = await self.router.get_potential_loads(tokens, lora_name=lora, cache_namespace=salt)
        return {self.ids.index(r["worker_id"]): r for r in rows}

    def cost(self, row: dict) -> Fraction:
        """docs/engines/routers.md §3.3 from the router's own potential loads, exactly."""
        scale = Fraction(self.cfg.get("prefill_load_scale", 1.0))
        weight = Fraction(self.cfg.get("decode_active_request_weight", 0.0))
        return (scale * Fraction(row["potential_prefill_tokens"], self.bs)
                + row["potential_decode_blocks"] + weight * row["active_requests"])

    async def overlap(self, tokens, lora, salt) -> dict[int, int]:
        res = await self.router.get_overlap_scores(tokens, lora_name=lora, cache_namespace=salt)
        return {self.ids.index(r["worker_id"]): r["device_blocks"] for r in res["workers"]}

    async def route(self, op: dict) -> dict:
        toks, lora, salt = op["tokens"], op.get("lora"), op.get("salt")
        loads = await self.loads(toks, lora, salt)
        costs = {k: self.cost(r) for k, r in loads.items()}
        best = min(costs.values())
        min_set = sorted(k for k, c in costs.items() if c == best)
        wid, _, overlap = await self.router.best_worker(toks, lora_name=lora, cache_namespace=salt)
        k = op["choice"]
        GATES[op["rid"]] = (asyncio.Event(), asyncio.Event())
        routing = {"backend_instance_id": self.ids[k]}
        if lora is not None:
            routing["lora_name"] = lora
        if salt is not None:
            routing["cache_salt"] = salt
        request = {"token_ids": toks, "model": "fake", "stop_conditions": {"max_tokens": 2},
                   "sampling_options": {}, "output_options": {}, "routing": routing,
                   "extra_args": {"kvsim_id": op["rid"]}}
        before = loads[k]["active_requests"]
        stream = await self.router.generate_from_request(request)
        state = {"first": asyncio.Event(), "done": asyncio.Event()}
        self.streams[op["rid"]] = state

        async def drain() -> None:
            async for _ in stream:
                state["first"].set()
            state["done"].set()
        state["task"] = asyncio.ensure_future(drain())

        async def booked() -> bool:
            return (await self.loads(toks, lora, salt))[k]["active_requests"] == before + 1
        await until(booked, f"request {op['rid']} booked")
        return {"rid": op["rid"], "min_set": min_set, "best": self.ids.index(wid),
                "costs": [str(costs[i]) for i in range(len(self.ids))], "overlap": overlap}

    async def prefill_done(self, op: dict) -> None:
        GATES[op["rid"]][0].set()
        await asyncio.wait_for(self.streams[op["rid"]]["first"].wait(), 10)
        await asyncio.sleep(0.003)

    async def finished(self, op: dict) -> None:
        GATES[op["rid"]][0].set()
        GATES[op["rid"]][1].set()
        await asyncio.wait_for(self.streams[op["rid"]]["done"].wait(), 10)
        await asyncio.sleep(0.003)

    async def store(self, op: dict) -> None:
        k = op["worker"]
        n = len(op["hashes"])
        self.pubs[k].publish_stored(op["tokens"], [self.bs] * n, op["hashes"], op.get("parent"),
                                    lora_name=op.get("lora"), cache_salt=op.get("salt"))
        await self.settle(op)

    async def remove(self, op: dict) -> None:
        self.pubs[op["worker"]].publish_removed(op["hashes"])
        await self.settle(op)

    async def settle(self, op: dict) -> None:
        last: list[int] = []

        async def seen() -> bool:
            got = await self.overlap(op["probe"], op.get("lora"), op.get("salt"))
            last[:] = [got[op["worker"]]]
            return got[op["worker"]] == op["expect"]
        try:   # (returns as soon as it shows; on a loaded 2-core machine the first took over 3 s)
            await until(seen, f"event {op['op']} on worker {op['worker']}", timeout=15.0)
        except TimeoutError as err:
            raise TimeoutError(f"{err}: device blocks {last}, kvsim expects {op['expect']} (op {op.get('index')})") from None


async def run(job: dict) -> list[dict]:
    fleet = Fleet(job)
    await fleet.start()
    out = []
    for op in job["ops"]:
        kind = op["op"]
        if kind == "route":
            out.append(await fleet.route(op))
        else:
            await getattr(fleet, kind)(op)
    for gate in GATES.values():
        gate[0].set()
        gate[1].set()
    await asyncio.sleep(0.01)
    return out


def main() -> None:
    jobs = json.loads(open(sys.argv[1]).read())
    results = []
    for job in jobs:
        GATES.clear()
        os.environ["DYN_FILE_KV"] = tempfile.mkdtemp(prefix="kvsim-dynamo-")   # no phantom workers
        results.append(asyncio.run(run(job)))
    with open(sys.argv[2], "w") as f:
        json.dump(results, f)
    sys.stdout.flush()
    os._exit(0)   # the runtime's background threads would otherwise hold the process open


if __name__ == "__main__":
    main()
