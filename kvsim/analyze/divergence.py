"""First-divergence analysis and volatile-content detection.

Every request stops matching its best earlier request (the first one that had its
longest reused prefix) at token ``r``. When the two run together again shortly after
(the same tokens resume within ``max_skip`` tokens and stay equal for ``min_run``), the
tokens in between are content that breaks an otherwise shared prefix: a date, a request
id, a user name, a question placed before a shared document, a shuffled list.

Requests that diverge at the same place (same prefix of the same length) form a *site*.
For a site we move the divergent span of every prompt that has it to the end of that
prompt and recompute the unlimited-cache bound: the gain is what moving that content
after the stable part would recover.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from kvsim.analyze import _kernels as K
from kvsim.analyze.options import AnalyzeOptions
from kvsim.analyze.prefixes import clip_text, message_at
from kvsim.analyze.reuse import PrefixIndex
from kvsim.io.trace import Trace

HIST_EDGES = (0, 1, 16, 64, 256, 1024, 4096, 16384, 65536)
Rebound = Callable[[np.ndarray], dict[str, Any]]  # moved tokens -> bound summary
Decoder = Callable[[np.ndarray], str]


def divergence_histogram(reuse: np.ndarray, lengths: np.ndarray, block: int = 16) -> dict[str, Any]:
    """Where requests stop matching: a histogram of r over requests that stop inside
    their prompt, plus how often that point falls inside a block."""
    stopped = (reuse < lengths)
    r = reuse[stopped]
    edges = list(HIST_EDGES) + [np.iinfo(np.int64).max]
    counts = np.histogram(r, bins=np.asarray(edges, dtype=np.float64))[0] if len(r) else np.zeros(len(edges) - 1)
    bins = []
    for k in range(len(edges) - 1):
        lo, hi = edges[k], edges[k + 1]
        label = str(lo) if hi == lo + 1 else (f"{lo}-{hi - 1}" if k < len(edges) - 2 else f"{lo}+")
        bins.append({"from": int(lo), "to": None if k == len(edges) - 2 else int(hi - 1), "label": label,
                     "requests": int(counts[k])})
    inside = (r > 0) & (r % block != 0)
    return {
        "bins": bins,
        "requests_stopping_in_prompt": int(stopped.sum()),
        "requests_whole_prompt_seen": int((~stopped & (lengths > 0)).sum()),
        "median_stop": float(np.median(r)) if len(r) else None,
        "block": block,
        "stops_inside_block": int(inside.sum()),
        "stops_inside_block_share": float(inside.mean()) if len(r) else 0.0,
    }


def _previous_in_namespace(root: np.ndarray) -> np.ndarray:
    """Index of the previous request with the same namespace root (-1 if none)."""
    order = np.argsort(root, kind="stable")
    prev = np.full(len(root), -1, np.int64)
    same = root[order[1:]] == root[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    return prev


def find_sites(index: PrefixIndex, tokens: np.ndarray, offsets: np.ndarray,
               opts: AnalyzeOptions) -> list[dict[str, Any]]:
    """Divergence sites where requests re-converge with their best earlier request."""
    reuse, lengths = index.reuse, index.lengths
    rows = np.flatnonzero(reuse < lengths)
    if len(rows) == 0:
        return []
    cand = index.source[rows].copy()
    zero = reuse[rows] == 0
    cand[zero] = _previous_in_namespace(index.root)[rows[zero]]
    pos = reuse[rows].astype(np.int64)
    da = np.empty(len(rows), np.int64)
    db = np.empty(len(rows), np.int64)
    run = np.empty(len(rows), np.int64)
    K.realign_many(tokens, offsets, rows, cand, pos, opts.max_skip, opts.window, da, db, run)
    keep = run >= opts.min_run
    if not keep.any():
        return []
    rows, cand, pos, da, db, run = rows[keep], cand[keep], pos[keep], da[keep], db[keep], run[keep]
    # a site: the same resume point (the tokens where the shared part comes back, in one
    # namespace); divergences at nearby offsets before it (a date, then a time) are one site
    anchor = K.span_hashes(tokens, offsets[cand] + pos + db, np.full(len(rows), opts.window, np.int64))
    root = index.root[rows]
    order = np.lexsort((rows, pos, anchor, root))
    r_, a_, p_ = root[order], anchor[order], pos[order]
    change = (r_[1:] != r_[:-1]) | (a_[1:] != a_[:-1]) | (p_[1:] - p_[:-1] > opts.max_skip)
    bounds = np.flatnonzero(np.r_[True, change, True])
    sites = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        sel = order[a:b]
        if len(sel) < opts.min_site_requests:
            continue
        first = sel[0]  # smallest offset, earliest request
        o = int(pos[first])
        span = pos[sel] + da[sel] - o
        ref_span = pos[sel] + db[sel] - o
        sites.append({
            "offset": o,
            "ref": int(cand[first]),
            "ref_span": int(db[first]),
            "example_span": int(da[first]),
            "rows": rows[sel],
            "kind": _kind(float(np.median(da[sel])), float(np.median(db[sel])), opts.volatile_span),
            "requests_diverging": int(len(sel)),
            "median_span_tokens": float(np.median(span)),
            "median_ref_span_tokens": float(np.median(ref_span)),
            "median_shared_after": float(np.median(run[sel])),
            "tokens_at_stake": int(run[sel].sum()),
        })
    sites.sort(key=lambda s: -s["tokens_at_stake"])
    return sites


def _kind(da: float, db: float, volatile_span: int) -> str:
    if da == 0 or db == 0:
        return "insertion or reordering"
    if da <= volatile_span and db <= volatile_span:
        return "volatile value"
    return "divergent section"


def site_members(index: PrefixIndex, tokens: np.ndarray, offsets: np.ndarray, site: dict[str, Any],
                 window: int, max_skip: int) -> tuple[np.ndarray, np.ndarray]:
    """Requests that hold the site's prefix and its anchor (the tokens where the shared
    part resumes), with the position of that anchor in each."""
    G = index.block
    o, ref = site["offset"], site["ref"]
    q, e = divmod(o, G)
    lengths = index.lengths
    if q > 0:
        node = index.ids[index.blk_off[ref] + q - 1]
        ok = index.prompt_blocks >= q
        rows = np.flatnonzero(ok)
        rows = rows[index.ids[index.blk_off[rows] + q - 1] == node]
    else:
        rows = np.flatnonzero(index.root == index.root[ref])
    rows = rows[lengths[rows] >= o + window]
    if e > 0 and len(rows):
        idx = offsets[rows][:, None] + q * G + np.arange(e)[None, :]
        ref_part = tokens[offsets[ref] + q * G: offsets[ref] + o]
        rows = rows[(tokens[idx] == ref_part[None, :]).all(axis=1)]
    a0 = int(offsets[ref] + o + site["ref_span"])
    anchor = np.ascontiguousarray(tokens[a0:a0 + window])
    if len(anchor) < window or len(rows) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    at = K.find_anchor(tokens, offsets, rows.astype(np.int64), o, anchor, max_skip)
    moved = at > o
    return rows[moved], at[moved]


def move_sites(tokens: np.ndarray, offsets: np.ndarray, moves: list[tuple[int, np.ndarray, np.ndarray]]) -> np.ndarray:
    """A copy of the tokens with each (offset, rows, anchor) span moved to its prompt's end
    (later offsets first, so earlier spans keep their positions)."""
    out = tokens.copy()
    for o, rows, at in sorted(moves, key=lambda m: -m[0]):
        if len(rows):
            K.rotate_spans(out, offsets, rows, np.full(len(rows), o, np.int64), at)
    return out


def volatile_content(index: PrefixIndex, trace: Trace, tokens: np.ndarray, opts: AnalyzeOptions,
                     rebound: Rebound, base: dict[str, Any], decode: Decoder | None = None,
                     per_site: int = 3) -> dict[str, Any]:
    """Section 4b: sites, where they are, and the bound with their content moved."""
    offsets = trace.offsets
    sites = find_sites(index, tokens, offsets, opts)
    movable = [s for s in sites if s["kind"] != "insertion or reordering"][:opts.max_sites_moved]
    moves = {}
    for s in movable:
        rows, at = site_members(index, tokens, offsets, s, opts.window, opts.max_skip)
        moves[id(s)] = (s["offset"], rows, at)
        s["requests_moved"] = int(len(rows))
    report_sites = []
    for k, s in enumerate(sites[:opts.top]):
        item = {key: s[key] for key in ("offset", "kind", "requests_diverging", "median_span_tokens",
                                        "median_ref_span_tokens", "median_shared_after", "tokens_at_stake")}
        item["location"] = message_at(trace, s["ref"], s["offset"])
        item["source_request"] = trace.request_id(s["ref"])
        item["example_request"] = trace.request_id(int(s["rows"][0]))
        item["requests_moved"] = s.get("requests_moved", 0)
        if id(s) in moves and k < per_site and moves[id(s)][1].size:
            moved = rebound(move_sites(tokens, offsets, [moves[id(s)]]))
            item["moved_bound"] = _gain(moved, base)
        if decode is not None:
            item["text"] = _site_text(tokens, offsets, s, decode)
        report_sites.append(item)
    out: dict[str, Any] = {"sites": report_sites, "sites_found": len(sites),
                           "settings": {"max_skip": opts.max_skip, "window": opts.window, "min_run": opts.min_run,
                                        "volatile_span": opts.volatile_span,
                                        "min_site_requests": opts.min_site_requests}}
    all_moves = [m for m in moves.values() if m[1].size]
    if all_moves:
        out["all_moved_bound"] = _gain(rebound(move_sites(tokens, offsets, all_moves)), base)
        out["all_moved_sites"] = len(all_moves)
    return out


def _gain(moved: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """The moved-content bound next to the original one."""
    out = dict(moved)
    for key in ("token", "block16"):
        out[f"{key}_gain_tokens"] = moved[f"{key}_tokens"] - base[f"{key}_tokens"]
        out[f"{key}_gain_points"] = 100.0 * (moved[key] - base[key])
    return out


def _site_text(tokens: np.ndarray, offsets: np.ndarray, s: dict[str, Any], decode: Decoder) -> dict[str, str]:
    ref, o = s["ref"], s["offset"]
    start = int(offsets[ref])
    other = int(s["rows"][0])
    o2 = int(offsets[other])
    span_other = s["example_span"]
    return {
        "before": decode(tokens[start + max(0, o - 12):start + o]),
        "span": clip_text(decode(tokens[start + o:start + o + s["ref_span"]])),
        "other_span": clip_text(decode(tokens[o2 + o:o2 + o + span_other])),
        "after": decode(tokens[start + o + s["ref_span"]:start + o + s["ref_span"] + 12]),
    }
