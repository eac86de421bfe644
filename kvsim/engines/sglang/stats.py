"""A radix tree's shape at a glance: nodes, leaves, tokens, depth, and the largest shared prefixes.

Works on the reference tree (:class:`kvsim.engines.sglang.tree.RadixTree`) and the fast engine
alike: both expose ``nodes()`` (node, depth) with ``key``, ``children``, ``lock_ref`` and
``requests`` (finished requests whose inserted sequence covers the node). No token ids
are reported, only lengths.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def tree_report(tree: Any, top: int = 5) -> dict[str, Any]:
    """Counts, depth and the ``top`` largest shared prefixes of ``tree``."""
    nodes = leaves = tokens = locked = 0
    max_depth = max_depth_tokens = 0
    depth_tokens: dict[int, int] = {}     # node id -> tokens from the root to its end
    info = []
    for node, depth in tree.nodes():
        n = len(node.key)
        nodes += 1
        tokens += n
        if not node.children:
            leaves += 1
        if node.lock_ref:
            locked += n
        parent = node.parent
        end = depth_tokens.get(id(parent), 0) + n
        depth_tokens[id(node)] = end
        max_depth = max(max_depth, depth)
        max_depth_tokens = max(max_depth_tokens, end)
        info.append((node, end))
    # subtree sizes, children before parents (reverse pre-order)
    sub_tokens: dict[int, int] = {}
    sub_nodes: dict[int, int] = {}
    for node, _ in reversed(info):
        sub_tokens[id(node)] = len(node.key) + sum(sub_tokens[id(c)] for c in node.children.values())
        sub_nodes[id(node)] = 1 + sum(sub_nodes[id(c)] for c in node.children.values())
    shared = []
    for node, end in info:
        # a branching point: shared by >= 2 requests, and no child is shared by them all
        if node.requests >= 2 and all(c.requests < node.requests for c in node.children.values()):
            shared.append({"prefix_tokens": end, "requests": node.requests,
                           "subtree_tokens": sub_tokens[id(node)], "subtree_nodes": sub_nodes[id(node)]})
    shared.sort(key=lambda s: (-s["requests"] * s["prefix_tokens"], -s["prefix_tokens"]))
    return {
        "nodes": nodes,
        "leaves": leaves,
        "tokens": tokens,
        "locked_tokens": locked,
        "max_depth_nodes": max_depth,
        "max_depth_tokens": max_depth_tokens,
        "namespaces": len({getattr(c, "ns", None) for c in tree.root.children.values()}),
        "largest_shared": shared[:top],
    }


def format_tree(tree: Any, max_nodes: int = 60) -> str:
    """The tree as indented lines: edge length, requests sharing it, lock count (no tokens)."""
    lines = ["root"]
    for i, (node, depth) in enumerate(tree.nodes()):
        if i == max_nodes:
            lines.append("  ...")
            break
        lock = f", locked {node.lock_ref}" if node.lock_ref else ""
        lines.append(f"{'  ' * depth}+- {len(node.key)} tokens, {node.requests} request(s){lock}")
    return "\n".join(lines)


def replay_report(settings, implementation: str, cache, work, cols) -> tuple[dict, dict, np.ndarray]:
    """A sequential replay's resolved configuration, its extra figures (SGLang's own
    counters, the tree at the end) and, per request, whether its match was uncapped
    (a logprob start cuts it, docs/engines/radix.md §2.1)."""
    from dataclasses import asdict

    from kvsim.engines.sglang.rules import match_capped

    ok = ~cols.rejected
    # a request refused for its logprob start still prefills its placeholder: all rows
    hit = int(cols.cached_tokens.sum())
    new = int(cols.extend_tokens.sum())
    prompt = int(work.prompt_lengths[ok].sum())
    extra = {
        "engine": implementation,
        "page_size": settings.page_size,
        "eviction_policy": settings.eviction_policy,
        "max_total_tokens": settings.capacity,
        **{k: v for k, v in asdict(settings).items() if k not in ("page_size", "capacity", "eviction_policy",
                                                                 "hicache")},
        # the log line's "#cached-token" / "#new-token" summed over prefill batches, and
        # the cumulative hit rate they give (sglang:realtime_tokens_total cache/compute)
        "sglang_cached_token_sum": hit,
        "sglang_new_token_sum": new,
        "sglang_logged_hit_rate": hit / (hit + new) if hit + new else 0.0,
        "sglang_prompt_hit_rate": hit / prompt if prompt else 0.0,
        "clipped_requests": int((ok & (cols.max_new < work.output_lengths)).sum()),
        "tree": tree_report(cache.tree),
    }
    config = {"page_size": settings.page_size, "max_total_tokens": settings.capacity,
              "eviction_policy": settings.eviction_policy, "radix_tree": settings.tree,
              "overlap": settings.overlap, "chunked_prefill_size": settings.chunked_prefill_size,
              "finish": settings.finish}
    if settings.hicache is not None:    # the host tier (docs/engines/offload.md §3)
        config["offload"] = settings.hicache.as_dict()
        extra["offload"] = cache.tier_run()
    return config, extra, ~match_capped(work.prompt_lengths, work.logprob_start_len)
