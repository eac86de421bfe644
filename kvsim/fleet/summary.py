"""A fleet replay's figures: the attribution, each replica's share, the load imbalance (JSON-ready).

``fleet_summary`` is the ``fleet`` entry of a policy's summary: ``replicas``, ``router`` and
its options, the three rates (``fleet_bound_hit_rate`` >= ``routed_bound_hit_rate`` >=
``token_hit_rate``, :mod:`kvsim.fleet.bounds`), which gap is larger, the capacity per
replica and in all, the load imbalance (max / mean of requests and prompt tokens per
replica) and per replica: requests, prompt tokens, hit rate, its routed bound and, under
load, peak running / waiting requests and (timed) TTFT percentiles.
"""
from __future__ import annotations

from dataclasses import asdict
from typing import Any

import numpy as np

from kvsim.fleet.base import Router
from kvsim.fleet.bounds import Bounds, rate
from kvsim.fleet.config import FleetSpec
from kvsim.drive.percentiles import percentile

PERCENTILES = (50, 90, 99)
#: said when a load-aware router runs a sequential replay
SEQUENTIAL_NOTE = ("{router} reads the replicas' load, and in a sequential replay every replica is idle "
                   "when a request arrives: the natural mode for fleets is --replay steps|timed")


def larger_gap(routing: float, memory: float) -> str:
    """Which loss is larger: "routing", "memory" or "neither" (both under half a point)."""
    if max(routing, memory) < 0.005:
        return "neither"
    return "routing" if routing >= memory else "memory"


def imbalance(values: np.ndarray) -> float:
    """max / mean over the replicas (1.0 = perfectly even; 0 when nothing was sent)."""
    mean = float(np.mean(values)) if len(values) else 0.0
    return float(np.max(values)) / mean if mean > 0 else 0.0


def fleet_summary(fleet: FleetSpec, router: Router, trace, replica: np.ndarray, cached: np.ndarray,
                  rejected: np.ndarray, counted: np.ndarray, bounds: Bounds, capacity_tokens: int | None,
                  mode: str = "sequential", peaks: tuple[list[int], list[int]] | None = None,
                  ttft: np.ndarray | None = None, steps: list[int] | None = None) -> dict[str, Any]:
    """The ``fleet`` summary of one policy's fleet replay (see the module docstring)."""
    N = fleet.replicas
    prompt = trace.prompt_lengths
    ok = ~rejected & counted
    delivered = rate(cached, prompt, ok)
    fb, rb = rate(bounds.fleet, prompt, ok), rate(bounds.routed, prompt, ok)
    routed_to = [counted & (replica == r) for r in range(N)]
    reqs = np.array([int(m.sum()) for m in routed_to])
    toks = np.array([int(prompt[m].sum()) for m in routed_to])
    out: dict[str, Any] = {
        "replicas": N, "router": fleet.router, "router_options": fleet.option_dict,
        "router_settings": asdict(router.settings), "router_defaulted": not fleet.router_given,
        "capacity_tokens_per_replica": capacity_tokens,
        "capacity_tokens_total": None if capacity_tokens is None else int(capacity_tokens) * N,
        "fleet_bound_hit_rate": fb, "routed_bound_hit_rate": rb, "token_hit_rate": delivered,
        "routing_gap": fb - rb, "memory_gap": rb - delivered, "larger_gap": larger_gap(fb - rb, rb - delivered),
        "load_imbalance": {"requests": imbalance(reqs), "prompt_tokens": imbalance(toks)},
    }
    if router.load_aware and mode == "sequential":
        out["note"] = SEQUENTIAL_NOTE.format(router=fleet.router)
    per = []
    for r in range(N):
        mine = routed_to[r] & ok
        row: dict[str, Any] = {
            "replica": r, "requests": int(reqs[r]), "admitted": int(mine.sum()), "prompt_tokens": int(toks[r]),
            "cached_tokens": int(cached[mine].sum()), "token_hit_rate": rate(cached, prompt, mine),
            "routed_bound_hit_rate": rate(bounds.routed, prompt, mine)}
        if steps is not None:
            row["steps"] = int(steps[r])
        if peaks is not None:
            row["peak_running"], row["peak_waiting"] = int(peaks[1][r]), int(peaks[0][r])
        if ttft is not None:
            v = ttft[mine & np.isfinite(ttft)]
            for p in PERCENTILES:
                row[f"ttft_p{p}_s"] = percentile(v, p) if len(v) else float("nan")
        per.append(row)
    out["per_replica"] = per
    return out
