"""Randomized fleets for the Dynamo oracle: kvsim's router decides, the script records it.

Each script is a replay through ``kvsim.fleet``'s ``dynamo`` router of a random workload
(2–8 replicas; shared system prompts; multi-turn sessions whose prompts extend the last
one; tenants as LoRA and cache-salt namespaces), with requests in flight overlapping in a
random order (booked, prefill completed and freed interleaved) or one at a time. In events
mode a fake engine per replica stores each request's new full blocks before its first
token and evicts its oldest blocks past a small capacity, and both routers get the same
BlockStored / BlockRemoved events. The script holds kvsim's choice and candidate set per
route, and the operations for ``router_dynamo_driver.py``.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvsim.fleet import IDLE, BlockRemoved, BlockStored, RouteRequest, make_router
from kvsim.fleet.keys import block_keys
from kvsim.fleet.routers.dynamo import DynamoRouter

MASK = (1 << 62) - 1


@dataclass
class FakeEngine:
    """A replica's block store: copies of blocks in store order (a recomputed block is a new copy)."""

    capacity: int
    blocks: list[int] = field(default_factory=list)


def _namespace(rng: random.Random) -> tuple[str | None, str | None]:
    r = rng.random()
    return (None, None) if r < 0.6 else ("lora-a", None) if r < 0.8 else (None, "salt-x")


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, 50_000) for _ in range(n)]


def build(seed: int, mode: str, *, sequential: bool, requests: int = 28, block_size: int = 16) -> dict[str, Any]:
    """One randomized script: the driver's job and kvsim's decisions."""
    rng = random.Random(seed)
    n = rng.randint(2, 8)
    router = make_router("dynamo", n, {"mode": mode, "router_ttl_secs": "1e9"},
                         block_size=block_size, seed=seed)
    assert isinstance(router, DynamoRouter)
    engines = [FakeEngine(capacity=rng.randint(6, 30)) for _ in range(n)]
    systems = [_tokens(rng, block_size * rng.randint(1, 5) + rng.randrange(block_size)) for _ in range(4)]
    sessions: list[tuple[list[int], tuple[str | None, str | None]]] = []
    ops: list[dict[str, Any]] = []
    decisions: list[dict[str, Any]] = []
    flight: list[tuple[RouteRequest, int, int]] = []   # (request, replica, stage 0 booked / 1 prefilled)
    probes: dict[int, tuple[list[int], tuple[str | None, str | None]]] = {}
    now = 0.0

    def store(req: RouteRequest, k: int) -> None:
        toks = req.tokens
        keys = block_keys(toks, block_size, req.namespace)
        eng = engines[k]
        start = router.overlap(keys, k, now)      # what the engine would find cached
        if start == len(keys):
            return
        hashes = [kk & MASK for kk in keys[start:]]
        parent = (keys[start - 1] & MASK) if start else None
        body = toks[start * block_size:len(keys) * block_size]
        ev = BlockStored(tuple(hashes), parent, body, block_size, req.lora, req.cache_salt)
        router.kv_event(k, ev, now)
        for j, h in enumerate(hashes):
            eng.blocks.append(h)
            probes[h] = (toks[:(start + j + 1) * block_size].tolist(), req.namespace)
        probe, _ = probes[hashes[-1]]
        ops.append({"op": "store", "worker": k, "hashes": hashes, "parent": parent,
                    "tokens": body.tolist(), "lora": req.lora, "salt": req.cache_salt,
                    "probe": probe, "expect": router.overlap(keys, k, now)})
        if len(eng.blocks) > eng.capacity:
            victims = eng.blocks[:len(eng.blocks) - eng.capacity]
            del eng.blocks[:len(victims)]
            router.kv_event(k, BlockRemoved(tuple(victims)), now)
            probe, (lora, salt) = probes[victims[-1]]
            pkeys = block_keys(np.asarray(probe, dtype=np.int64), block_size, (lora, salt))
            ops.append({"op": "remove", "worker": k, "hashes": victims, "probe": probe,
                        "lora": lora, "salt": salt, "expect": router.overlap(pkeys, k, now)})

    def advance(req: RouteRequest, k: int, stage: int) -> int:
        if stage == 0:
            if mode == "events":
                store(req, k)
            router.prefill_done(req, k, now)
            ops.append({"op": "prefill_done", "rid": req.request_id})
            return 1
        router.finished(req, k, now)
        ops.append({"op": "finished", "rid": req.request_id})
        return 2

    for i in range(requests):
        now += 0.01
        if sessions and rng.random() < 0.45:
            s = rng.randrange(len(sessions))
            prev, ns = sessions[s]
            toks = prev + _tokens(rng, rng.randint(4, 40))
            sessions[s] = (toks, ns)
        else:
            ns = _namespace(rng)
            toks = rng.choice(systems) + _tokens(rng, rng.randint(1, 60))
            sessions.append((toks, ns))
        req = RouteRequest(i, f"r{i}", np.asarray(toks, dtype=np.int64), now, None, ns[0], ns[1])
        cands = router.candidates(req, [IDLE] * n, now)
        k = router.route(req, [IDLE] * n, now)
        decisions.append({"rid": req.request_id, "choice": k, "candidates": sorted(cands),
                          "costs": router.costs(req, now)})
        ops.append({"op": "route", "rid": req.request_id, "tokens": toks, "lora": ns[0],
                    "salt": ns[1], "choice": k})
        flight.append((req, k, 0))
        limit = 0 if sequential else rng.randint(0, 5)
        while len(flight) > limit or (flight and rng.random() < 0.3):
            j = rng.randrange(len(flight))
            r, kk, st = flight[j]
            st = advance(r, kk, st)
            if st == 2:
                flight.pop(j)
            else:
                flight[j] = (r, kk, st)
            if sequential and flight:
                continue
    for r, kk, st in flight:
        while st < 2:
            st = advance(r, kk, st)
    job = {"block_size": block_size, "workers": n, "mode": mode, "ops": ops,
           "config": {"router_ttl_secs": 1e9} if mode == "approx" else {}}
    return {"job": job, "decisions": decisions, "replicas": n}
