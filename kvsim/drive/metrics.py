"""Summary figures of a replay, per request, per tenant/salt/adapter.

Definitions (also in the README):
- token hit rate: Σ cached prompt tokens / Σ prompt tokens over admitted requests — the
  paper/benchmark definition SGLang uses (``cached_tokens / prompt_tokens``) and what vLLM's
  per-request ``num_cached_tokens`` adds up to.
- vLLM logged hit rate: hits / queries as vLLM 0.33 records them, once per request at
  admission; requests that skip the cache read (prompt logprobs) are not counted
  (``docs/engines/apc.md §5.1``).
- cache reads skipped: admitted requests whose lookup a logprob request skipped or cut
  short — APC: prompt logprobs skip it (``docs/engines/apc.md §2.1``); radix: the match is capped
  at ``logprob_start_len``, 0 for prompt logprobs (``docs/engines/radix.md §2.1``).
- request hit rate: share of admitted requests with at least one cached token.
- mean cached fraction: mean over admitted requests of cached / prompt tokens.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.io.trace.columns import NONE, Trace
from kvsim.drive.result import ReplayResult

if TYPE_CHECKING:
    import pandas as pd


def counted(result: ReplayResult) -> np.ndarray:
    """bool (n,): the requests every figure counts (all but a warm-up window, ``kvsim.warmup``)."""
    return np.ones(len(result), bool) if result.measured is None else np.asarray(result.measured, bool)


def summarize(result: ReplayResult, trace: Trace, calibration: Any = None) -> dict[str, Any]:
    """Headline figures of one replay as a flat dict (JSON-ready), over the counted requests."""
    prompt = trace.prompt_lengths
    m = counted(result)
    ok = ~result.rejected & m
    cached = result.cached_tokens
    p_ok = int(prompt[ok].sum())
    c_ok = int(cached[ok].sum())
    looked = ok & result.read_cache
    queries, hits = int(prompt[looked].sum()), int(cached[looked].sum())
    frac = np.divide(cached[ok], prompt[ok], out=np.zeros(int(ok.sum())), where=prompt[ok] > 0)
    out: dict[str, Any] = {
        "policy": result.policy,
        "requests": int(m.sum()),
        "admitted": int(ok.sum()),
        "rejected": int((result.rejected & m).sum()),
        "prompt_tokens": p_ok,
        "cached_tokens": c_ok,
        "computed_tokens": p_ok - c_ok,
        "output_tokens": int(np.maximum(trace.output_lengths, 1)[ok].sum()),
        "token_hit_rate": c_ok / p_ok if p_ok else 0.0,
        "request_hit_rate": float((cached[ok] > 0).mean()) if ok.any() else 0.0,
        "mean_cached_fraction": float(frac.mean()) if len(frac) else 0.0,
        "cache_reads_skipped": int((ok & ~result.read_cache).sum()),
        "evictions": int(result.evictions[m].sum()),
        "evicted_tokens": int(result.evicted_tokens[m].sum()),
        "capacity_tokens": result.capacity_tokens,
        "peak_used_tokens": int(result.peak_used_tokens),
        "replay_seconds": round(float(result.elapsed_s), 4),
    }
    from kvsim.engines import registry

    out.update(registry.engine(result.policy).sequential_figures(result, hits, queries))
    for key in ("sglang_logged_hit_rate",):
        if key in result.extra and result.measured is None:  # a whole-run figure: none with a warm-up
            out[key] = result.extra[key]
    if result.measured is not None:
        out["warmup_requests"] = len(result) - int(m.sum())
    if calibration is not None:
        out.update(prefill_time_saved(result, trace, calibration))
    if "offload" in result.extra:   # an offload tier's hits and transfers (kvsim.tiers.report)
        out["offload"] = result.extra["offload"].summary(prompt, ok)
    return out


def prefill_time_saved(result: ReplayResult, trace: Trace, calibration: Any) -> dict[str, float]:
    """Estimated prefill GPU-seconds with and without the cache, from a gpu-validate calibration."""
    ok = ~result.rejected & counted(result)
    prompt = trace.prompt_lengths[ok].astype(np.float64)
    cached = result.cached_tokens[ok].astype(np.float64)
    full = np.array([calibration.prefill_seconds(int(p), 0) for p in prompt])
    reuse = np.array([calibration.prefill_seconds(int(p - c), int(c)) for p, c in zip(prompt, cached)])
    return {
        "prefill_gpu_seconds_without_cache": float(full.sum()),
        "prefill_gpu_seconds_with_cache": float(reuse.sum()),
        "prefill_gpu_seconds_saved": float(full.sum() - reuse.sum()),
        "mean_ttft_prefill_seconds": float(reuse.mean()) if len(reuse) else 0.0,
        "mean_ttft_prefill_seconds_without_cache": float(full.mean()) if len(full) else 0.0,
    }


def per_request_columns(result: ReplayResult, trace: Trace) -> dict[str, list]:
    """The per-request columns as Python lists, in input order, warm-up requests left out
    (what ``--per-request`` writes; no pandas, which a command need not import for it)."""
    prompt = trace.prompt_lengths
    cached = np.where(result.rejected, 0, result.cached_tokens)
    columns: dict[str, list] = {
        "index": list(range(len(trace))),
        "request_id": [trace.request_id(i) for i in range(len(trace))],
        "prompt_tokens": prompt.tolist(),
        "cached_tokens": cached.tolist(),
        "computed_tokens": np.where(result.rejected, 0, prompt - cached).tolist(),
        "output_tokens": np.maximum(trace.output_lengths, 1).tolist(),
        "rejected": np.asarray(result.rejected, bool).tolist(),
        "cache_read_skipped": (~result.rejected & ~result.read_cache).tolist(),
        "evicted_tokens": result.evicted_tokens.tolist(),
    }
    if "offload" in result.extra:   # cached tokens by tier (gpu, cpu, disk)
        tier = result.extra["offload"]
        columns["cached_by_tier"] = [tier.cached_by_tier(i) for i in range(len(trace))]
    columns.update(category_names(trace))
    m = counted(result)
    if not m.all():                 # warm-up requests are left out
        keep = np.flatnonzero(m).tolist()
        columns = {k: [v[i] for i in keep] for k, v in columns.items()}
    return columns


def per_request_frame(result: ReplayResult, trace: Trace) -> pd.DataFrame:
    """One row per request, in input order (:func:`per_request_columns` as a frame)."""
    import pandas as pd

    columns = per_request_columns(result, trace)
    return pd.DataFrame({k: pd.Series(v, dtype=object) if k in OBJECT_COLUMNS else v for k, v in columns.items()})


#: columns that hold strings, dicts or None (kept as Python objects in a frame)
OBJECT_COLUMNS = frozenset({"request_id", "cached_by_tier", "tenant", "cache_salt", "lora", "session"})


def category_names(trace: Trace) -> dict[str, list]:
    """The tenant / cache_salt / lora / session names per request (None where a request has
    none), for the columns the trace has."""
    out = {}
    for column in ("tenant", "cache_salt", "lora", "session"):
        codes = getattr(trace, column)
        if (codes != NONE).any():
            out[column] = trace.names(column)
    return out


def category_columns(trace: Trace) -> dict[str, pd.Series]:
    """:func:`category_names` as object Series (None stays JSON null)."""
    import pandas as pd

    return {name: pd.Series(names, dtype=object) for name, names in category_names(trace).items()}


def breakdown(result: ReplayResult, trace: Trace, column: str) -> pd.DataFrame:
    """Hit rate per tenant / cache_salt / lora (only groups present in the trace)."""
    import pandas as pd

    codes = getattr(trace, column)
    m = counted(result)
    ok = ~result.rejected & m
    df = pd.DataFrame({
        "group": codes, "prompt": trace.prompt_lengths * ok, "cached": result.cached_tokens * ok,
        "requests": np.ones(len(trace), np.int64), "rejected": result.rejected.astype(np.int64),
    })[m]
    g = df.groupby("group", sort=True).sum()
    g["token_hit_rate"] = np.where(g["prompt"] > 0, g["cached"] / g["prompt"].where(g["prompt"] > 0, 1), 0.0)
    g.index = ["(none)" if c == NONE else trace.name_of(column, int(c)) for c in g.index]
    g.index.name = column
    return g.rename(columns={"prompt": "prompt_tokens", "cached": "cached_tokens"})[
        ["requests", "rejected", "prompt_tokens", "cached_tokens", "token_hit_rate"]]


def breakdowns(result: ReplayResult, trace: Trace) -> dict[str, pd.DataFrame]:
    """Breakdowns for every grouping column with more than one group."""
    out = {}
    for column in ("tenant", "cache_salt", "lora"):
        if len(np.unique(getattr(trace, column))) > 1:
            out[column] = breakdown(result, trace, column)
    return out
