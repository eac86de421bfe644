"""Memory tiers in a sweep: ``kvsim sweep ... --offload native --offload-size 0,5e4,1e5,2e5``.

Every point of the sweep (policy, setting, capacity: :class:`kvsim.sweep.grid.SweepPoint`)
is replayed again with each size of the offload tier (``kvsim simulate --offload``'s
tiers, :mod:`kvsim.engines.offload`), sequentially (and, with ``--replay steps|timed``,
under load too), in this process. Size 0 is the point without a tier. One row per point x
tier size: the point's columns, ``offload`` (the backend), ``offload_size`` (as written),
``offload_size_tokens`` (the CPU tier the engine derived: whole chunks or pages),
``disk_size_tokens`` (LMCache's disk tier), the token shares of the prompt tokens served
from each tier (``gpu_hit_rate``, ``cpu_hit_rate``, ``disk_hit_rate``), their sum
``token_hit_rate``, ``tier_gain`` (the gain over the point without a tier), the tier's
loads and evictions and, under load, ``concurrent_hit_rate``, ``concurrent_preemptions``
and (timed) ``ttft_p50_s`` / ``ttft_p90_s`` with the tier beside
``ttft_p50_without_tier_s`` / ``ttft_p90_without_tier_s``.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvsim.errors import ConfigError

#: the tier figures of a row, after the point's columns
TIER_TOKENS = ("offload_size_tokens", "disk_size_tokens")
#: the under-load columns taken from the sweep's own row for the tier-less (size 0) replay
LOAD_COLUMNS = ("concurrent_hit_rate", "concurrent_preemptions", "ttft_p50_s", "ttft_p90_s")


@dataclass(frozen=True)
class TierSize:
    """One size of the --offload-size list: no tier (0), the backend's default, tokens or memory."""

    label: str                      # as the user wrote it ("0", "5e4", "100GiB", or "default")
    none: bool = False              # 0: the point without a tier

    def extra(self, tier: dict[str, Any]) -> dict[str, Any]:
        """The SimOptions.extra keys of a replay at this size (``tier``: the other tier options)."""
        if self.none:
            return {}
        out = dict(tier)
        if self.label != "default":
            out["offload_size"] = self.label
        return out


@dataclass(frozen=True)
class TierGrid:
    """The tier axis of a sweep: the backend, its other options, and the sizes."""

    backend: str
    options: dict[str, Any]         # SimOptions.extra keys shared by every size (offload_size excluded)
    sizes: tuple[TierSize, ...]


def parse_offload_sizes(text: str | None, model: str | None = None) -> list[TierSize]:
    """'0,5e4,1e5,100GiB' -> the sizes, duplicates removed, order kept; 0 = no tier; None =
    one size, the backend's default (``kvsim simulate --offload`` without ``--offload-size``)."""
    from kvsim.engines.offload import parse_size

    if text is None:
        return [TierSize("default")]
    out: list[TierSize] = []
    for item in str(text).split(","):
        label = item.strip()
        if not label:
            continue
        try:
            number = float(label.replace("_", ""))
        except ValueError:
            number = None
        if number is not None and (math.isnan(number) or number < 0):
            raise ConfigError(f"--offload-size: {label!r} is not a size; give 0 (no tier) or a positive number "
                              "of tokens or memory size")
        if number == 0:
            size = TierSize("0", none=True)
        else:
            parse_size(label, "--offload-size", model)      # tokens >= 1, or memory with --model
            size = TierSize(label)
        if size not in out:
            out.append(size)
    if not out:
        raise ConfigError("--offload-size: empty list")
    return out


def tier_grid(tier: dict[str, Any], model: str | None = None) -> TierGrid | None:
    """The tier axis from the offload options (SimOptions.extra keys, ``offload_size`` a comma
    list); None without any. A size list or a tier option without ``--offload``, or an
    unknown backend, is a ConfigError."""
    from kvsim.engines.offload import BACKENDS, OPTIONS

    given = {k: v for k, v in (tier or {}).items() if v is not None}
    if not given:
        return None
    backend = given.get("offload")
    if backend is None:
        flags = ", ".join(OPTIONS[k][0] for k in given if k in OPTIONS)
        raise ConfigError(f"{flags} need(s) --offload native|lmcache|hicache (the tier these sizes are of)")
    backend = str(backend).lower()
    if backend not in BACKENDS:
        raise ConfigError(f"unknown --offload {given['offload']!r}; choose native, lmcache or hicache")
    sizes = parse_offload_sizes(given.pop("offload_size", None), model)
    return TierGrid(backend, {**given, "offload": backend}, tuple(sizes))


def with_tier(options: Any, grid: TierGrid, size: TierSize) -> Any:
    """``options`` (SimOptions) with the tier at ``size`` in its extra (unchanged for size 0)."""
    return replace(options, extra={**(options.extra or {}), **size.extra(grid.options)})


def check(grid: TierGrid, points: Sequence[Any]) -> None:
    """Every point at every size resolves its engine's settings: bad values fail before any log
    is read (a backend of the other engine, an option of another backend, a size the engine
    refuses, an unlimited GPU capacity)."""
    from kvsim.engines import registry

    for p in points:
        if p.capacity.tokens is not None and math.isinf(p.capacity.tokens):
            raise ConfigError(f"--offload {grid.backend} keeps what a finite GPU pool evicts: drop 'inf' from "
                              "--capacity when sweeping --offload-size")
        opts = p.options()
        for size in grid.sizes:
            registry.engine(p.policy).settings(with_tier(opts, grid, size))


def offload_rows(trace, points: list, grid: TierGrid, frame: Any = None, concurrent: Any = None,
                 progress: bool | Callable[[int, int], Any] = False) -> list[dict]:
    """One row per sweep point x tier size (see the module docstring).

    ``frame``: the sweep's own table (its rows in ``points`` order), whose under-load columns
    are the tier-less figures (so no timed replay runs twice); ``concurrent``: ``(ReplayMode,
    step cost)`` as the sweep's; ``progress``: True for the installed bars
    (:mod:`kvsim.progress`), or a ``progress(done, total)`` callback.
    """
    from contextlib import nullcontext

    total = len(points) * len(grid.sizes)
    if progress is True:
        from kvsim.progress import bars

        shown: Any = bars("count")
    else:
        shown = nullcontext(None)
    rows: list[dict] = []
    with shown as display:
        if display is not None:
            bar = display.task("offload tier sizes", total)
            update = lambda done: bar(done)
        elif callable(progress):
            update = lambda done: progress(done, total)
        else:
            update = lambda done: None
        own = None if frame is None else frame.to_dict(orient="records")
        for p in points:
            base = own[p.index] if own is not None else None
            for size in grid.sizes:
                rows.append(_row(trace, p, grid, size, base, concurrent))
                update(len(rows))
            _gains(rows[-len(grid.sizes):], trace, p, base, concurrent)
    return rows


def _row(trace, p, grid: TierGrid, size: TierSize, base: dict | None, concurrent: Any) -> dict[str, Any]:
    from kvsim.drive.metrics import summarize
    from kvsim.drive.sequential import replay
    from kvsim.engines import registry

    t0 = time.perf_counter()
    opts = with_tier(p.options(), grid, size)
    result = replay(p.policy, trace, opts)
    if p.warmup is not None:
        from kvsim.warmup import measured_mask

        result.measured = measured_mask(len(trace), p.warmup)
    s = summarize(result, trace)
    tiers = (s.get("offload") or {}).get("tiers") or {}
    label = p.label()
    cap = result.capacity_tokens
    row: dict[str, Any] = {
        **label, "setting": registry.engine(p.policy).setting_label(label),
        "capacity_tokens": math.inf if cap is None else float(cap),
        "offload": grid.backend, "offload_size": size.label,
        "offload_size_tokens": 0 if size.none else int((tiers.get("cpu") or {}).get("capacity_tokens") or 0),
        "disk_size_tokens": int((tiers.get("disk") or {}).get("capacity_tokens") or 0),
        "gpu_hit_rate": tiers["gpu"]["hit_rate"] if "gpu" in tiers else s["token_hit_rate"],
        "cpu_hit_rate": (tiers.get("cpu") or {}).get("hit_rate", 0.0),
        "disk_hit_rate": (tiers.get("disk") or {}).get("hit_rate", 0.0),
        "token_hit_rate": s["token_hit_rate"],
        "cpu_loaded_tokens": (tiers.get("cpu") or {}).get("loaded_tokens", 0),
        "cpu_evicted_tokens": (tiers.get("cpu") or {}).get("evicted_tokens", 0),
        "admitted": s.get("admitted"), "rejected": s.get("rejected"),
    }
    if concurrent is not None:
        if size.none and base is not None and all(k in base for k in LOAD_COLUMNS[:2]):
            row.update({k: base[k] for k in LOAD_COLUMNS if k in base})
        else:
            from kvsim.drive.views import concurrent_columns

            mode, cost = concurrent
            row.update(concurrent_columns(trace, opts, p.policy, mode, cost, result.measured))
    row["replay_seconds"] = round(time.perf_counter() - t0, 4)
    return row


def _gains(rows: list[dict], trace, p, base: dict | None, concurrent: Any) -> None:
    """Each row's gain over the point without a tier, and (timed) the TTFT without it."""
    plain = next((r for r in rows if r["offload_size"] == "0"), None)
    hit = plain["token_hit_rate"] if plain is not None else (base or {}).get("token_hit_rate")
    ttft = {}
    if concurrent is not None and concurrent[1] is not None:
        source = plain if plain is not None else base
        if source is None:
            from kvsim.drive.views import concurrent_columns

            mode, cost = concurrent
            source = concurrent_columns(trace, p.options(), p.policy, mode, cost)
        ttft = {f"ttft_p{q}_without_tier_s": source.get(f"ttft_p{q}_s") for q in (50, 90)}
    for r in rows:
        r["tier_gain"] = None if hit is None else r["token_hit_rate"] - hit
        r.update(ttft)


def offload_frame(rows: list[dict]):
    """The rows as a DataFrame, the columns in a fixed order (the CSV's)."""
    import pandas as pd

    frame = pd.DataFrame.from_records(rows)
    first = [c for c in ("policy", "capacity", "block_size", "page_size", "eviction_policy", "setting",
                         "capacity_tokens", "offload", "offload_size", *TIER_TOKENS, "gpu_hit_rate", "cpu_hit_rate",
                         "disk_hit_rate", "token_hit_rate", "tier_gain") if c in frame]
    frame = frame[first + [c for c in frame.columns if c not in first]]
    for col in ("block_size", "page_size"):
        if col in frame:
            frame[col] = frame[col].astype("Int64")
    return frame
