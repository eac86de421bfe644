"""The icicle layout of the prompt prefix tree (the report's shared-prefix picture).

Nodes are distinct 16-token blocks of the prompts (level 1 of :mod:`kvsim.analyze.reuse`,
namespaces kept apart). A node shared by ``c >= 2`` prompts is drawn as a box ``c`` wide;
a chain of nodes shared by the same prompts is one box (a *segment*) from its first to its
last token; children sit under their parent, widest first. The segment ends are exactly
the analyzer's candidate *maximal* shared prefixes, so the top prefixes of ``kvsim
analyze`` are labelled with their rank.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from kvsim.io.trace.columns import Trace

MAX_SEGMENTS = 300      # boxes drawn at most (the least-shared ones go first)
MAX_NODES = 200_000     # nodes walked in Python at most (a higher sharing threshold first)


def icicle_layout(trace: Trace, top_prefixes: Sequence[dict[str, Any]] = (),
                  max_segments: int = MAX_SEGMENTS) -> dict[str, Any]:
    """Boxes of the shared part of the prefix tree, laid out as an icicle.

    Returns ``segments`` (x0, width = requests, y0/y1 in tokens, tree = colour group,
    requests, tokens, label), ``namespaces`` (x0, width, label), ``total_requests``,
    ``max_depth_tokens`` and ``min_requests`` (the sharing threshold used; boxes shared by
    fewer requests are left out).
    """
    from kvsim.analyze.prefixes import content_id, node_depths
    from kvsim.analyze.reuse import build_prefix_index, namespace_roots

    tokens = trace.require_tokens("a prefix tree")
    index = build_prefix_index(tokens, trace.offsets, namespace_roots(trace))
    G = index.block
    n_nodes = index.num_nodes
    count = np.bincount(index.ids, minlength=n_nodes)
    req_of_block = np.repeat(np.arange(len(trace)), np.diff(index.blk_off))
    first = np.full(n_nodes, len(trace), np.int64)
    np.minimum.at(first, index.ids, req_of_block)
    parent = index.node_parent
    depth = node_depths(index)

    threshold = 2
    shared = np.sort(count[count >= 2])[::-1]
    if len(shared) > MAX_NODES:
        threshold = max(2, int(shared[MAX_NODES]) + 1)
    while True:
        segs = _segments(count, parent, count >= threshold)
        if len(segs) <= max_segments:
            break
        threshold = max(threshold + 1, int(np.quantile([count[h] for h, _ in segs], 0.5)))

    labels = _top_labels(segs, top_prefixes, count, depth, first, tokens, trace.offsets, G, content_id)
    tail_of = {tail: k for k, (_, tail) in enumerate(segs)}
    children: dict[int, list[int]] = {}
    roots: list[int] = []
    for k, (head, _) in enumerate(segs):
        p = int(parent[head])
        if p >= 0:
            children.setdefault(tail_of[p], []).append(k)
        else:
            roots.append(k)

    def width(k: int) -> int:
        return int(count[segs[k][0]])

    by_ns: dict[int, list[int]] = {}
    for k in roots:
        by_ns.setdefault(int(index.root[first[segs[k][0]]]), []).append(k)
    out: list[dict[str, Any]] = []
    spaces: list[dict[str, Any]] = []
    x = 0.0
    tree = 0
    for key in sorted(by_ns, key=lambda r: -sum(width(k) for k in by_ns[r])):
        ns_x0 = x
        for k in sorted(by_ns[key], key=lambda k: -width(k)):
            _place(k, x, tree, segs, children, count, depth, G, labels, out)
            x += width(k)
            tree += 1
        spaces.append({"x0": ns_x0, "width": x - ns_x0,
                       "label": _namespace_label(trace, int(first[segs[by_ns[key][0]][0]]))})
    return {"segments": out, "namespaces": spaces, "total_requests": len(trace),
            "max_depth_tokens": int(max((s["y1"] for s in out), default=0)), "min_requests": threshold,
            "shared_requests": int(x)}


def _segments(count: np.ndarray, parent: np.ndarray, kept: np.ndarray) -> list[tuple[int, int]]:
    """(head, tail) of each chain of kept nodes shared by the same number of prompts."""
    nodes = np.flatnonzero(kept)
    has_parent = parent[nodes] >= 0
    kept_children = np.bincount(parent[nodes[has_parent]], minlength=len(count))
    p = parent[nodes]
    cont = has_parent & (kept_children[np.maximum(p, 0)] == 1) & (count[np.maximum(p, 0)] == count[nodes])
    nxt = dict(zip(p[cont].tolist(), nodes[cont].tolist()))
    out = []
    for head in nodes[~cont].tolist():
        tail = head
        while tail in nxt:
            tail = nxt[tail]
        out.append((head, tail))
    return out


def _place(k: int, x0: float, tree: int, segs: list[tuple[int, int]], children: dict[int, list[int]],
           count: np.ndarray, depth: np.ndarray, G: int, labels: dict[int, str], out: list[dict[str, Any]]) -> None:
    stack = [(k, x0)]
    while stack:
        k, x = stack.pop()
        head, tail = segs[k]
        c = int(count[head])
        y0, y1 = int(depth[head]) * G, (int(depth[tail]) + 1) * G
        label = labels.get(k)
        text = f"{label} · {c} req" if label else f"{c} req"
        out.append({"x0": x, "width": c, "y0": y0, "y1": y1, "tree": tree, "requests": c,
                    "tokens": y1, "label": text, "rank_label": label})
        cx = x
        for child in sorted(children.get(k, []), key=lambda j: -int(count[segs[j][0]])):
            stack.append((child, cx))
            cx += int(count[segs[child][0]])


def _top_labels(segs: list[tuple[int, int]], top: Sequence[dict[str, Any]], count: np.ndarray, depth: np.ndarray,
                first: np.ndarray, tokens: np.ndarray, offsets: np.ndarray, G: int, content_id) -> dict[int, str]:
    """Segment index -> '#rank' for the analyzer's top prefixes (matched by content id)."""
    by_shape: dict[tuple[int, int], list[int]] = {}
    for k, (_, tail) in enumerate(segs):
        by_shape.setdefault((int(count[tail]), int(depth[tail]) + 1), []).append(k)
    labels: dict[int, str] = {}
    for p in top:
        for k in by_shape.get((int(p["requests"]), int(p["length"]) // G), []):
            tail = segs[k][1]
            if content_id(tokens, int(offsets[first[tail]]), int(p["length"])) == p["id"]:
                labels[k] = f"#{p['rank']}"
                break
    return labels


def _namespace_label(trace: Trace, i: int) -> str:
    salt = trace.name_of("cache_salt", int(trace.cache_salt[i]))
    lora = trace.name_of("lora", int(trace.lora[i]))
    parts = ([f"salt {salt}"] if salt is not None else []) + ([f"LoRA {lora}"] if lora is not None else [])
    return ", ".join(parts) or "shared namespace"
