"""kvcache-lab's three block policies, as the Mooncake team's hit-rate simulator runs them.

A faithful port of ``scripts/kv-cache-lab-native-sim.cc`` (kvcache-ai/kvcache-blog, the
same rules as ``assets/js/kv-cache-lab.js``; semantics in ``traces/README.md §4``). The
log is a stream of block events: request ``r`` touches its blocks in order, each a node
of a prefix trie (a block's identity is its whole prefix), worth its real token count.
A request first looks all its blocks up (a hit counts only while every earlier block of
the request hit), then inserts the ones it missed:

- ``fifo``: one queue of blocks in insertion order, the oldest evicted; hits change
  nothing, any block may be inserted (its prefix need not be cached);
- ``lru``: the cache is a prefix-closed set of trie nodes; hits are touched first to
  last; the least recently used *leaf* is evicted, never one of the request's own cached
  blocks; a block is inserted only under a cached parent, and insertion stops at the
  first block that finds no room;
- ``belady``: ``lru`` with a node's key being its next use (the next request that
  touches it) and the leaf used farthest in the future evicted, but only when the block
  being inserted is used sooner (bypass, otherwise insertion stops).

kvcache-lab reports a capacity only if the cache filled up during the warm-up window;
:func:`simulate` returns that flag with the counts.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from kvsim.errors import ConfigError
from kvsim.io.trace.columns import Trace

LAB_POLICIES = ("fifo", "lru", "belady")


@dataclass
class BlockEvents:
    """A log as kvcache-lab sees it: per block event its node and tokens, per request its end."""

    node: np.ndarray          # int64 (events,): trie node 1..D (0 = the root)
    tokens: np.ndarray        # int64 (events,)
    request_end: np.ndarray   # int64 (requests,): end of each request's events
    parent: np.ndarray        # int64 (D+1,): parent node (root: 0)
    block_size: int

    @property
    def num_requests(self) -> int:
        return len(self.request_end)

    def next_use(self) -> np.ndarray:
        """Per event, the next request that touches the same node (requests + 1 = never)."""
        return _next_use(self.node, self.request_end, len(self.parent))

    def unique_in(self, requests: int) -> int:
        """Distinct blocks among the first ``requests`` requests."""
        end = int(self.request_end[requests - 1]) if requests > 0 else 0
        return int(len(np.unique(self.node[:end])))


def block_events(trace: Trace, block_size: int | None = None, tail: str = "weighted") -> BlockEvents:
    """The log's blocks: ``ceil(L/B)`` per request, the partial last one worth its length
    (``tail="weighted"``, Mooncake ids), or ``floor(L/B)`` (``"drop"``, kv-cache-tester
    ids). Namespaces (salt / LoRA) never share a block."""
    from kvsim.sweep.chains import prompt_block_keys
    from kvsim.sweep.curves import _namespace_keys

    if tail not in ("weighted", "drop"):
        raise ConfigError(f"tail must be 'weighted' or 'drop', got {tail!r}")
    tokens = trace.require_tokens("kvcache-lab's policies")
    B = int(block_size or trace.meta.hash_block_size or 512)
    keys, key_off, last_len = prompt_block_keys(tokens, trace.offsets, B, _namespace_keys(trace))
    nb = np.diff(key_off)
    if tail == "drop":
        keep_n = trace.prompt_lengths // B
    else:
        keep_n = nb
    keep = np.repeat(np.arange(len(nb)), nb)
    pos = np.arange(len(keys)) - np.repeat(key_off[:-1], nb)
    sel = pos < keep_n[keep]
    w = np.full(len(keys), B, np.int64)
    last = key_off[1:] - 1
    has = nb > 0
    w[last[has]] = last_len[has]
    keys, w, pos, owner = keys[sel], w[sel], pos[sel], keep[sel]
    # nodes numbered by first appearance, as kvcache-lab's trie does (ties in its heaps
    # go to the larger node id)
    uniq, first, inv = np.unique(keys, return_index=True, return_inverse=True)
    order = np.empty(len(uniq), np.int64)
    order[np.argsort(first, kind="stable")] = np.arange(len(uniq))
    node = order[inv.reshape(-1)] + 1
    parent = np.zeros(len(uniq) + 1, np.int64)
    first = pos > 0
    prev = np.r_[0, node[:-1]]
    parent[node[first]] = prev[first]
    end = np.cumsum(np.minimum(keep_n, nb)).astype(np.int64)
    return BlockEvents(node, w, end, parent, B)


@njit(cache=True)
def _next_use(node, request_end, num_nodes):
    n = len(request_end)
    out = np.empty(len(node), np.int64)
    last = np.full(num_nodes, n + 1, np.int64)
    for r in range(n - 1, -1, -1):
        a = request_end[r - 1] if r > 0 else 0
        b = request_end[r]
        for i in range(a, b):
            out[i] = last[node[i]]
        for i in range(a, b):
            last[node[i]] = r
    return out


@njit(cache=True, inline="always")
def _first_miss(node, start, end, cached):
    """The first of a request's blocks ``start..end-1`` not cached (``end`` when all are):
    a hit counts only while every earlier block of the request hit."""
    i = start
    while i < end and cached[node[i]]:
        i += 1
    return i


@njit(cache=True)
def _fifo(node, request_end, num_nodes, capacity, warmup):
    in_cache = np.zeros(num_nodes, np.bool_)
    queue = np.empty(len(node) + 1, np.int64)
    head = tail = 0
    size = 0
    filled = False
    first_miss = np.empty(len(request_end), np.int64)
    start = 0
    for r in range(len(request_end)):
        end = request_end[r]
        first_miss[r] = _first_miss(node, start, end, in_cache)
        for i in range(start, end):
            x = node[i]
            if in_cache[x]:
                continue
            if size >= capacity:
                while head < tail:
                    v = queue[head]
                    head += 1
                    if in_cache[v]:
                        in_cache[v] = False
                        size -= 1
                        break
            if size < capacity:
                in_cache[x] = True
                size += 1
                queue[tail] = x
                tail += 1
                if size >= capacity and r < warmup:
                    filled = True
        start = end
    return first_miss, filled


@njit(cache=True, inline="always")
def _better(ka, na, kb, nb, max_heap):
    if ka == kb:
        return na > nb
    return ka > kb if max_heap else ka < kb


@njit(cache=True)
def _hpush(hk, hn, hv, hsize, key, nd, ver, max_heap):
    i = hsize
    hk[i], hn[i], hv[i] = key, nd, ver
    while i > 0:
        p = (i - 1) >> 1
        if not _better(hk[i], hn[i], hk[p], hn[p], max_heap):
            break
        hk[i], hk[p] = hk[p], hk[i]
        hn[i], hn[p] = hn[p], hn[i]
        hv[i], hv[p] = hv[p], hv[i]
        i = p
    return hsize + 1


@njit(cache=True)
def _hpop(hk, hn, hv, hsize, max_heap):
    """Moves the top to index ``hsize - 1`` and restores the heap on the rest."""
    last = hsize - 1
    hk[0], hk[last] = hk[last], hk[0]
    hn[0], hn[last] = hn[last], hn[0]
    hv[0], hv[last] = hv[last], hv[0]
    i = 0
    while True:
        left = 2 * i + 1
        right = left + 1
        best = i
        if left < last and _better(hk[left], hn[left], hk[best], hn[best], max_heap):
            best = left
        if right < last and _better(hk[right], hn[right], hk[best], hn[best], max_heap):
            best = right
        if best == i:
            break
        hk[i], hk[best] = hk[best], hk[i]
        hn[i], hn[best] = hn[best], hn[i]
        hv[i], hv[best] = hv[best], hv[i]
        i = best
    return last


@njit(cache=True)
def _trie(node, request_end, parent, nxt, capacity, warmup, optimal):
    nn = len(parent)
    present = np.zeros(nn, np.bool_)
    children = np.zeros(nn, np.int64)
    version = np.zeros(nn, np.int64)
    key = np.zeros(nn, np.int64)
    mark = np.zeros(nn, np.int64)
    cap_heap = 6 * len(node) + 16
    hk = np.empty(cap_heap, np.int64)
    hn = np.empty(cap_heap, np.int64)
    hv = np.empty(cap_heap, np.int64)
    hsize = 0
    skipped_k = np.empty(8, np.int64)
    skipped_n = np.empty(8, np.int64)
    skipped_v = np.empty(8, np.int64)
    present[0] = True
    size = 0
    clock = 0
    mark_value = 1
    filled = False
    first_miss = np.empty(len(request_end), np.int64)
    start = 0
    for r in range(len(request_end)):
        end = request_end[r]
        first_miss[r] = _first_miss(node, start, end, present)
        for i in range(start, first_miss[r]):  # the hits are touched first to last
            x = node[i]
            if optimal:
                key[x] = nxt[i]
            else:
                clock += 1
                key[x] = clock
            if children[x] == 0:  # push_leaf
                version[x] += 1
                hsize = _hpush(hk, hn, hv, hsize, key[x], x, version[x], optimal)
        mark_value += 1
        mark[0] = mark_value
        for i in range(start, end):
            if present[node[i]]:
                mark[node[i]] = mark_value
        for i in range(start, end):
            x = node[i]
            if present[x]:
                continue
            if size >= capacity:
                # evict_leaf(candidate key)
                cand = nxt[i] if optimal else 0
                ns = 0
                ok = False
                while hsize > 0:
                    hsize = _hpop(hk, hn, hv, hsize, optimal)
                    tk, tn, tv = hk[hsize], hn[hsize], hv[hsize]
                    if (not present[tn]) or children[tn] != 0 or version[tn] != tv or key[tn] != tk:
                        continue
                    if mark[tn] == mark_value:
                        if ns == len(skipped_k):
                            skipped_k = np.concatenate((skipped_k, np.empty(ns, np.int64)))
                            skipped_n = np.concatenate((skipped_n, np.empty(ns, np.int64)))
                            skipped_v = np.concatenate((skipped_v, np.empty(ns, np.int64)))
                        skipped_k[ns], skipped_n[ns], skipped_v[ns] = tk, tn, tv
                        ns += 1
                        continue
                    if optimal and tk <= cand:
                        hsize = _hpush(hk, hn, hv, hsize, tk, tn, tv, optimal)
                        break
                    present[tn] = False
                    size -= 1
                    p = parent[tn]
                    children[p] -= 1
                    if p > 0 and present[p] and children[p] == 0:
                        version[p] += 1
                        hsize = _hpush(hk, hn, hv, hsize, key[p], p, version[p], optimal)
                    ok = True
                    break
                for k in range(ns):
                    hsize = _hpush(hk, hn, hv, hsize, skipped_k[k], skipped_n[k], skipped_v[k], optimal)
                if not ok:
                    break
            if size < capacity and present[parent[x]]:
                present[x] = True
                size += 1
                children[parent[x]] += 1
                if optimal:
                    key[x] = nxt[i]
                else:
                    clock += 1
                    key[x] = clock
                version[x] += 1
                hsize = _hpush(hk, hn, hv, hsize, key[x], x, version[x], optimal)
                if size >= capacity and r < warmup:
                    filled = True
            else:
                break
        start = end
    return first_miss, filled


@dataclass
class LabResult:
    policy: str
    capacity_blocks: int
    hit_tokens: int
    measured_tokens: int
    filled: bool          # the cache filled up during the warm-up window (kvcache-lab's reporting rule)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.measured_tokens if self.measured_tokens else 0.0


def simulate(events: BlockEvents, policy: str, capacity_blocks: int, warmup_requests: int = 0,
             next_use: np.ndarray | None = None) -> LabResult:
    """One kvcache-lab policy at one capacity (in blocks)."""
    if policy not in LAB_POLICIES:
        raise ConfigError(f"unknown kvcache-lab policy {policy!r}; choose from {', '.join(LAB_POLICIES)}")
    cap = int(capacity_blocks)
    if cap <= 0:
        total = int(events.tokens[(int(events.request_end[warmup_requests - 1]) if warmup_requests else 0):].sum())
        return LabResult(policy, cap, 0, total, False)
    if policy == "fifo":
        first_miss, f = _fifo(events.node, events.request_end, len(events.parent), cap, warmup_requests)
    else:
        nxt = events.next_use() if next_use is None else next_use
        first_miss, f = _trie(events.node, events.request_end, events.parent, nxt, cap, warmup_requests,
                              policy == "belady")
    return LabResult(policy, cap, *_measured(events, first_miss, warmup_requests), bool(f))


def _measured(events: BlockEvents, first_miss: np.ndarray, warmup: int) -> tuple[int, int]:
    """(hit tokens, tokens) of the requests after the first ``warmup``: a request hits the
    blocks before its ``first_miss``."""
    if warmup >= events.num_requests:
        return 0, 0
    starts = np.r_[0, events.request_end[:-1]].astype(np.int64)[warmup:]
    cum = np.r_[0, np.cumsum(events.tokens)].astype(np.int64)
    return int((cum[first_miss[warmup:]] - cum[starts]).sum()), int(cum[-1] - cum[starts[0]])


def lab_hit_rates(trace: Trace, policy: str, capacity_blocks, block_size: int | None = None,
                  warmup=None, tail: str = "weighted") -> np.ndarray:
    """One kvcache-lab policy's token hit rate at each capacity (in blocks) of ``trace``.

    ``warmup`` as :mod:`kvsim.warmup` takes it. Every capacity is reported, whether or not
    the cache filled during the warm-up (kvcache-lab leaves those out; see :func:`simulate`).
    """
    from kvsim.warmup import parse_warmup

    events = block_events(trace, block_size, tail)
    warm = parse_warmup(warmup).requests(len(trace))
    nxt = events.next_use() if policy != "fifo" else None
    return np.array([simulate(events, policy, int(c), warm, nxt).hit_rate for c in np.atleast_1d(capacity_blocks)])
