"""The prefix trie of a log: every request's token chain as a path of whole trie nodes.

Request ``r`` writes a chain of ``W[r]`` tokens: its prompt, then its output tokens, then
(where asked) one END token that marks where the chain stops. Chains live in one trie per
namespace (``cache_salt`` / LoRA), compressed like a radix tree: a node is a run of tokens
``[d0, d1)`` (positions in the chain) that no chain enters or leaves in the middle. Nodes
are split wherever a chain diverges or stops, so every chain is a sequence of *whole*
nodes, and every token of a node has the same access history. That is what the offline
optimum needs (:mod:`kvsim.sweep.optimal`): "the last earlier request whose chain holds
the first ``x`` tokens of this one" is a property of the node that holds position
``x - 1``.

Building walks every chain once, comparing tokens along the edges (O(total tokens));
afterwards each request's path is a short list of node ids. Extra split points (a chain
cut shorter at some capacity) can be added later with :meth:`PrefixTrie.split_at`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

#: the END token closing a chain (no prompt or output token has this value)
END = np.int64(-(1 << 62))
_EMPTY = np.int64(-1)


@njit(cache=True, inline="always")
def _tok(r, x, tok_a, off_a, tok_b, off_b):
    """Token ``x`` of request ``r``'s chain: prompt, then outputs, then END."""
    la = off_a[r + 1] - off_a[r]
    if x < la:
        return np.int64(tok_a[off_a[r] + x])
    x -= la
    if x < off_b[r + 1] - off_b[r]:
        return np.int64(tok_b[off_b[r] + x])
    return END


@njit(cache=True, inline="always")
def _slot(tkey_node, tkey_tok, mask, node, tok):
    """Index of (node, tok) in the child table, or of the empty place where it would go."""
    h = (np.uint64(node) * np.uint64(0x9E3779B97F4A7C15)) ^ (np.uint64(tok) * np.uint64(0xC2B2AE3D27D4EB4F))
    h ^= h >> np.uint64(29)
    i = np.int64(h & np.uint64(mask))
    while tkey_node[i] != _EMPTY and (tkey_node[i] != node or tkey_tok[i] != tok):
        i = (i + 1) & mask
    return i


@njit(cache=True)
def _build(tok_a, off_a, tok_b, off_b, W, ns, roots, owner, d0, d1, tkey_node, tkey_tok, tval):
    """Insert every chain (requests in order); returns the number of nodes used."""
    mask = len(tval) - 1
    nn = len(roots)
    for r in range(len(W)):
        w = W[r]
        node = roots[ns[r]]
        depth = 0
        while depth < w:
            t = _tok(r, depth, tok_a, off_a, tok_b, off_b)
            i = _slot(tkey_node, tkey_tok, mask, node, t)
            if tkey_node[i] == _EMPTY:  # nothing continues this way: a new leaf holds the rest
                owner[nn], d0[nn], d1[nn] = r, depth, w
                tkey_node[i], tkey_tok[i], tval[i] = node, t, nn
                nn += 1
                break
            c = tval[i]
            o = owner[c]
            stop = min(d1[c], w)
            x = depth + 1
            while x < stop and _tok(o, x, tok_a, off_a, tok_b, off_b) == _tok(r, x, tok_a, off_a, tok_b, off_b):
                x += 1
            if x < d1[c]:  # diverges or stops inside c: the head [d0, x) becomes its own node
                owner[nn], d0[nn], d1[nn] = o, d0[c], x
                tval[i] = nn
                d0[c] = x
                j = _slot(tkey_node, tkey_tok, mask, nn, _tok(o, x, tok_a, off_a, tok_b, off_b))
                tkey_node[j], tkey_tok[j], tval[j] = nn, _tok(o, x, tok_a, off_a, tok_b, off_b), c
                c = nn
                nn += 1
            node = c
            depth = x
    return nn


@njit(cache=True)
def _split(r, w, tok_a, off_a, tok_b, off_b, ns, roots, owner, d0, d1, tkey_node, tkey_tok, tval, nn):
    """Make position ``w`` of request ``r``'s (already inserted) chain a node boundary."""
    mask = len(tval) - 1
    node = roots[ns[r]]
    depth = 0
    while depth < w:
        i = _slot(tkey_node, tkey_tok, mask, node, _tok(r, depth, tok_a, off_a, tok_b, off_b))
        c = tval[i]
        if d1[c] > w:
            o = owner[c]
            owner[nn], d0[nn], d1[nn] = o, d0[c], w
            tval[i] = nn
            d0[c] = w
            t = _tok(o, w, tok_a, off_a, tok_b, off_b)
            j = _slot(tkey_node, tkey_tok, mask, nn, t)
            tkey_node[j], tkey_tok[j], tval[j] = nn, t, c
            return nn + 1
        node = c
        depth = d1[c]
    return nn


@njit(cache=True)
def _rehash(old_n, old_t, old_v, keys_n, keys_t, vals):
    mask = len(vals) - 1
    for i in range(len(old_v)):
        if old_n[i] != _EMPTY:
            j = _slot(keys_n, keys_t, mask, old_n[i], old_t[i])
            keys_n[j], keys_t[j], vals[j] = old_n[i], old_t[i], old_v[i]


@njit(cache=True)
def _paths(tok_a, off_a, tok_b, off_b, W, ns, roots, d1, tkey_node, tkey_tok, tval, path_off, out, write):
    """Walk each chain's nodes, root side first; returns how many there are on all chains.

    With ``write``, chain r's node ids go to ``out[path_off[r]:path_off[r + 1]]`` (a first
    walk without it sizes ``out``)."""
    mask = len(tval) - 1
    k = 0
    for r in range(len(W)):
        node = roots[ns[r]]
        depth = 0
        while depth < W[r]:
            node = tval[_slot(tkey_node, tkey_tok, mask, node, _tok(r, depth, tok_a, off_a, tok_b, off_b))]
            if write:
                out[k] = node
            k += 1
            depth = d1[node]
        if write:
            path_off[r + 1] = k
    return k


@dataclass
class PrefixTrie:
    """The trie of every chain; ``path(r)`` lists the nodes of request ``r``'s chain.

    ``d0[c]``, ``d1[c]``: the chain positions ``[d0, d1)`` node ``c`` holds. Nodes
    ``0 .. namespaces-1`` are the (empty) roots.
    """

    tok_a: np.ndarray
    off_a: np.ndarray
    tok_b: np.ndarray
    off_b: np.ndarray
    W: np.ndarray
    ns: np.ndarray
    roots: np.ndarray
    owner: np.ndarray
    d0: np.ndarray
    d1: np.ndarray
    tkey_node: np.ndarray
    tkey_tok: np.ndarray
    tval: np.ndarray
    num_nodes: int
    path_off: np.ndarray | None = None
    path_nodes: np.ndarray | None = None

    @classmethod
    def build(cls, tok_a: np.ndarray, off_a: np.ndarray, tok_b: np.ndarray, off_b: np.ndarray,
              W: np.ndarray, ns: np.ndarray, extra_splits: int = 0) -> "PrefixTrie":
        """Insert the chains: request r's chain is its first ``W[r]`` tokens of
        ``tok_a[off_a[r]:off_a[r+1]]`` + ``tok_b[off_b[r]:off_b[r+1]]`` + END...

        ``ns[r]`` (0 .. k-1) is its namespace. Room is kept for ``extra_splits`` later
        :meth:`split_at` calls.
        """
        W = np.ascontiguousarray(W, np.int64)
        ns = np.ascontiguousarray(ns, np.int64)
        n = len(W)
        k = int(ns.max()) + 1 if n else 1
        # each chain adds at most one split and one leaf; each extra split one node
        cap = k + 2 * n + int(extra_splits) + 1
        owner = np.full(cap, -1, np.int64)
        d0 = np.zeros(cap, np.int64)
        d1 = np.zeros(cap, np.int64)
        size = 16
        while size < 2 * cap:
            size *= 2
        tkey_node = np.full(size, -1, np.int64)
        tkey_tok = np.zeros(size, np.int64)
        tval = np.zeros(size, np.int64)
        roots = np.arange(k, dtype=np.int64)
        args = (np.ascontiguousarray(tok_a), np.ascontiguousarray(off_a, np.int64),
                np.ascontiguousarray(tok_b), np.ascontiguousarray(off_b, np.int64))
        nn = _build(*args, W, ns, roots, owner, d0, d1, tkey_node, tkey_tok, tval)
        return cls(*args, W, ns, roots, owner, d0, d1, tkey_node, tkey_tok, tval, int(nn))

    def split_at(self, requests: np.ndarray, depths: np.ndarray) -> None:
        """Make ``depths[i]`` a node boundary on the chain of ``requests[i]`` (depth <= its W)."""
        before = self.num_nodes
        for r, w in zip(np.asarray(requests, np.int64), np.asarray(depths, np.int64)):
            if not 0 <= w <= self.W[r]:
                raise ValueError(f"split depth {w} outside request {r}'s chain of {self.W[r]} tokens")
            if w == 0 or w == self.W[r]:
                continue  # the ends of a chain are boundaries already
            if self.num_nodes >= len(self.owner):
                self._grow()
            self.num_nodes = int(_split(int(r), int(w), self.tok_a, self.off_a, self.tok_b, self.off_b, self.ns,
                                        self.roots, self.owner, self.d0, self.d1, self.tkey_node, self.tkey_tok,
                                        self.tval, self.num_nodes))
        if self.num_nodes != before:  # new boundaries: the paths must be listed again
            self.path_off = self.path_nodes = None

    def _grow(self) -> None:
        """Double the node arrays and the child table (every entry re-inserted)."""
        extra = len(self.owner)
        self.owner = np.concatenate([self.owner, np.full(extra, -1, np.int64)])
        self.d0 = np.concatenate([self.d0, np.zeros(extra, np.int64)])
        self.d1 = np.concatenate([self.d1, np.zeros(extra, np.int64)])
        size = 2 * len(self.tval)
        keys_n, keys_t, vals = np.full(size, -1, np.int64), np.zeros(size, np.int64), np.zeros(size, np.int64)
        _rehash(self.tkey_node, self.tkey_tok, self.tval, keys_n, keys_t, vals)
        self.tkey_node, self.tkey_tok, self.tval = keys_n, keys_t, vals

    def ensure_paths(self) -> None:
        if self.path_nodes is not None:
            return
        args = (self.tok_a, self.off_a, self.tok_b, self.off_b, self.W, self.ns, self.roots, self.d1,
                self.tkey_node, self.tkey_tok, self.tval)
        none = np.zeros(0, np.int64)
        total = int(_paths(*args, none, none, False))
        self.path_off = np.zeros(len(self.W) + 1, np.int64)
        self.path_nodes = np.zeros(max(total, 1), np.int64)
        _paths(*args, self.path_off, self.path_nodes, True)

    def path(self, r: int) -> np.ndarray:
        """The node ids of request ``r``'s chain, root side first."""
        self.ensure_paths()
        return self.path_nodes[self.path_off[r]:self.path_off[r + 1]]
