"""SGLang's radix tree, readable reference version (``sglang_radix.md §1-§5``).

A tree over token ids. Each edge (``Node.key``) holds a run of tokens and the KV slots
that hold them (``Node.value``); children are keyed by their first token, or by their
first page when ``page_size > 1``. A namespace (``extra_key``: LoRA id and cache salt,
§1) is part of the child key, so two namespaces never share a node; kvsim keys only the
root's children by namespace, which is the same partition.

Two flavors, because SGLang 0.5.23 ships two trees that differ only in bookkeeping:

* ``"unified"`` (default) -- ``UnifiedRadixCache``, what a default 0.5.23 server builds
  (``mem_cache/registry.py``). Timestamps come from a global counter; a match stamps
  only the matched node and its ancestors, deepest newest; a split stamps the new
  prefix node and then the suffix, and the prefix keeps the suffix's creation time.
* ``"classic"`` -- ``RadixCache``: one ``time.monotonic()`` stamp per match or insert
  call for every node it walks (the child about to be split included, so a partial
  match refreshes the whole old edge), new nodes stamped "now", splits get a new
  creation time. kvsim replaces the clock by a counter, as the differential tests do.

Stamps are integers: ``tick()`` returns ``counter * SCALE``; the unified match gives
the k-th ancestor ``stamp - k``, SGLang's ``cur_time -= 0.00001``.

This module is the oracle for kvsim's fast engine; it also keeps real slot indices in
``Node.value`` so block tables can be handed to the GPU validation.
"""
from __future__ import annotations

import heapq
from typing import Hashable, Iterator

import numpy as np

from kvsim.cache.radix.evict import EvictionPolicy, make_policy

SCALE = 100_000  # sub-steps per tick for the unified match's per-level stamp offsets


class Node:
    """One edge of the tree: a token run, its KV slots, lock count and eviction metadata."""

    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access_time",
                 "creation_time", "hit_count", "priority", "id", "ns",
                 "tlru_cached_prefix_len", "tlru_history_len", "requests")

    def __init__(self, nid: int, stamp: int, created: int, priority: int = 0) -> None:
        self.children: dict[Hashable, Node] = {}
        self.parent: Node | None = None
        self.key: np.ndarray = np.zeros(0, np.int64)
        self.value: np.ndarray = np.zeros(0, np.int64)
        self.lock_ref = 0
        self.last_access_time = stamp
        self.creation_time = created
        self.hit_count = 0
        self.priority = priority
        self.id = nid
        self.ns: Hashable = None
        self.tlru_cached_prefix_len = 0   # tokens from the root to the end of this node
        self.tlru_history_len = 0         # deepest path ever under this node (T-LRU)
        self.requests = 0                 # finished requests whose sequence covers this node

    @property
    def key_len(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        return f"Node(id={self.id}, len={len(self.key)}, lock={self.lock_ref})"


class RadixTree:
    """The tree, its sizes, locks and eviction (SGLang's ``RadixCache`` / unified tree core)."""

    def __init__(self, page_size: int = 1, policy: str | EvictionPolicy = "lru",
                 flavor: str = "unified", policy_config: dict | None = None) -> None:
        self.page_size = int(page_size)
        self.flavor = flavor
        self.policy = policy if isinstance(policy, EvictionPolicy) else make_policy(policy, policy_config)
        self.clock = 0
        self._next_id = 0
        self.root = self._new_node()
        self.root.lock_ref = 1            # the root is never evictable (§1)
        self.root.priority = -(2**63 - 1)
        self.evictable_size = 0
        self.protected_size = 0
        self.evictable_leaves: set[Node] = set()

    # -- clock and nodes -----------------------------------------------------------
    def tick(self) -> int:
        self.clock += 1
        return self.clock * SCALE

    def _new_node(self, priority: int = 0) -> Node:
        stamp = self.tick()
        created = self.tick()
        node = Node(self._next_id, stamp, created, priority)
        self._next_id += 1
        return node

    def _child_key(self, node: Node, tokens: np.ndarray, ns: Hashable) -> Hashable:
        p = self.page_size
        first = int(tokens[0]) if p == 1 else tuple(tokens[:p].tolist())
        return (ns, first) if node is self.root else first

    def _match_len(self, key: np.ndarray, tokens: np.ndarray) -> int:
        """Common prefix of an edge and a key, floored to whole pages (§1 key comparison)."""
        n = min(len(key), len(tokens))
        diff = np.flatnonzero(key[:n] != tokens[:n])
        m = int(diff[0]) if len(diff) else n
        return m - m % self.page_size

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    # -- match (§2) ----------------------------------------------------------------
    def match_prefix(self, tokens: np.ndarray, ns: Hashable = None) -> tuple[int, Node]:
        """Longest cached prefix of ``tokens`` (page-floored); splits the edge it ends in."""
        n = len(tokens) - len(tokens) % self.page_size
        if n == 0:
            return 0, self.root   # an empty key returns at once, stamping nothing
        classic = self.flavor == "classic"
        if classic:
            t = self.tick()
            self.root.last_access_time = t
        node, off = self.root, 0
        while off < n:
            child = node.children.get(self._child_key(node, tokens[off:], ns))
            if child is None:
                break
            if classic:
                child.last_access_time = t    # stamped before a split: the suffix keeps it
            m = self._match_len(child.key, tokens[off:n])
            off += m
            if m < len(child.key):
                node = self._split(child, m)
                break
            node = child
        if not classic:
            # _match_post_processor: the matched node and its ancestors, deepest newest
            t, k, x = self.tick(), 0, node
            while x is not None:
                x.last_access_time = t - k
                k, x = k + 1, x.parent
        return off, node

    def _split(self, child: Node, m: int) -> Node:
        """Cut ``child`` after ``m`` tokens; the new prefix node takes its place (§2)."""
        new = self._new_node(child.priority)
        new.hit_count = child.hit_count
        new.lock_ref = child.lock_ref
        new.ns = child.ns
        new.key, child.key = child.key[:m], child.key[m:]
        new.value, child.value = child.value[:m], child.value[m:]
        parent = child.parent
        new.parent, child.parent = parent, new
        new.requests = child.requests
        parent.children[self._child_key(parent, new.key, new.ns)] = new
        new.children = {self._child_key(new, child.key, child.ns): child}
        if self.flavor == "unified":
            new.creation_time = child.creation_time       # split keeps the creation time
            new.tlru_cached_prefix_len = parent.tlru_cached_prefix_len + m
            new.tlru_history_len = child.tlru_history_len
            child.last_access_time = self.tick()
        self._update_leaf(new)
        self._update_leaf(child)
        return new

    # -- insert (§3.1) -------------------------------------------------------------
    def insert(self, tokens: np.ndarray, value: np.ndarray, ns: Hashable = None,
               priority: int = 0, inserted_len: int = 0) -> tuple[int, Node]:
        """Insert a page-aligned key; returns (tokens already cached, node it ends on).

        The returned length is the duplicate KV the caller frees. Nodes past
        ``inserted_len`` (what this request inserted before) gain a hit.
        """
        k_len = len(tokens)
        assert k_len % self.page_size == 0 and len(value) >= k_len
        classic = self.flavor == "classic"
        t = self.tick()
        self.root.last_access_time = t
        self.root.priority = max(self.root.priority, priority)
        node, off = self.root, 0
        while off < k_len:
            child = node.children.get(self._child_key(node, tokens[off:], ns))
            if child is None:
                break
            child.last_access_time = t if classic else self.tick()
            m = self._match_len(child.key, tokens[off:k_len])
            if m < len(child.key):
                child = self._split(child, m)
            child.priority = max(child.priority, priority)
            off += m
            if off > inserted_len:
                child.hit_count += 1
            node = child
        if off < k_len:
            leaf = self._new_node(priority)
            leaf.parent, leaf.ns = node, ns
            leaf.key, leaf.value = tokens[off:k_len], value[off:k_len]
            node.children[self._child_key(node, leaf.key, ns)] = leaf
            if k_len > inserted_len:
                leaf.hit_count += 1
            self.evictable_size += len(leaf.key)
            if self.flavor == "unified":
                self._raise_tlru_history(leaf)
            self._update_leaf(node)
            self._update_leaf(leaf)
            return off, leaf
        return off, node

    def _raise_tlru_history(self, leaf: Node) -> None:
        leaf.tlru_cached_prefix_len = leaf.parent.tlru_cached_prefix_len + len(leaf.key)
        leaf.tlru_history_len = max(leaf.tlru_history_len, leaf.tlru_cached_prefix_len)
        x = leaf.parent
        while x is not None and x.tlru_history_len < leaf.tlru_cached_prefix_len:
            x.tlru_history_len = leaf.tlru_cached_prefix_len
            x = x.parent

    # -- locks (§4) ----------------------------------------------------------------
    def lock(self, node: Node) -> None:
        """Protect the path root..node from eviction."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            self._update_leaf(node)
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            assert node.lock_ref > 0
            if node.lock_ref == 1:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            node.lock_ref -= 1
            self._update_leaf(node)
            node = node.parent

    def path_value(self, node: Node) -> np.ndarray:
        """KV slots on the path root..node."""
        parts = []
        while node is not self.root:
            parts.append(node.value)
            node = node.parent
        return np.concatenate(parts[::-1]) if parts else np.zeros(0, np.int64)

    # -- eviction (§5) -------------------------------------------------------------
    def _update_leaf(self, node: Node) -> None:
        if node is not self.root and node.lock_ref == 0 and not node.children:
            self.evictable_leaves.add(node)
        else:
            self.evictable_leaves.discard(node)

    def _heap_key(self, node: Node):
        # SGLang's heap holds (priority, node) and nodes compare by last_access_time
        return (self.policy.priority(node), node.last_access_time, node.id)

    def evict(self, num_tokens: int) -> tuple[int, int, list[np.ndarray]]:
        """Evict whole unlocked leaves, lowest priority first, until ``num_tokens`` are freed.

        Returns (tokens freed, leaves freed, their slot arrays). A leaf is freed whole,
        so the walk may overshoot; a parent becomes a candidate when its last child goes.
        """
        heap = [(self._heap_key(n), n) for n in self.evictable_leaves]
        heapq.heapify(heap)
        freed, leaves, values = 0, 0, []
        while freed < num_tokens and heap:
            _, x = heapq.heappop(heap)
            if x not in self.evictable_leaves:
                continue
            values.append(x.value)
            freed += len(x.key)
            leaves += 1
            parent = x.parent
            del parent.children[self._child_key(parent, x.key, x.ns)]
            self.evictable_size -= len(x.key)
            self.evictable_leaves.discard(x)
            x.parent = None
            self._update_leaf(parent)
            if parent in self.evictable_leaves:
                heapq.heappush(heap, (self._heap_key(parent), parent))
        return freed, leaves, values

    # -- inspection ----------------------------------------------------------------
    def nodes(self) -> Iterator[tuple[Node, int]]:
        """Every non-root node with its depth (1 = child of the root), depth-first."""
        stack = [(c, 1) for c in reversed(list(self.root.children.values()))]
        while stack:
            node, depth = stack.pop()
            yield node, depth
            stack.extend((c, depth + 1) for c in reversed(list(node.children.values())))

    def paths(self) -> list[tuple[int, ...]]:
        """Each node as the lengths of the edges from the root down to it (for tests)."""
        out = []

        def walk(node: Node, prefix: tuple[int, ...]) -> None:
            for child in node.children.values():
                path = prefix + (len(child.key),)
                out.append(path)
                walk(child, path)
        walk(self.root, ())
        return sorted(out)

    def check(self) -> None:
        """Invariants: sizes add up, children keyed by their first page, leaf set exact."""
        ev = pr = 0
        for node, _ in self.nodes():
            assert len(node.key) > 0 and len(node.key) % self.page_size == 0
            assert len(node.value) == len(node.key)
            if node.lock_ref:
                pr += len(node.key)
            else:
                ev += len(node.key)
            assert node.parent.children[self._child_key(node.parent, node.key, node.ns)] is node
            leaf = node.lock_ref == 0 and not node.children
            assert leaf == (node in self.evictable_leaves)
        assert (ev, pr) == (self.evictable_size, self.protected_size), ((ev, pr), self.evictable_size, self.protected_size)
