"""Workloads for the SGLang gateway oracle, and kvsim's follow-the-choice check.

kvsim's logs hold tokens; the gateway matches characters. Each token id becomes one distinct
Unicode character (``text_of``), so the real character tree and kvsim's token tree see the
same sequence (``docs/engines/routers.md §2.1``). The real gateway breaks miss ties at random,
so kvsim is not asked to guess them: ``check`` replays the script through kvsim's router,
requires each real choice above the threshold to be a holder of the matched node, and then
makes kvsim's state follow the real choice (``Router.dispatch``).
"""
from __future__ import annotations

import random
from typing import Any

import numpy as np

from kvsim.fleet import IDLE, ReplicaLoad, RouteRequest, make_router
from kvsim.fleet.routers.sglang import CacheAware


# The warm-up slice (a new worker takes one miss in four for 60 s, and one hit in eight is
# diverted to a thin worker) is not modelled (docs/engines/routers.md §2.4). With an hour between
# load polls none falls in a run: the gateway's dispatch counts since start decide, as kvsim's
# with load_monitor_interval=1e9 and idle reports.
GATEWAY_ARGS = ["--policy", "cache_aware", "--worker-warmup-secs", "0", "--worker-warmup-divert-every", "0",
                "--load-monitor-interval", "3600"]


def text_of(tokens: list[int]) -> str:
    """One character per token id (surrogates skipped)."""
    out = []
    for t in tokens:
        cp = 0x100 + t
        out.append(chr(cp + 0x800 if cp >= 0xD800 else cp))
    return "".join(out)


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1, 50_000) for _ in range(n)]


def workload(rng: random.Random, requests: int) -> list[list[int]]:
    """Shared system prompts (tenants), multi-turn sessions extending their last prompt, one-offs."""
    systems = [_tokens(rng, rng.randint(20, 200)) for _ in range(rng.randint(2, 5))]
    sessions: list[list[int]] = []
    out = []
    for _ in range(requests):
        r = rng.random()
        if sessions and r < 0.35:
            s = rng.randrange(len(sessions))
            sessions[s] = sessions[s] + _tokens(rng, rng.randint(5, 80))
            out.append(sessions[s])
        elif r < 0.85:
            toks = rng.choice(systems) + _tokens(rng, rng.randint(1, 300))
            sessions.append(toks)
            out.append(toks)
        else:
            out.append(_tokens(rng, rng.randint(5, 200)))
    return out


def sequential(seed: int, package: str = "smg", requests: int = 30) -> dict[str, Any]:
    """One request at a time (each answered before the next is sent)."""
    rng = random.Random(seed)
    n = rng.randint(2, 8)
    ops = [{"op": "send", "rid": f"s{seed}r{i}", "tokens": t, "text": text_of(t)}
           for i, t in enumerate(workload(rng, requests))]
    return {"package": package, "workers": n, "ops": ops, "args": GATEWAY_ARGS}


def loaded(seed: int, requests: int = 40) -> dict[str, Any]:
    """Requests held open at the workers and released in a random order: the gateway's
    in-flight counts drive the spill gate and the least-loaded choice on a miss."""
    rng = random.Random(seed)
    n = rng.randint(2, 5)
    hot = _tokens(rng, 120)
    prompts = (hot + _tokens(rng, rng.randint(1, 40)) if rng.random() < 0.4 else t   # a hot prefix piles up
               for t in workload(rng, requests))
    return {"package": "smg", "workers": n, "ops": _held(rng, f"l{seed}r", prompts, 14, 0.3), "args": GATEWAY_ARGS}


def hot(seed: int, requests: int = 36) -> dict[str, Any]:
    """One hot prefix held open on its owner, 2 to 4 workers, few releases: the owner's load
    climbs through the band where the spill gate's two readings differ (``check``)."""
    rng = random.Random(seed)
    n = rng.randint(2, 4)
    prefix = _tokens(rng, 150)
    prompts = (prefix + _tokens(rng, rng.randint(1, 30)) if rng.random() < 0.85 else _tokens(rng, 60)
               for _ in range(requests))
    return {"package": "smg", "workers": n, "ops": _held(rng, f"h{seed}r", prompts, 24, 0.15), "args": GATEWAY_ARGS}


def _held(rng: random.Random, rid: str, prompts, most_open: int, release: float) -> list[dict[str, Any]]:
    """Each prompt sent and held open; after each send, open requests released at random
    (chance ``release``, and always above ``most_open``); the rest released at the end."""
    ops: list[dict[str, Any]] = []
    open_: list[str] = []
    for i, t in enumerate(prompts):
        ops.append({"op": "send", "rid": f"{rid}{i}", "tokens": t, "text": text_of(t), "hold": True})
        open_.append(f"{rid}{i}")
        while open_ and (len(open_) > most_open or rng.random() < release):
            ops.append({"op": "release", "rid": open_.pop(rng.randrange(len(open_)))})
    return ops + [{"op": "release", "rid": r} for r in open_]


def spill_band(router: CacheAware, w: int, load: list[int]) -> str:
    """Where worker ``w`` stands against 1.13.0's spill gate under its two readings.

    ``--help`` gives the margin as "two standard deviations" of the in-flight count "at the
    pool's current mean": kvsim reads sigma = sqrt(mean) (a Poisson count); the loads' own
    standard deviation is the other reading. On hot-prefix jobs neither fits every real
    choice (docs/engines/routers.md §2.4 item 1), so between the two the oracle accepts
    either choice: ``"spill"`` over both, ``"keep"`` under both, ``"band"`` between.
    """
    mean = sum(load) / len(load)
    std = (sum((x - mean) ** 2 for x in load) / len(load)) ** 0.5
    s = router.settings
    over = [load[w] > mean + min(s.balance_abs_threshold, max(4.0, 2.0 * sigma))
            and load[w] > s.balance_rel_threshold * mean for sigma in (mean ** 0.5, std)]
    assert over[0] == router.spills(w, load), "kvsim's gate is the sqrt(mean) reading"
    return "spill" if all(over) else "band" if any(over) else "keep"


def for_driver(job: dict[str, Any]) -> dict[str, Any]:
    """The job without kvsim's tokens (the driver sends text)."""
    return {**job, "ops": [{k: v for k, v in op.items() if k != "tokens"} for op in job["ops"]]}


def check(job: dict[str, Any], result: dict[str, Any], options: dict[str, str] | None = None) -> dict[str, int]:
    """Follow the real choices through kvsim's cache_aware; counts of what was checked.

    Where the policy decides (match rate above ``cache_threshold``), the real choice must be a
    worker holding the matched node that the spill gate lets through, or, when the gate fires
    for every holder (1.13.0: load > mean + max(4, 2 sigma) and > 1.5 mean), none of the
    holders. Where a holder sits in the gate's band (``spill_band``) any choice is accepted
    and counted as ``band``. Below the threshold any worker is accepted
    (docs/engines/routers.md §9.2: which least-loaded worker the binary takes on a miss is
    not settled). The gateway's own in-flight counts must equal kvsim's. Raises
    AssertionError at the first disagreement.
    """
    n = job["workers"]
    router = make_router("cache_aware", n, {"load_monitor_interval": "1e9", **(options or {})}, seed=0)
    assert isinstance(router, CacheAware)
    threshold = router.settings.cache_threshold
    loads: list[ReplicaLoad] = [IDLE] * n
    where: dict[str, tuple[RouteRequest, int]] = {}
    sends = iter(result["workers"])
    gateway_loads = iter(result["loads"])
    stats = {"affinity": 0, "miss": 0, "shared_node": 0, "owner_loaded": 0, "spill": 0, "band": 0,
             "band_spilled": 0}
    now = 0.0
    for i, op in enumerate(job["ops"]):
        now += 0.001
        if op["op"] == "loads":
            loads = [ReplicaLoad(q, r, u) for q, r, u in
                     zip(op["waiting"], op.get("running") or [0] * n, op["usage"])]
            continue
        if op["op"] == "release":
            req, w = where.pop(op["rid"])
            router.finished(req, w, now)
            continue
        req = RouteRequest(i, op["rid"], np.asarray(op["tokens"], dtype=np.int64), now)
        got, theirs = next(sends), next(gateway_loads)
        assert not theirs or theirs == router.in_flight, (
            f"{op['rid']}: the gateway counts {theirs} in flight, kvsim {router.in_flight}")
        saved = router.tree.epoch
        matched, _ = router.tree.match(req.tokens)
        router.tree.epoch = saved
        holders = router.tree.holders(req.tokens)
        gate = {h: spill_band(router, h, list(router.in_flight)) for h in holders}
        where_ = f"{op['rid']}: matched {matched}/{len(req.tokens)} on a node held by {gate}, in flight {router.in_flight}"
        if not (len(req.tokens) and matched / len(req.tokens) > threshold):
            stats["miss"] += 1
        elif "band" in gate.values():         # a holder under both readings still takes it first
            stats["band"] += 1
            stats["band_spilled"] += got not in holders
            keep = [h for h, g in gate.items() if g == "keep"]
            assert gate.get(got) in ("keep", "band") or (not keep and got not in holders), (
                f"{where_}; the real gateway sent it to {got}")
        elif "keep" in gate.values():
            stats["affinity"] += 1
            stats["shared_node"] += len(holders) > 1
            stats["owner_loaded"] += min(router.in_flight[h] for h in holders) > min(router.in_flight)
            assert gate.get(got) == "keep", f"{where_}; the real gateway sent it to {got}"
        else:
            stats["spill"] += 1         # every holder over the gate: the real one must leave them
            assert got not in holders, f"{where_}; the gate fires, the real gateway kept it on {got}"
        router.dispatch(req, got, now, loads)
        if op.get("hold"):
            where[op["rid"]] = (req, got)
        else:
            router.finished(req, got, now)
    return stats
