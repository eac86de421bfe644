"""Workload shape: counts, length percentiles, arrival rate over time, provenance."""
from __future__ import annotations

from typing import Any

import numpy as np

from kvsim.io.trace.columns import NONE, Trace

PERCENTILES = (50, 90, 99)
TIMELINE_BINS = 12


def length_stats(lengths: np.ndarray) -> dict[str, Any]:
    """Mean, p50/p90/p99 and max of a length column (None-filled when empty)."""
    if len(lengths) == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}, "max": None, "total": 0}
    q = np.percentile(lengths, PERCENTILES)
    return {"mean": float(lengths.mean()), **{f"p{p}": float(v) for p, v in zip(PERCENTILES, q)},
            "max": int(lengths.max()), "total": int(lengths.sum())}


def arrival_stats(arrival: np.ndarray, lengths: np.ndarray, bins: int = TIMELINE_BINS) -> dict[str, Any]:
    """Span, mean rates and a coarse timeline (requests and prompt tokens per bin)."""
    known = ~np.isnan(arrival)
    if known.sum() < 2:
        return {"known": bool(known.any()), "span_s": None, "requests_per_s": None,
                "prompt_tokens_per_s": None, "peak_requests_per_s": None, "timeline": []}
    t = arrival[known]
    t0, t1 = float(t.min()), float(t.max())
    span = t1 - t0
    out: dict[str, Any] = {"known": True, "span_s": span}
    if span <= 0:
        out.update(requests_per_s=None, prompt_tokens_per_s=None, peak_requests_per_s=None, timeline=[])
        return out
    out["requests_per_s"] = len(t) / span
    out["prompt_tokens_per_s"] = float(lengths[known].sum()) / span
    edges = np.linspace(t0, t1, bins + 1)
    which = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, bins - 1)
    reqs = np.bincount(which, minlength=bins)
    toks = np.bincount(which, weights=lengths[known], minlength=bins)
    width = span / bins
    out["peak_requests_per_s"] = float(reqs.max() / width)
    out["timeline"] = [{"start_s": float(edges[b] - t0), "end_s": float(edges[b + 1] - t0),
                        "requests": int(reqs[b]), "requests_per_s": float(reqs[b] / width),
                        "prompt_tokens": int(toks[b])} for b in range(bins)]
    return out


def _used(codes: np.ndarray) -> int:
    return int(len(np.unique(codes[codes != NONE])))


def workload_shape(trace: Trace) -> dict[str, Any]:
    """Section 1 of the report: what the log holds."""
    meta = trace.meta
    out_known = int(trace.output_known.sum())
    return {
        "requests": len(trace),
        "prompt_tokens": trace.num_prompt_tokens,
        "output_tokens": int(trace.output_lengths.sum()),
        "sessions": _used(trace.session),
        "tenants": _used(trace.tenant),
        "cache_salts": _used(trace.cache_salt),
        "lora_adapters": _used(trace.lora),
        "requests_with_session": int((trace.session != NONE).sum()),
        "requests_with_salt": int((trace.cache_salt != NONE).sum()),
        "requests_with_lora": int((trace.lora != NONE).sum()),
        "output_ids_known": out_known,
        "prompt_length": length_stats(trace.prompt_lengths),
        "output_length": length_stats(trace.output_lengths),
        "arrival": arrival_stats(trace.arrival, trace.prompt_lengths.astype(np.float64)),
        "tokenizer": meta.tokenizer,
        "chat_template": meta.chat_template,
        "formats": sorted(set(meta.formats)),
        "sources": list(meta.sources),
        "hash_block_size": meta.hash_block_size,
        "has_prefix_info": bool(trace.has_tokens),
        "message_structure": trace.msg_offsets is not None,
        "skipped_lines": meta.skipped_lines,
        "notes": list(meta.notes),
    }
