"""Fleets in a sweep: ``kvsim sweep ... --replicas 1,2,4,8 --router round_robin,cache_aware``.

Every point of the sweep (policy, setting, capacity: :class:`kvsim.sweep.grid.SweepPoint`)
is replayed again as a fleet of each size behind each router, sequentially (and, with
``--replay steps|timed``, under load too), in this process. One row per point x replicas x
router: the point's columns, ``replicas``, ``router``, the delivered ``token_hit_rate``,
``fleet_bound_hit_rate`` and ``routed_bound_hit_rate`` (:mod:`kvsim.fleet.bounds`), the
gaps, the load imbalance and, under load, ``concurrent_hit_rate``,
``concurrent_preemptions`` and (timed) ``ttft_p50_s`` / ``ttft_p90_s``.
"""
from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from typing import Any

from kvsim.errors import ConfigError
from kvsim.fleet.config import FleetSpec
from kvsim.fleet.routers import ROUTERS
from kvsim.drive.percentiles import percentile


def parse_replicas(text: str) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8]; each at least 1."""
    from kvsim.sweep.grid import split_list

    out = []
    for item in split_list(text, "--replicas"):
        if re.fullmatch(r"[-+]?\d+", item) is None:
            raise ConfigError(f"--replicas takes whole numbers, a comma list (got {item!r})")
        if int(item) < 1:
            raise ConfigError(f"--replicas must be at least 1 (got {int(item)})")
        out.append(int(item))
    return out


def fleets(replicas: Sequence[int], routers: Sequence[str], options: Sequence[tuple[str, str]]) -> list[FleetSpec]:
    """Every fleet of the grid; each router option goes to the routers that have it (an option
    none of them has is an error)."""
    for name in routers:
        if name not in ROUTERS:
            raise ConfigError(f"unknown --router {name!r}; choose one of {', '.join(ROUTERS)}")
    for key, _ in options:
        if not any(key in ROUTERS[name].option_names() for name in routers):
            raise ConfigError(f"no router of --router {','.join(routers)} has option {key!r}")
    out = []
    for n in replicas:
        for name in routers:
            own = tuple((k, v) for k, v in options if k in ROUTERS[name].option_names())
            out.append(FleetSpec(n, name, own))
    return out


def fleet_rows(trace, points: list, grid: list[FleetSpec], concurrent: Any = None, progress=None) -> list[dict]:
    """One row per sweep point x fleet (see the module docstring)."""
    from kvsim.engines import registry
    from kvsim.fleet.sequential import fleet_replay
    from kvsim.fleet.bounds import bounds

    rows = []
    total, done = len(points) * len(grid), 0
    for p in points:
        opts = p.options()
        spec = registry.engine(p.policy)
        for fleet in grid:
            t0 = time.perf_counter()
            run = fleet_replay(p.policy, trace, opts, fleet)
            if p.warmup is not None:
                from kvsim.warmup import measured_mask

                run.result.measured = measured_mask(len(trace), p.warmup)
            run.bounds = bounds(p.policy, trace, opts, run.replica, run.order)
            f = run.fleet_summary(trace)
            label = p.label()
            cap = run.result.capacity_tokens
            row: dict[str, Any] = {
                **label, "setting": spec.setting_label(label),
                "capacity_tokens": math.inf if cap is None else float(cap),
                "replicas": fleet.replicas, "router": fleet.router,
                "router_options": ",".join(f"{k}={v}" for k, v in fleet.options) or None,
                "token_hit_rate": f["token_hit_rate"], "fleet_bound_hit_rate": f["fleet_bound_hit_rate"],
                "routed_bound_hit_rate": f["routed_bound_hit_rate"], "routing_gap": f["routing_gap"],
                "memory_gap": f["memory_gap"], "larger_gap": f["larger_gap"],
                "imbalance_requests": f["load_imbalance"]["requests"],
                "imbalance_prompt_tokens": f["load_imbalance"]["prompt_tokens"]}
            if concurrent is not None:
                row.update(_under_load(trace, opts, p.policy, fleet, concurrent))
            row["replay_seconds"] = round(time.perf_counter() - t0, 4)
            rows.append(row)
            done += 1
            if progress is not None:
                progress(done, total)
    return rows


def _under_load(trace, options, policy: str, fleet: FleetSpec, concurrent) -> dict[str, Any]:
    import numpy as np

    from kvsim.fleet.concurrent import run_fleet_concurrent

    mode, _cost = concurrent
    run = run_fleet_concurrent(trace, [policy], options, mode, fleet)[policy]
    s = run.steps
    ok = ~s.rejected
    prompt = trace.prompt_lengths
    p_ok = int(prompt[ok].sum())
    out: dict[str, Any] = {"concurrent_hit_rate": int(s.cached_tokens[ok].sum()) / p_ok if p_ok else 0.0,
                           "concurrent_preemptions": int(s.preemptions.sum())}
    if run.timed is not None:
        v = run.timed.ttft[ok]
        out["ttft_p50_s"] = percentile(v, 50) if len(v) else float("nan")
        out["ttft_p90_s"] = percentile(v, 90) if len(v) else float("nan")
    return out


def fleet_frame(rows: list[dict]):
    import pandas as pd

    frame = pd.DataFrame.from_records(rows)
    for col in ("block_size", "page_size"):
        if col in frame:
            frame[col] = frame[col].astype("Int64")
    return frame
