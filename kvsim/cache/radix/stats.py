"""A radix tree's shape at a glance: nodes, leaves, tokens, depth, and the largest shared prefixes.

Works on the reference tree (:class:`kvsim.cache.radix.tree.RadixTree`) and the fast engine
alike: both expose ``nodes()`` (node, depth) with ``key``, ``children``, ``lock_ref`` and
``requests`` (finished requests whose inserted sequence covers the node). No token ids
are reported, only lengths.
"""
from __future__ import annotations

from typing import Any


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
