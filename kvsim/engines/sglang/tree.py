"""SGLang's radix tree (docs/engines/radix.md §1-§5): one node class and one tree for the
reference model and the fast engine.

A tree over token ids. Each edge (``Node.key``) holds a run of tokens and, in the
reference model, the KV slots that hold them (``Node.value``; the fast engine keeps no
slots); children are keyed by their first token, or by their first page when
``page_size > 1``. A namespace (``extra_key``: LoRA id and cache salt, §1) is part of
the child key, so two namespaces never share a node; kvsim keys only the root's children
by namespace, which is the same partition.

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

Eviction (§5) pops evictable leaves lowest key first. :class:`RadixTree` does it as
SGLang does: a heap built from every evictable leaf at each eviction.
:class:`LazyHeapTree` (the fast engine's) keeps one persistent heap instead: a leaf is
pushed again whenever it becomes evictable or a field its policy key reads changes, and
stale entries are skipped when popped, so it pops the same leaves in the same order.
"""
from __future__ import annotations

import heapq
from typing import Hashable, Iterator

import numpy as np

from kvsim.engines.sglang.evict import EvictionPolicy, make_policy
from kvsim.engines.sglang.rules import floor_page

SCALE = 100_000  # sub-steps per tick for the unified match's per-level stamp offsets


def _int64(tokens) -> np.ndarray:
    """Token ids as an int64 array (page keys compare bytes, so one dtype everywhere)."""
    if type(tokens) is np.ndarray and tokens.dtype == np.int64:
        return tokens
    return np.asarray(tokens, np.int64)


class Node:
    """One edge of the tree: a token run, its KV slots, lock count and eviction metadata."""

    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access_time",
                 "creation_time", "hit_count", "priority", "id", "ns",
                 "tlru_cached_prefix_len", "tlru_history_len", "requests", "version")

    def __init__(self, nid: int, stamp: int, created: int, priority: int = 0) -> None:
        self.children: dict[Hashable, Node] = {}
        self.parent: Node | None = None
        self.key: np.ndarray | None = None    # the edge's tokens
        self.value: np.ndarray | None = None  # their KV slots (reference model only)
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
        self.version = 0                  # LazyHeapTree: the current heap entry

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
        self.classic = flavor == "classic"
        self.policy = policy if isinstance(policy, EvictionPolicy) else make_policy(policy, policy_config)
        self.clock = 0
        self._next_id = 0
        self.num_nodes = 0                # live nodes, the root included
        self.root = self._new_node()
        self.root.key = np.zeros(0, np.int64)
        self.root.value = np.zeros(0, np.int64)
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
        self.clock += 2   # two ticks: the access stamp, then the creation time
        node = Node(self._next_id, (self.clock - 1) * SCALE, self.clock * SCALE, priority)
        self._next_id += 1
        self.num_nodes += 1
        return node

    def _child_key(self, node: Node, tokens: np.ndarray, off: int, ns: Hashable) -> Hashable:
        """The dict key of the child starting at ``tokens[off]``: its first token or page."""
        p = self.page_size
        first = int(tokens[off]) if p == 1 else tokens[off:off + p].tobytes()
        return (ns, first) if node is self.root else first

    def _match_len(self, key: np.ndarray, tokens: np.ndarray, off: int, end: int) -> int:
        """Common prefix of an edge and ``tokens[off:end]``, floored to whole pages (§1)."""
        n = min(len(key), end - off)
        eq = key[:n] == tokens[off:off + n]
        m = n if eq[n - 1] and eq.all() else int(eq.argmin())
        return m if self.page_size == 1 else floor_page(m, self.page_size)

    @property
    def total_size(self) -> int:
        return self.evictable_size + self.protected_size

    # -- match (§2) ----------------------------------------------------------------
    def match_prefix(self, tokens: np.ndarray, ns: Hashable = None, limit: int | None = None) -> tuple[int, Node]:
        """Longest cached prefix of ``tokens[:limit]`` (page-floored); splits the edge it ends in."""
        tokens = _int64(tokens)
        n = floor_page(len(tokens) if limit is None else min(limit, len(tokens)), self.page_size)
        root = self.root
        if n <= 0:
            return 0, root   # an empty key returns at once, stamping nothing
        classic = self.classic
        if classic:
            t = self.tick()
            root.last_access_time = t
        node, off = root, 0
        while off < n:
            child = node.children.get(self._child_key(node, tokens, off, ns))
            if child is None:
                break
            if classic:
                child.last_access_time = t    # stamped before a split: the suffix keeps it
                self._touched(child)
            m = self._match_len(child.key, tokens, off, n)
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
            self._touched(node)
        return off, node

    def _split(self, child: Node, m: int) -> Node:
        """Cut ``child`` after ``m`` tokens; the new prefix node takes its place (§2)."""
        new = self._new_node(child.priority)
        new.hit_count = child.hit_count
        new.lock_ref = child.lock_ref
        new.ns = child.ns
        new.requests = child.requests
        new.key, child.key = child.key[:m], child.key[m:]
        if child.value is not None:
            new.value, child.value = child.value[:m], child.value[m:]
        parent = child.parent
        new.parent, child.parent = parent, new
        parent.children[self._child_key(parent, new.key, 0, new.ns)] = new
        new.children = {self._child_key(new, child.key, 0, child.ns): child}
        if not self.classic:
            new.creation_time = child.creation_time       # split keeps the creation time
            new.tlru_cached_prefix_len = parent.tlru_cached_prefix_len + m
            new.tlru_history_len = child.tlru_history_len
            child.last_access_time = self.tick()
        self._update_leaf(new)
        self._update_leaf(child)   # key length (T-LRU) or stamp changed
        return new

    # -- insert (§3.1) -------------------------------------------------------------
    def insert(self, tokens: np.ndarray, value: np.ndarray | None = None, ns: Hashable = None,
               priority: int = 0, inserted_len: int = 0, length: int | None = None) -> tuple[int, Node]:
        """Insert the page-aligned key ``tokens[:length]``; returns (tokens already cached,
        node it ends on).

        The returned length is the duplicate KV the caller frees. Nodes past
        ``inserted_len`` (what this request inserted before) gain a hit. ``value`` holds
        the key's KV slots (None: the tree keeps no slots).
        """
        tokens = _int64(tokens)
        k_len = len(tokens) if length is None else length
        assert k_len % self.page_size == 0 and (value is None or len(value) >= k_len)
        classic = self.classic
        t = self.tick()
        root = self.root
        root.last_access_time = t
        if priority > root.priority:
            root.priority = priority
        node, off = root, 0
        while off < k_len:
            child = node.children.get(self._child_key(node, tokens, off, ns))
            if child is None:
                break
            child.last_access_time = t if classic else self.tick()
            m = self._match_len(child.key, tokens, off, k_len)
            if m < len(child.key):
                child = self._split(child, m)
            if priority > child.priority:
                child.priority = priority
            off += m
            if off > inserted_len:
                child.hit_count += 1
            self._touched(child)
            node = child
        if off < k_len:
            leaf = self._attach_leaf(node, tokens, value, off, k_len, ns, priority, depths=not classic)
            if k_len > inserted_len:
                leaf.hit_count = 1
            self._update_leaf(node)
            self._update_leaf(leaf)
            return off, leaf
        return off, node

    def _attach_leaf(self, node: Node, tokens: np.ndarray, value: np.ndarray | None, off: int, k_len: int,
                     ns: Hashable, priority: int, depths: bool) -> Node:
        """A new leaf under ``node`` holding ``tokens[off:k_len]`` (and their slots), evictable."""
        leaf = self._new_node(priority)
        leaf.parent, leaf.ns = node, ns
        leaf.key = tokens[off:k_len]
        if value is not None:
            leaf.value = value[off:k_len]
        node.children[self._child_key(node, tokens, off, ns)] = leaf
        self.evictable_size += k_len - off
        if depths:   # T-LRU: the new leaf's depth raises its ancestors' history length
            depth = node.tlru_cached_prefix_len + k_len - off
            leaf.tlru_cached_prefix_len = leaf.tlru_history_len = depth
            x = node
            while x is not None and x.tlru_history_len < depth:
                x.tlru_history_len = depth
                x = x.parent
        return leaf

    # -- locks (§4) ----------------------------------------------------------------
    def lock(self, node: Node) -> None:
        """Protect the path root..node from eviction."""
        root, leaves = self.root, self.evictable_leaves
        while node is not root:
            if node.lock_ref == 0:
                k = len(node.key)
                self.evictable_size -= k
                self.protected_size += k
                if leaves:
                    leaves.discard(node)   # a locked node is never an evictable leaf
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        root = self.root
        while node is not root:
            node.lock_ref -= 1
            if node.lock_ref == 0:                # only now can it become an evictable leaf
                k = len(node.key)
                self.evictable_size += k
                self.protected_size -= k
                if not node.children:             # (a node with children is in no leaf set)
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
    def _is_evictable_leaf(self, node: Node) -> bool:
        return node.lock_ref == 0 and not node.children and node.parent is not None

    def _update_leaf(self, node: Node) -> None:
        """Keep the set of evictable leaves exact after ``node`` changed shape or locks."""
        if node is not self.root and node.lock_ref == 0 and not node.children:
            self.evictable_leaves.add(node)
        else:
            self.evictable_leaves.discard(node)

    def _touched(self, node: Node) -> None:
        """A field an eviction key reads changed (stamp, hits, priority); SGLang ranks at
        eviction time, so nothing to do here."""

    def _heap_key(self, node: Node):
        # SGLang's heap holds (priority, node) and nodes compare by last_access_time
        return (self.policy.priority(node), node.last_access_time, node.id)

    def _remove_leaf(self, x: Node) -> Node:
        """Take an evicted leaf out of the tree; returns its parent."""
        parent = x.parent
        del parent.children[self._child_key(parent, x.key, 0, x.ns)]
        self.evictable_size -= len(x.key)
        x.parent = None
        self.num_nodes -= 1
        return parent

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
            parent = x.parent
            values.append(x.value)
            freed += len(x.key)
            leaves += 1
            self._evict_leaf(x)
            if parent in self.evictable_leaves:
                heapq.heappush(heap, (self._heap_key(parent), parent))
        return freed, leaves, values

    def _evict_leaf(self, x: Node) -> None:
        """Drop one evictable leaf from the tree (HiCache overrides: demote or delete)."""
        self.evictable_leaves.discard(x)
        self._update_leaf(self._remove_leaf(x))

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
            assert node.value is None or len(node.value) == len(node.key)
            if node.lock_ref:
                pr += len(node.key)
            else:
                ev += len(node.key)
            assert node.parent.children[self._child_key(node.parent, node.key, 0, node.ns)] is node
            if type(self)._update_leaf is RadixTree._update_leaf:
                assert self._is_evictable_leaf(node) == (node in self.evictable_leaves)
        assert (ev, pr) == (self.evictable_size, self.protected_size), ((ev, pr), self.evictable_size, self.protected_size)


class LazyHeapTree(RadixTree):
    """The same tree with one persistent lazy eviction heap (the fast engine's speed-up).

    Instead of a heap rebuilt from every evictable leaf on each eviction, a leaf is
    (re)pushed whenever it becomes an evictable leaf or a field its key reads changes;
    an entry whose node has been pushed again, evicted, locked or given a child since is
    skipped when popped. The heap therefore ranks exactly the current evictable leaves
    by their current keys: the order SGLang's freshly built heap pops them in.
    """

    def __init__(self, *args, **kwargs) -> None:
        self.heap: list = []
        super().__init__(*args, **kwargs)
        self._prio = self.policy.priority

    def _push(self, n: Node) -> None:
        n.version += 1
        heapq.heappush(self.heap, (self._prio(n), n.last_access_time, n.id, n.version, n))

    def _update_leaf(self, node: Node) -> None:
        if node.lock_ref == 0 and not node.children and node.parent is not None:
            self._push(node)

    _touched = _update_leaf

    def evict(self, num_tokens: int) -> tuple[int, int, list[np.ndarray]]:
        heap = self.heap
        freed = leaves = 0
        while freed < num_tokens and heap:
            *_, version, x = heapq.heappop(heap)
            if x.version != version or x.parent is None or x.lock_ref or x.children:
                continue
            freed += len(x.key)
            leaves += 1
            parent = self._remove_leaf(x)
            if parent.lock_ref == 0 and not parent.children and parent.parent is not None:
                self._push(parent)
        if len(heap) > 2 * self.num_nodes + 4096:
            self._compact()
        return freed, leaves, []

    def _compact(self) -> None:
        """Drop stale entries when they outnumber the live nodes."""
        live = {}
        for entry in self.heap:
            x = entry[-1]
            if x.version == entry[-2] and x.parent is not None and not x.lock_ref and not x.children:
                live[x.id] = entry
        self.heap = list(live.values())
        heapq.heapify(self.heap)
