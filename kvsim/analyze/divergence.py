"""First-divergence analysis and volatile-content detection.

Every request stops matching its best earlier request (the first one that had its
longest reused prefix) at token ``r``. When the two run together again shortly after
(the same tokens resume within ``max_skip`` tokens and stay equal for ``min_run``), the
tokens in between are content that breaks an otherwise shared prefix: a date, a request
id, a user name, a question placed before a shared document, a shuffled list.

Requests that diverge at the same place (same prefix of the same length) form a *site*.
For a site we move the divergent span of every prompt that has it after the shared part
that follows it (the stable part) and recompute the unlimited-cache bound: the gain is
what moving that content after the stable part would recover. The same move fixes a
popular document placed after retrieved ones, or an item inserted into a shared list.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from kvsim.analyze import _kernels as K
from kvsim.analyze.options import AnalyzeOptions
from kvsim.analyze.prefixes import clip_text, message_at
from kvsim.analyze.reuse import PrefixIndex
from kvsim.analyze.upper_bound import bound_change
from kvsim.io.trace.columns import Trace

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
                 window: int, max_skip: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The requests that hold the site's prefix and, within ``max_skip`` tokens after it,
    its anchor (the tokens where the shared part resumes). Returns (rows, anchor position,
    end of the shared part after the anchor) for those whose span is not empty."""
    G = index.block
    o, ref = site["offset"], site["ref"]
    q, e = divmod(o, G)
    lengths = index.lengths
    if q > 0:
        node = index.ids[index.blk_off[ref] + q - 1]
        rows = np.flatnonzero(index.prompt_blocks >= q)
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
    empty = np.zeros(0, np.int64)
    if len(anchor) < window or len(rows) == 0:
        return empty, empty, empty
    rows = rows.astype(np.int64)
    at = K.find_anchor(tokens, offsets, rows, o, anchor, max_skip)
    found = at >= 0
    rows, at = rows[found], at[found]
    # the shared part after the anchor: the run each prompt has in common with the
    # reference's; the reference itself takes the longest run the others have
    run = K.runs_against(tokens, offsets, rows, at, a0, int(offsets[ref + 1]))
    others = rows != ref
    if not others.any():
        return empty, empty, empty
    run[~others] = run[others].max()
    moved = at > o
    return rows[moved], at[moved], at[moved] + run[moved]


def move_sites(tokens: np.ndarray, offsets: np.ndarray,
               moves: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]) -> np.ndarray:
    """A copy of the tokens where, for each (offset, rows, anchor, end), the divergent span
    [offset, anchor) of each row is moved after the shared part [anchor, end). Later
    offsets go first, so earlier spans keep their positions."""
    out = tokens.copy()
    for o, rows, at, end in sorted(moves, key=lambda m: -m[0]):
        if len(rows):
            K.rotate_spans(out, offsets, rows, np.full(len(rows), o, np.int64), at, end)
    return out


def volatile_content(index: PrefixIndex, trace: Trace, tokens: np.ndarray, opts: AnalyzeOptions,
                     rebound: Rebound, base: dict[str, Any], decode: Decoder | None = None,
                     per_site: int = 5) -> dict[str, Any]:
    """Section 4b: sites, where they are, and the bound with their divergent span moved.

    The bound is recomputed for each of the first ``per_site`` sites alone, then for the
    sites that gain, best first, together (a request moved for one site is left alone by
    the next, so moves never undo each other)."""
    offsets = trace.offsets
    sites = find_sites(index, tokens, offsets, opts)
    report_sites = []
    gains = []
    for k, s in enumerate(sites[:opts.top]):
        item = {key: s[key] for key in ("offset", "kind", "requests_diverging", "median_span_tokens",
                                        "median_ref_span_tokens", "median_shared_after", "tokens_at_stake")}
        item["location"] = message_at(trace, s["ref"], s["offset"])
        item["source_request"] = trace.request_id(s["ref"])
        item["example_request"] = trace.request_id(int(s["rows"][0]))
        if k < per_site:
            move = (s["offset"], *site_members(index, tokens, offsets, s, opts.window, opts.max_skip))
            item["requests_moved"] = int(len(move[1]))
            if len(move[1]):
                item["moved_bound"] = bound_change(rebound(move_sites(tokens, offsets, [move])), base, "gain")
                gains.append((item["moved_bound"]["token_gain_tokens"], move))
        if decode is not None:
            item["text"] = _site_text(tokens, offsets, s, decode)
        report_sites.append(item)
    out: dict[str, Any] = {"sites": report_sites, "sites_found": len(sites),
                           "settings": {"max_skip": opts.max_skip, "window": opts.window, "min_run": opts.min_run,
                                        "volatile_span": opts.volatile_span,
                                        "min_site_requests": opts.min_site_requests}}
    chosen, taken = [], np.zeros(len(trace), bool)
    for gain, (o, rows, at, end) in sorted(gains, key=lambda g: -g[0]):
        if gain <= 0:
            continue
        free = ~taken[rows]
        taken[rows] = True
        chosen.append((o, rows[free], at[free], end[free]))
    if len(chosen) > 1:
        out["all_moved_bound"] = bound_change(rebound(move_sites(tokens, offsets, chosen)), base, "gain")
        out["all_moved_sites"] = len(chosen)
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
