"""The gateway's approximate tree: inserting from the walk a match just did builds the same tree
as inserting with a walk of its own (splits, tenants in order, epochs, owners, sizes), under
both eviction bounds; and a tenant holding a node always holds its parent (what the insert
after a match relies on to stop attaching early)."""
from __future__ import annotations

import numpy as np
import pytest

from kvsim.fleet.approx_tree import ApproxTree


def shape(node, out, depth=0):
    out.append((depth, node.edge.tolist(), list(node.tenants.items()), node.last_tenant))
    for k in sorted(node.children):
        shape(node.children[k], out, depth + 1)
    return out


@pytest.mark.parametrize("seed", range(40))
def test_insert_after_match_equals_insert_alone(seed):
    rng = np.random.default_rng(seed)
    fast, walk = ApproxTree(4), ApproxTree(4)
    base = [rng.integers(0, 5, rng.integers(0, 30)) for _ in range(4)]
    for _ in range(80):
        b = base[rng.integers(0, 4)]
        tokens = np.concatenate([b[:rng.integers(0, len(b) + 1)], rng.integers(0, 5, rng.integers(0, 6))])
        tokens = tokens.astype(np.int64)
        tenant = int(rng.integers(0, 4))
        got = fast.match(tokens)                 # the insert below reuses this walk
        fast.holders(tokens)
        fast.insert(tokens, tenant)
        want = walk.match(tokens.copy())         # another array: the insert walks again
        walk.insert(tokens, tenant)
        assert got == want
        if rng.random() < 0.1:
            fast.evict(20, shared=seed % 2 == 0)
            walk.evict(20, shared=seed % 2 == 0)
        assert_ancestors_held(fast.root)
    assert shape(fast.root, []) == shape(walk.root, []) and fast.size == walk.size


def assert_ancestors_held(root):
    stack = list(root.children.values())
    while stack:
        node = stack.pop()
        assert set(node.tenants) <= set(node.parent.tenants), (node.edge.tolist(), node.tenants, node.parent.tenants)
        stack.extend(node.children.values())
