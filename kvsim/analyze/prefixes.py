"""Shared-prefix structure: the most valuable shared prefixes, distinct system prompts and
the shape of the prefix tree (nodes are distinct 16-token blocks, level 1 of the index).

A *shared prefix* is a maximal one: a node of the tree shared by c >= 2 prompts where at
least one of them stops sharing (no child is shared by all c). Its exact length extends
the node by the tokens all c prompts still have in common. With an unlimited cache it
saves (c - 1) x length tokens; nested prefixes each count their own full length.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from kvsim.analyze import _kernels as K
from kvsim.analyze.reuse import PrefixIndex
from kvsim.io.trace.columns import NONE, Trace

Decoder = Callable[[np.ndarray], str]


def content_id(tokens: np.ndarray, start: int, length: int) -> str:
    """A short, stable id for a token span (shown instead of the text)."""
    h = K.span_hashes(tokens, np.array([start], np.int64), np.array([length], np.int64))[0]
    return f"{int(h):016x}"[:12]


def clip_text(text: str, head: int = 160, tail: int = 80) -> str:
    """The start and end of a long text (enough to recognise a prompt)."""
    if len(text) <= head + tail + 5:
        return text
    return f"{text[:head]} [...] {text[-tail:]}"


def message_at(trace: Trace, i: int, pos: int) -> dict[str, Any] | None:
    """Message index, role and offset inside the message of prompt token ``pos`` of request i."""
    if trace.msg_offsets is None:
        return None
    a, b = int(trace.msg_offsets[i]), int(trace.msg_offsets[i + 1])
    if a == b:
        return None
    starts = trace.msg_starts[a:b]
    m = int(np.searchsorted(starts, pos, side="right")) - 1
    if m < 0:
        return {"message": None, "role": "template", "offset_in_message": int(pos)}
    code = int(trace.msg_roles[a + m])
    role = trace.role_names[code] if 0 <= code < len(trace.role_names) else str(code)
    return {"message": m, "role": role, "offset_in_message": int(pos - starts[m])}


def node_depths(index: PrefixIndex) -> np.ndarray:
    """Block depth (0 = first block) of every node."""
    counts = np.diff(index.blk_off)
    pos = np.arange(len(index.ids), dtype=np.int64) - np.repeat(index.blk_off[:-1], counts)
    depth = np.zeros(index.num_nodes, np.int64)
    depth[index.ids] = pos
    return depth


def _prompt_counts(index: PrefixIndex) -> tuple[np.ndarray, np.ndarray]:
    """(node id of every prompt block, number of prompts containing each node)."""
    pid = index.ids[index.prompt_block_mask()]
    return pid, np.bincount(pid, minlength=index.num_nodes)


def tree_summary(index: PrefixIndex) -> dict[str, Any]:
    """Depth and branching of the prompt prefix tree at 16-token blocks."""
    G = index.block
    _, count = _prompt_counts(index)
    live = count > 0
    parent = index.node_parent
    child_of = live & (parent >= 0)
    children = np.bincount(parent[child_of], minlength=index.num_nodes)
    depth = node_depths(index)
    first_blocks = live & (parent < 0)
    roots = index.root[index.node_first[first_blocks]]
    root_children = np.unique(roots, return_counts=True)[1] if len(roots) else np.zeros(0, np.int64)
    branching = live & (children >= 2)
    leaves = live & (children == 0)
    fanout = np.concatenate([children[branching], root_children[root_children >= 2]])
    return {
        "granularity": G,
        "nodes": int(live.sum()),
        "distinct_first_blocks": int(first_blocks.sum()),
        "namespaces": int(len(root_children)),
        "max_depth_tokens": int((depth[live].max() + 1) * G) if live.any() else 0,
        "mean_leaf_depth_tokens": float((depth[leaves] + 1).mean() * G) if leaves.any() else 0.0,
        "leaves": int(leaves.sum()),
        "branching_nodes": int(len(fanout)),
        "mean_children_at_branch": float(fanout.mean()) if len(fanout) else 0.0,
        "max_children": int(max(children.max(initial=0), root_children.max(initial=0))),
    }


def top_shared_prefixes(index: PrefixIndex, trace: Trace, tokens: np.ndarray, top: int,
                        decode: Decoder | None = None) -> list[dict[str, Any]]:
    """The ``top`` maximal shared prefixes by tokens saved (see module docstring)."""
    G = index.block
    pid, count = _prompt_counts(index)
    if index.num_nodes == 0:
        return []
    parent = index.node_parent
    maxchild = np.zeros(index.num_nodes, np.int64)
    has_parent = parent >= 0
    np.maximum.at(maxchild, parent[has_parent], count[has_parent])
    depth = node_depths(index)
    cand = np.flatnonzero((count >= 2) & (count > maxchild))
    if len(cand) == 0:
        return []
    saved0 = (count[cand] - 1) * (depth[cand] + 1) * G
    # refine a few more than asked: the exact extension can reorder close candidates
    pool = cand[np.argsort(-saved0, kind="stable")[:3 * top]]
    # members of the pool nodes only: one pass over the prompt blocks, then small sorts
    hit = np.isin(pid, pool)
    sub_pid = pid[hit]
    sub_req = np.repeat(np.arange(len(trace)), index.prompt_blocks)[hit]
    order = np.lexsort((sub_req, sub_pid))
    sub_pid, sub_req = sub_pid[order], sub_req[order]
    rows = []
    for v in pool:
        lo, hi = np.searchsorted(sub_pid, [v, v + 1])
        members = sub_req[lo:hi]
        base = int((depth[v] + 1) * G)
        extra = _common_extension(tokens, trace.offsets, members, base, G)
        length = base + extra
        rows.append((int((len(members) - 1) * length), int(v), members, length))
    rows.sort(key=lambda r: -r[0])
    rows = rows[:top]
    listed = {v: k for k, (_, v, _, _) in enumerate(rows)}
    out = []
    for k, (saved, v, members, length) in enumerate(rows):
        first = int(members[0])
        start = int(trace.offsets[first])
        sess = trace.session[members]
        item = {
            "rank": k + 1,
            "id": content_id(tokens, start, length),
            "length": int(length),
            "requests": int(len(members)),
            "sessions": int(len(np.unique(sess[sess != NONE]))),
            "tokens_saved": int(saved),
            "first_request": trace.request_id(first),
            "ends_in": message_at(trace, first, length - 1),
            "extends": _listed_ancestor(parent, v, listed),
            "namespace": _namespace_label(trace, first),
        }
        if decode is not None:
            item["text"] = clip_text(decode(tokens[start:start + length]))
        out.append(item)
    return out


def _common_extension(tokens: np.ndarray, offsets: np.ndarray, members: np.ndarray, base: int, G: int) -> int:
    """Tokens after ``base`` that every member still shares (< G by construction)."""
    lens = offsets[members + 1] - offsets[members] - base
    width = int(min(G, lens.min()))
    if width <= 0:
        return 0
    idx = offsets[members][:, None] + base + np.arange(width)[None, :]
    block = tokens[idx]
    same = (block == block[0]).all(axis=0)
    return int(width if same.all() else np.argmin(same))


def _listed_ancestor(parent: np.ndarray, v: int, listed: dict[int, int]) -> int | None:
    """Rank of the nearest listed prefix this one extends, if any."""
    p = parent[v]
    while p >= 0:
        if int(p) in listed:
            return listed[int(p)] + 1
        p = parent[p]
    return None


def _namespace_label(trace: Trace, i: int) -> str | None:
    parts = []
    salt = trace.name_of("cache_salt", int(trace.cache_salt[i]))
    lora = trace.name_of("lora", int(trace.lora[i]))
    if salt is not None:
        parts.append(f"salt:{salt}")
    if lora is not None:
        parts.append(f"lora:{lora}")
    return ", ".join(parts) or None


def system_prompts(trace: Trace, tokens: np.ndarray, top: int = 5) -> dict[str, Any] | None:
    """Distinct system messages (by content), when the trace kept message structure."""
    if trace.msg_offsets is None or "system" not in trace.role_names:
        return None if trace.msg_offsets is None else {"requests_with_system": 0, "distinct": 0, "top": []}
    sys_code = trace.role_names.index("system")
    counts = np.diff(trace.msg_offsets)
    first = trace.msg_offsets[:-1]
    has = (counts > 0)
    rows = np.flatnonzero(has)
    rows = rows[trace.msg_roles[first[rows]] == sys_code]
    if len(rows) == 0:
        return {"requests_with_system": 0, "distinct": 0, "top": []}
    start = trace.msg_starts[first[rows]]
    end = np.where(counts[rows] > 1, trace.msg_starts[np.minimum(first[rows] + 1, len(trace.msg_starts) - 1)],
                   trace.prompt_lengths[rows])
    lens = (end - start).astype(np.int64)
    h = K.span_hashes(tokens, trace.offsets[rows] + start, lens)
    uniq, inv, cnt = np.unique(h, return_inverse=True, return_counts=True)
    best = np.argsort(-cnt, kind="stable")[:top]
    top_rows = []
    for u in best:
        r = rows[np.flatnonzero(inv == u)[0]]
        k = int(np.flatnonzero(rows == r)[0])
        top_rows.append({"id": f"{int(uniq[u]):016x}"[:12], "length": int(lens[k]), "requests": int(cnt[u])})
    return {"requests_with_system": int(len(rows)), "distinct": int(len(uniq)), "top": top_rows}
