"""The recommendation: APC or RadixAttention, which block/page size, and the three
changes that would save the most prefill tokens, each with its computed saving.

Rules (stated in the report with their numbers):

- RadixAttention when sharing often ends inside blocks so that full-block caching loses
  >= ``PARTIAL_LOSS_POINTS`` points of prompt tokens against token granularity, or when
  reuse from a request that arrived within the burst window is >= ``BURST_POINTS``
  points of prompt tokens (such reuse needs the two to be scheduled one after the other;
  SGLang's longest-prefix-match scheduling with in-batch prefix caching does that);
  APC otherwise (the same reuse with a simpler, block-hashed cache).
- Block/page size: the largest size whose bound is within ``SIZE_TOLERANCE_POINTS``
  points and ``SIZE_TOLERANCE_RELATIVE`` of the smallest size analysed (larger blocks
  mean fewer table entries and less hashing).
"""
from __future__ import annotations

from typing import Any

PARTIAL_LOSS_POINTS = 2.0
BURST_POINTS = 5.0
SIZE_TOLERANCE_POINTS = 1.0
SIZE_TOLERANCE_RELATIVE = 0.05
MIN_CHANGE_POINTS = 0.1  # changes that save less than this share of prompt tokens are not listed


def _pick_size(rows: list[dict[str, Any]]) -> dict[str, Any]:
    best = rows[0]["token_weighted_recompute"]
    slack = min(SIZE_TOLERANCE_POINTS / 100.0, SIZE_TOLERANCE_RELATIVE * best)
    ok = [r for r in rows if best - r["token_weighted_recompute"] <= slack + 1e-12]
    return max(ok, key=lambda r: r["block_size"])


def recommend(report: dict[str, Any]) -> dict[str, Any]:
    """Section 9, from the other sections of the report (plain dicts)."""
    base = report["bound"]
    ub = report["upper_bound"]
    prompt = max(1, base["prompt_tokens"])
    radix, apc16 = base["radix"], base["block16"]
    loss_points = 100.0 * (radix - apc16)
    loss_tokens = base["radix_tokens"] - base["block16_tokens"]
    hist = report.get("divergence", {}).get("histogram", {})
    burst = report.get("scheduling", {})
    burst_share = burst.get("burst_reuse_share") or 0.0
    burst_points = 100.0 * (burst.get("burst_reuse_tokens") or 0) / prompt
    engine = "RadixAttention" if (loss_points >= PARTIAL_LOSS_POINTS or burst_points >= BURST_POINTS) else "APC"
    rows = [r for r in ub["blocks"] if r["block_size"] >= 16] or ub["blocks"]
    size_row = _pick_size(rows)
    numbers = {
        "token_level_bound": radix, "apc_block16_bound": apc16,
        "partial_block_loss_points": loss_points, "partial_block_loss_tokens": loss_tokens,
        "stops_inside_block_share": hist.get("stops_inside_block_share"),
        "burst_reuse_share": burst_share if burst.get("known") else None,
        "burst_reuse_points": burst_points if burst.get("known") else None,
        "chosen_size": size_row["block_size"],
        "chosen_size_bound": size_row["token_weighted_recompute"],
        "chosen_size_loss_tokens": base["radix_tokens"] - size_row["hit_tokens_recompute"],
    }
    prompts_only = ub.get("prompts_only")
    if prompts_only is not None:
        numbers["reply_reuse_points"] = 100.0 * (base["token"] - prompts_only["token"])
    reasons = [
        (f"full 16-token blocks (APC) reach {100 * apc16:.1f}% of prompt tokens vs {100 * radix:.1f}% at token "
         f"granularity (RadixAttention, page 1): {loss_points:.1f} points ({loss_tokens:,} tokens) lost to partial "
         f"blocks"),
    ]
    if size_row["block_size"] != 16:
        reasons.append(f"at block size {size_row['block_size']} the bound is "
                       f"{100 * size_row['token_weighted_recompute']:.1f}% "
                       f"({numbers['chosen_size_loss_tokens']:,} tokens below token granularity)")
    if hist.get("requests_stopping_in_prompt"):
        reasons.append(f"{100 * hist['stops_inside_block_share']:.0f}% of the requests that stop matching do so "
                       f"inside a 16-token block")
    if burst.get("known"):
        reasons.append(f"{100 * burst_share:.0f}% of reused tokens ({burst_points:.1f} points of prompt tokens) come "
                       f"from a request that arrived less than {burst['window_s']:g} s earlier"
                       + (": cache-aware scheduling (SGLang) can keep them" if burst_points >= BURST_POINTS else ""))
    if prompts_only is not None and numbers["reply_reuse_points"] >= 0.05:
        reasons.append(f"{numbers['reply_reuse_points']:.1f} points of the bound come from cached replies "
                       "(multi-turn history; both engines keep generated tokens)")
    if engine == "APC":
        size = size_row["block_size"]
        size_text = f"block size {size}"
        if size != rows[0]["block_size"]:
            size_text += (f" ({100 * size_row['token_weighted_recompute']:.1f}%, within {SIZE_TOLERANCE_POINTS:g} "
                          f"point and {100 * SIZE_TOLERANCE_RELATIVE:g}% of block size {rows[0]['block_size']})")
    elif loss_points >= SIZE_TOLERANCE_POINTS:
        size, size_text = 1, "page size 1 (token granularity: blocks lose reuse here)"
    else:
        size = size_row["block_size"]
        size_text = f"page size {size} (pages lose under {SIZE_TOLERANCE_POINTS:g} point here)"
    if base["radix_tokens"] == 0:
        engine, size = "none", None
        size_text = ("no prompt prefix is reused as the log stands: a prefix cache saves nothing until the "
                     "prompts change")
    metric = "token" if engine == "RadixAttention" else "block16"
    changes = _changes(report, metric, engine, loss_tokens, prompt)
    return {"engine": engine, "size": size, "size_text": size_text, "reasons": reasons, "numbers": numbers,
            "changes": changes[:3], "metric": "token-level" if metric == "token" else "APC block 16"}


def _changes(report: dict[str, Any], metric: str, engine: str, loss_tokens: int, prompt: int) -> list[dict[str, Any]]:
    out = []
    vol = report.get("divergence", {}).get("volatile") or {}
    for s in vol.get("sites", []):
        gain = (s.get("moved_bound") or {}).get(f"{metric}_gain_tokens")
        if gain and gain > 0:
            where = s.get("location") or {}
            loc = (f"message {where['message']} ({where['role']})" if where.get("message") is not None
                   else "the prompt")
            what = {"volatile value": "the volatile value",
                    "insertion or reordering": "the inserted or reordered content"}.get(s["kind"], "the divergent part")
            out.append({"change": f"move {what} at token {s['offset']} of {loc} (about "
                                  f"{s['median_span_tokens']:.0f} tokens, {s['requests_diverging']} requests) "
                                  f"after the shared part that follows it", "tokens_saved": int(gain)})
    sess = report.get("sessions") or {}
    if sess.get("tokens_lost"):
        out.append({"change": f"keep chat history verbatim (send back the previous prompt and reply token for "
                              f"token; {sess['breaks']} turns break it)", "tokens_saved": int(sess["tokens_lost"])})
    iso = report.get("isolation") or {}
    if iso.get("salts_ignored", {}).get(f"{metric}_cost_tokens", 0) > 0:
        out.append({"change": "drop per-tenant cache salts where isolation is not required",
                    "tokens_saved": int(iso["salts_ignored"][f"{metric}_cost_tokens"])})
    if iso.get("adapters_ignored", {}).get(f"{metric}_cost_tokens", 0) > 0:
        out.append({"change": "share the base prompt across LoRA adapters (route it to one adapter or the "
                              "base model; valid only if the adapters leave K/V unchanged)",
                    "tokens_saved": int(iso["adapters_ignored"][f"{metric}_cost_tokens"])})
    if engine == "APC" and loss_tokens > 0:
        out.append({"change": "cache at token granularity (RadixAttention, page 1) instead of 16-token blocks",
                    "tokens_saved": int(loss_tokens)})
    for c in out:
        c["points"] = 100.0 * c["tokens_saved"] / prompt
    out = [c for c in out if c["points"] >= MIN_CHANGE_POINTS]
    out.sort(key=lambda c: -c["tokens_saved"])
    return out
