"""SGLang's approximate radix tree (smg ``crates/kv_index/src/string_tree.rs``), over tokens.

One tree per model, shared by all workers ("tenants"): each node holds an edge of tokens,
its children by first token, and per tenant an access epoch. kvsim's logs hold tokens, so
the tree keys on tokens, one token standing for one character of the HTTP gateway's text
(``docs/engines/routers.md §2.1``). Rules kept from the source (``docs/engines/routers.md §2.2``):

- ``match`` descends once; a partly matched edge adds its shared prefix and stops there. The
  tenant is that node's cached ``last_tenant`` (the tenant that created the node) while it
  still holds the node, else the first tenant in its map. One match in eight (by a global
  epoch counter) refreshes that tenant's epoch on the node.
- ``insert`` attaches the tenant to every node on the path (epoch 0 where it is new, so
  intermediate nodes look old), splits a partly matched edge (the upper half copies the
  tenants and ``last_tenant``), and stamps the final node with a fresh epoch.
- ``evict`` pops leaves (per tenant: nodes no child of which the tenant holds) oldest epoch
  first, while a tenant's character count (0.3.2) or the total (1.13.0, shared bound) is
  over the bound.
"""
from __future__ import annotations

import heapq

import numpy as np


class Node:
    """One edge of the tree (``raw``: its tokens as int64 bytes, for fast comparison)."""

    __slots__ = ("edge", "children", "tenants", "last_tenant", "parent", "raw")

    def __init__(self, edge: np.ndarray, parent: Node | None, last_tenant: int | None) -> None:
        self.edge = edge
        self.raw = edge.tobytes()
        self.children: dict[int, Node] = {}
        self.tenants: dict[int, int] = {}       # tenant -> access epoch
        self.last_tenant = last_tenant
        self.parent = parent


def _shared(raw: bytes, at: int, edge: bytes) -> int:
    """Tokens in common between the request's bytes from byte ``at`` and an edge's bytes
    (8 bytes a token): one memcmp when the whole edge matches, a binary search when not."""
    if raw.startswith(edge, at):
        return len(edge) // 8
    lo, hi = 0, min(len(edge), len(raw) - at) // 8
    while lo < hi:          # the longest common prefix, in tokens
        mid = (lo + hi + 1) // 2
        if raw.startswith(edge[:8 * mid], at):
            lo = mid
        else:
            hi = mid - 1
    return lo


class ApproxTree:
    """The gateway's per-model tree of routed request texts (here: token sequences)."""

    def __init__(self, tenants: int) -> None:
        self.root = Node(np.empty(0, dtype=np.int64), None, None)
        self.epoch = 0
        self.version = 0                        # +1 whenever the shape changes (insert, evict)
        self._memo: tuple | None = None         # (tokens, int64 tokens, bytes, (version, pos, node) | None)
        self.size = [0] * tenants              # characters (tokens) per tenant
        for t in range(tenants):                # init_workers inserts "" for each worker
            self.root.tenants[t] = 0

    def _tick(self) -> int:
        e = self.epoch
        self.epoch += 1
        return e

    @staticmethod
    def _owner(node: Node) -> int | None:
        if node.last_tenant is not None and node.last_tenant in node.tenants:
            return node.last_tenant
        first = next(iter(node.tenants), None)
        node.last_tenant = first
        return first

    def match(self, tokens: np.ndarray) -> tuple[int, int | None]:
        """(matched tokens, tenant of the deepest matched node); refreshes one match in eight."""
        pos, node = self._descend(tokens)
        tenant = self._owner(node)
        e = self._tick()
        if e & 0x7 == 0 and tenant is not None:
            node.tenants[tenant] = e
        return pos, tenant

    def holders(self, tokens: np.ndarray) -> list[int]:
        """The tenants of the node ``match`` stops at (no side effects)."""
        return list(self._descend(tokens)[1].tenants)

    def owner(self, tokens: np.ndarray) -> int | None:
        """The tenant ``match`` would name (no side effects)."""
        node = self._descend(tokens)[1]
        if node.last_tenant is not None and node.last_tenant in node.tenants:
            return node.last_tenant
        return next(iter(node.tenants), None)

    def _bytes(self, tokens: np.ndarray) -> tuple[np.ndarray, bytes]:
        """The request's tokens as int64 and as bytes (kept for the last request asked about)."""
        memo = self._memo
        if memo is not None and memo[0] is tokens:
            return memo[1], memo[2]
        toks = tokens if isinstance(tokens, np.ndarray) and tokens.dtype == np.int64 else np.asarray(tokens, np.int64)
        raw = toks.tobytes()
        self._memo = (tokens, toks, raw, None)
        return toks, raw

    def _descend(self, tokens: np.ndarray) -> tuple[int, Node]:
        """``match``'s walk, without side effects: (matched tokens, the node it stops at,
        a partly matched edge's node included). The tree's shape is unchanged between a
        request's match and its insert, so the walk is done once for both."""
        memo = self._memo
        if memo is not None and memo[0] is tokens and memo[3] is not None and memo[3][0] == self.version:
            return memo[3][1], memo[3][2]
        toks, raw = self._bytes(tokens)
        node, pos, start, n = self.root, 0, 0, len(toks)
        children = node.children
        while pos < n:
            child = children.get(int(toks[pos]))
            if child is None:
                break
            k = _shared(raw, 8 * pos, child.raw)
            start, pos = pos, pos + k
            node = child
            if 8 * k < len(child.raw):
                break
            children = child.children
        self._memo = (tokens, toks, raw, (self.version, pos, node, start))
        return pos, node

    def _attach(self, node: Node, tenant: int, epoch: int) -> None:
        if tenant not in node.tenants:
            self.size[tenant] += len(node.edge)
            node.tenants[tenant] = epoch

    def insert(self, tokens: np.ndarray, tenant: int) -> None:
        """Record that ``tenant`` was sent ``tokens``."""
        toks, raw = self._bytes(tokens)
        memo = self._memo[3]
        self.version += 1
        if memo is not None and memo[0] == self.version - 1:
            self._insert_at(toks, tenant, memo[1], memo[2], memo[3])   # the walk match just did
            return
        node, pos, n = self.root, 0, len(toks)
        while pos < n:
            first = int(toks[pos])
            child = node.children.get(first)
            if child is None:
                leaf = Node(toks[pos:].copy(), node, tenant)
                node.children[first] = leaf
                self._attach(leaf, tenant, self._tick())
                return
            k = _shared(raw, 8 * pos, child.raw)
            if k < len(child.edge):              # split: the upper part copies tenants and owner
                child = self._split(node, child, k)
            self._attach(child, tenant, 0)
            node, pos = child, pos + k
        node.tenants[tenant] = self._tick()

    def _split(self, parent: Node, child: Node, k: int) -> Node:
        """Cut ``child`` after ``k`` tokens; the upper part copies its tenants and owner."""
        upper = Node(child.edge[:k], parent, child.last_tenant)
        upper.tenants = dict(child.tenants)
        parent.children[int(child.edge[0])] = upper
        child.edge = child.edge[k:]
        child.raw = child.raw[8 * k:]
        child.parent = upper
        upper.children[int(child.edge[0])] = child
        return upper

    def _insert_at(self, toks: np.ndarray, tenant: int, pos: int, stop: Node, start: int) -> None:
        """``insert`` from where ``_descend`` stopped (``pos`` tokens matched, ending in ``stop``,
        whose edge starts at token ``start``): the same splits, attachments and stamps as the
        walk, without comparing tokens again. A tenant holding a node holds its ancestors
        (inserts attach the whole path, splits copy, eviction takes a tenant's deepest nodes
        first), so the attaching stops at the first node the tenant already holds."""
        last = stop
        if stop is not self.root and pos - start < len(stop.edge):   # ends inside stop's edge: split it
            last = self._split(stop.parent, stop, pos - start)
        x = last
        while x is not self.root and tenant not in x.tenants:
            self._attach(x, tenant, 0)
            x = x.parent
        if pos < len(toks):
            leaf = Node(toks[pos:].copy(), last, tenant)
            last.children[int(toks[pos])] = leaf
            self._attach(leaf, tenant, self._tick())
        else:
            last.tenants[tenant] = self._tick()

    def total(self) -> int:
        """Characters (tokens) held, summed over tenants."""
        return sum(self.size)

    def evict(self, max_size: int, *, shared: bool) -> None:
        """Pop leaves oldest first while a tenant (or, ``shared``, the total) is over ``max_size``."""
        def over(t: int) -> bool:
            return self.total() > max_size if shared else self.size[t] > max_size
        if not any(over(t) for t in range(len(self.size))):
            return
        self.version += 1
        heap: list[tuple[int, int, int, Node]] = []
        stack, seq = [self.root], 0
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            for t, e in node.tenants.items():
                if node is not self.root and not any(t in c.tenants for c in node.children.values()):
                    heap.append((e, seq, t, node))
                    seq += 1
        heapq.heapify(heap)
        while heap:
            _, _, t, node = heapq.heappop(heap)
            if not over(t) or t not in node.tenants or any(t in c.tenants for c in node.children.values()):
                continue
            del node.tenants[t]
            self.size[t] -= len(node.edge)
            parent = node.parent
            if parent is not None and not node.children and not node.tenants:
                del parent.children[int(node.edge[0])]
            if (parent is not None and parent is not self.root and t in parent.tenants
                    and not any(t in c.tenants for c in parent.children.values())):
                heapq.heappush(heap, (parent.tenants[t], seq, t, parent))
                seq += 1
