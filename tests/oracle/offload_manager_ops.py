"""Random operation scripts for vLLM's CPU offloading manager, and their interpreter.

Imported by the tier tests (kvsim's ``CPUOffloadManager``) and by ``offload_vllm_driver.py``
(the real ``CPUOffloadingManager``, in the oracle venv): it imports neither kvsim nor vLLM.
A script is a list of abstract operations on requests whose offload keys share prefixes
(a few families of system prompts, then keys of their own). :func:`interpret` applies it
through an adapter and returns everything the manager answered, so the two logs can be
compared line for line: lookups, stores (kept, evicted, or refused), loads.
"""
from __future__ import annotations

import random
from collections import deque
from typing import Any, Protocol

CHUNK_TOKENS = 16


class Manager(Protocol):
    """The calls a script makes; keys are ints, requests are ids."""

    def new(self, rid: str, positions: dict[int, int]) -> None: ...
    def lookup(self, rid: str, key: int) -> str: ...                    # "hit" | "pending" | "miss"
    def prepare_load(self, rid: str, keys: list[int]) -> None: ...
    def complete_load(self, rid: str, keys: list[int]) -> None: ...
    def prepare_store(self, rid: str, keys: list[int]) -> tuple[list[int], list[int]] | None: ...
    def complete_store(self, rid: str, keys: list[int]) -> None: ...
    def finished(self, rid: str) -> None: ...


def request_keys(family: int, shared: int, length: int, rid: int) -> list[int]:
    """A request's chunk keys: ``shared`` of its family's chain, then its own."""
    return [family * 1000 + i for i in range(min(shared, length))] + \
           [10_000_000 + rid * 1000 + i for i in range(shared, length)]


def random_script(seed: int, n_requests: int = 60, families: int = 4, max_len: int = 12,
                  live: int = 3) -> list[list[Any]]:
    """A script: requests come and go (at most ``live`` at once), store their chunks in a few
    batches, load their hits, complete transfers late, and finish."""
    rng = random.Random(seed)
    ops: list[list[Any]] = []
    open_reqs: list[tuple[int, int]] = []      # (rid, length)
    rid = 0
    while rid < n_requests or open_reqs:
        if rid < n_requests and (len(open_reqs) < live and rng.random() < 0.6 or not open_reqs):
            length = rng.randint(1, max_len)
            shared = rng.randint(0, length) if rng.random() < 0.8 else 0
            ops.append(["new", rid, rng.randrange(families), shared, length])
            if rng.random() < 0.7:
                ops.append(["load", rid])
            open_reqs.append((rid, length))
            rid += 1
            continue
        r, length = open_reqs[rng.randrange(len(open_reqs))]
        roll = rng.random()
        if roll < 0.45:
            lo = rng.randint(0, length)
            ops.append(["store", r, lo, rng.randint(lo, length)])
        elif roll < 0.6:
            ops.append(["complete_stores", rng.randint(1, 3)])
        elif roll < 0.68:
            ops.append(["complete_loads"])
        elif roll < 0.78:
            ops.append(["lookup", r])
        else:
            ops.append(["finish", r])
            open_reqs.remove((r, length))
    ops.append(["complete_loads"])
    ops.append(["complete_stores", 1 << 30])
    return ops


def interpret(script: list[list[Any]], m: Manager) -> list[Any]:
    """Apply ``script`` to ``m``; the log of what it answered."""
    keys: dict[str, list[int]] = {}
    stores: deque[tuple[str, list[int]]] = deque()
    loads: list[tuple[str, list[int]]] = []
    log: list[Any] = []
    for op in script:
        kind = op[0]
        if kind == "new":
            _, rid, family, shared, length = op
            r = str(rid)
            keys[r] = request_keys(family, shared, length, rid)
            m.new(r, {k: (i + 1) * CHUNK_TOKENS for i, k in enumerate(keys[r])})
        elif kind == "load":
            r = str(op[1])
            hits = 0
            for k in keys[r]:
                if m.lookup(r, k) != "hit":
                    break
                hits += 1
            if hits:
                m.prepare_load(r, keys[r][:hits])
                loads.append((r, keys[r][:hits]))
            log.append(["load", r, hits])
        elif kind == "lookup":
            r = str(op[1])
            log.append(["lookup", r, [m.lookup(r, k) for k in keys[r]]])
        elif kind == "store":
            _, rid, lo, hi = op
            r = str(rid)
            plan = m.prepare_store(r, keys[r][lo:hi])
            if plan is not None and plan[0]:
                stores.append((r, plan[0]))
            log.append(["store", r, None if plan is None else [plan[0], plan[1]]])
        elif kind == "complete_stores":
            for _ in range(min(op[1], len(stores))):
                r, ks = stores.popleft()
                m.complete_store(r, ks)
        elif kind == "complete_loads":
            for r, ks in loads:
                m.complete_load(r, ks)
            loads.clear()
        elif kind == "finish":
            r = str(op[1])
            # vLLM signals the end only when no submit-side call follows; loads may be in flight
            m.finished(r)
        else:
            raise ValueError(f"unknown operation {kind!r}")
    return log
