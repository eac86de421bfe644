"""SGLang 0.5.23's HiCache: the radix tree with host copies, and the scheduler over it (``docs/engines/offload.md §3``).

``--enable-hierarchical-cache`` builds ``UnifiedRadixCache.init_hicache``: every tree node
may hold its KV on the device, on the host, or both (offload.md §3.3). :class:`HiRadixTree`
is kvsim's unified :class:`~kvsim.engines.sglang.tree.RadixTree` with those states, at the
points where SGLang's tree core (``unified_tree_core.py``) handles them:

1. match (offload.md §3.5, §3.6): the walk continues through host-only nodes; the device
   prefix ends at the last node on the device, ``best_match`` at the deepest node with KV
   anywhere, and the host hit is the host-only part between them;
2. load-back: the host part of the path is loaded whole (device slots are evicted for
   it), or not at all when it is under 10 tokens; loaded nodes are on both tiers;
3. insert (§3.3): a host-only node the insert passes takes the request's fresh KV back
   (no duplicate is freed); every node the insert passes beyond what the request inserted
   before gains a hit, and at the write policy's threshold is backed up to host with its
   unbacked ancestors, ancestors first (``write_back``: never at insert); a backup in
   flight locks its node until the next step acknowledges it;
4. device eviction (§3.4): device leaves (no child on the device) by the eviction policy;
   a backed-up leaf is demoted to host-only, an unbacked one deleted, or under
   ``write_back`` backed up first; host room comes from host-only leaves, and under
   ``write_back`` first from host copies of nodes still on the device.

Device sizes (``evictable_size``, ``protected_size``) count device tokens only.

The scheduler with HiCache (``--replay steps|timed``): :class:`HiCacheEngine` is kvsim's
scheduler loop (:mod:`kvsim.engines.sglang.scheduler`) over that tree, with HiCache's calls
where SGLang's scheduler makes them:

1. ``check_hicache_events`` at the top of ``get_next_batch_to_run``: the transfers in flight
   (backups, load-backs; they take no time) are acknowledged and release their locks;
2. ``PrefillAdder.add_one_req`` loads a waiting request's host hit back before admitting it
   (``init_load_back``, in :mod:`kvsim.engines.sglang.adder`);
3. ``prepare_for_extend`` splits a request's cached tokens into device and host once, at its
   first chunk (``split_cached_prefix_by_tier``, offload.md §3.6).

Every step is taken one at a time. In a timed replay a step that loads lasts
``max(compute, transfer)``: SGLang loads layer by layer while the batch computes
(``layer_first`` loads, ``ready_to_load_host_cache``).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Hashable

import numpy as np

from kvsim.engines.sglang.rules import floor_page
from kvsim.engines.sglang.scheduler import SglangEngine, SglangSchedSettings
from kvsim.engines.sglang.tree import SCALE, Node, RadixTree, _int64
from kvsim.tiers.hicache import HiCacheSettings, split_cached_prefix


class HiNode(Node):
    """A tree node with a host copy: ``host`` (its KV is on the host), host locks, a transfer in flight."""

    __slots__ = ("host", "host_lock_ref", "pending")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.host = False                       # a host copy exists (backed up)
        self.host_lock_ref = 0
        self.pending: Transfer | None = None    # a backup or load-back not yet acknowledged


class Transfer:
    """A backup (write-through) or a load-back in flight: the path lock it holds until the next
    step acknowledges it, and the nodes it covers (split fragments join), ancestors first."""

    __slots__ = ("lock_node", "nodes", "load")

    def __init__(self, lock_node: Node, nodes: list, load: bool) -> None:
        self.lock_node, self.nodes, self.load = lock_node, nodes, load

    @property
    def evicted(self) -> bool:
        """Host-only: the device copy is gone."""
        return self.value is None and self.parent is not None


class HiCounters:
    """What the host tier did, in tokens (offload.md §3.6)."""

    def __init__(self) -> None:
        self.backed_up = self.loaded = self.host_evicted = self.demoted = self.deleted = 0
        self.failed_backups = 0
        self.failed_loads = 0


class HiRadixTree(RadixTree):
    """The unified tree, its host pool and HiCache's node states."""

    def __init__(self, page_size: int, policy, flavor: str, policy_config, hicache: HiCacheSettings,
                 pool=None) -> None:
        self.hicache = hicache
        self.write_back = hicache.write_policy == "write_back"
        self.threshold = hicache.write_through_threshold
        self.host_capacity = hicache.host_tokens
        self.host_used = 0
        self.host_leaves: set[HiNode] = set()
        self.duplicates: dict[int, HiNode] = {}      # full_host_duplicates: insertion order
        self.in_flight: list[Transfer] = []           # backups and load-backs awaiting their ack
        self.counters = HiCounters()
        self.pool = pool                              # the device allocator (load-back takes slots)
        self.last_best: Node | None = None            # the last match's best node and host hit
        self.last_host_hit = 0
        super().__init__(page_size, policy, flavor, policy_config)
        assert not self.classic, "HiCache is built on the unified tree"

    def _new_node(self, priority: int = 0) -> HiNode:
        self.clock += 2
        node = HiNode(self._next_id, (self.clock - 1) * SCALE, self.clock * SCALE, priority)
        self._next_id += 1
        self.num_nodes += 1
        return node

    # -- leaf sets and sizes --------------------------------------------------------------
    @staticmethod
    def _dev(node: Node) -> int:
        """Device tokens of a node (0 when host-only)."""
        return 0 if node.value is None else len(node.key)

    def _update_leaf(self, node: HiNode) -> None:
        """``_update_evictable_leaf_sets``: device leaves (on the device, no child on the device,
        unlocked) and host leaves (host-only, childless, unlocked on both tiers)."""
        if node is self.root or node.parent is None:
            self.evictable_leaves.discard(node)
            self.host_leaves.discard(node)
            return
        on_device = node.value is not None
        if on_device and node.lock_ref == 0 and not any(c.value is not None for c in node.children.values()):
            self.evictable_leaves.add(node)
        else:
            self.evictable_leaves.discard(node)
        if (not on_device and node.host and not node.children and node.lock_ref == 0
                and node.host_lock_ref == 0):
            self.host_leaves.add(node)
        else:
            self.host_leaves.discard(node)

    def _track_duplicate(self, node: HiNode) -> None:
        """``_update_duplicate_tracking``: a node on both tiers with nothing in flight."""
        if node.value is not None and node.host and node.pending is None:
            self.duplicates.setdefault(node.id, node)
        else:
            self.duplicates.pop(node.id, None)

    def lock(self, node: Node) -> None:
        root = self.root
        while node is not root:
            if node.lock_ref == 0:
                k = self._dev(node)
                self.evictable_size -= k
                self.protected_size += k
            node.lock_ref += 1
            self.evictable_leaves.discard(node)
            self.host_leaves.discard(node)
            node = node.parent

    def unlock(self, node: Node) -> None:
        root = self.root
        while node is not root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                k = self._dev(node)
                self.evictable_size += k
                self.protected_size -= k
                self._update_leaf(node)
            node = node.parent

    def _start(self, lock_node: HiNode, nodes: list, load: bool) -> None:
        """A transfer in flight: its path lock and its nodes' marks until the ack."""
        t = Transfer(lock_node, list(nodes), load)
        for x in nodes:
            x.pending = t
        self.lock(lock_node)
        self.in_flight.append(t)

    def check_events(self) -> None:
        """``check_hicache_events`` at the start of a step: acknowledge every transfer in flight
        (transfers take no time), releasing its lock; its nodes become tracked duplicates
        (a load-back's deepest first, as ``finish_load_back`` walks up)."""
        in_flight, self.in_flight = self.in_flight, []
        for t in in_flight:
            self.unlock(t.lock_node)
            for x in (reversed(t.nodes) if t.load else t.nodes):
                if x.pending is t:
                    x.pending = None
                if x.parent is not None:
                    self._track_duplicate(x)

    def settled(self) -> bool:
        return not self.in_flight

    # -- 1. match (offload.md §3.5, §3.6) -------------------------------------------------------
    def match_prefix(self, tokens: np.ndarray, ns: Hashable = None, limit: int | None = None) -> tuple[int, Node]:
        """The device prefix and its last node; the walk goes on through host-only nodes and
        leaves ``last_best`` (the deepest node with KV anywhere) and ``last_host_hit``."""
        tokens = _int64(tokens)
        n = floor_page(len(tokens) if limit is None else min(limit, len(tokens)), self.page_size)
        root = self.root
        self.last_best, self.last_host_hit = root, 0
        if n <= 0:
            return 0, root
        node, off = root, 0
        device, device_len = root, 0
        while off < n:
            child = node.children.get(self._child_key(node, tokens, off, ns))
            if child is None or (child.value is None and not child.host):
                break
            m = self._match_len(child.key, tokens, off, n)
            off += m
            node = self._split(child, m) if m < len(child.key) else child
            if node.value is not None:
                device, device_len = node, off
            if node is not child:
                break
        # _match_post_processor: the best node and its ancestors, deepest newest
        t, k, x = self.tick(), 0, node
        while x is not None:
            x.last_access_time = t - k
            k, x = k + 1, x.parent
        self._touched(node)
        self.last_best = node
        self.last_host_hit = off - device_len
        return device_len, device

    # -- 2. load-back (offload.md §3.5) ---------------------------------------------------------
    def load_back(self, best: HiNode, evict) -> list[HiNode]:
        """Load the host-only nodes from ``best`` up to the device part of its path, all or none
        (``_load_back_transfers``); ``evict(tokens)`` makes that many device slots free. Returns the loaded nodes,
        top down (empty: nothing loaded)."""
        chain, x = [], best
        while x is not self.root and x.value is None:
            chain.append(x)
            x = x.parent
        chain.reverse()
        tokens = sum(len(x.key) for x in chain)
        if tokens < max(1, self.hicache.load_back_threshold):
            return []
        best.host_lock_ref += 1                   # inc_host_lock_ref: the anchor stays on host
        self.lock(best)                           # the path is pinned while device slots are freed
        try:
            if self.pool.available() < tokens:
                evict(tokens)
            if self.pool.available() < tokens:
                self.counters.failed_loads += 1
                return []
            slots = self._device_slots(tokens)
            start = 0
            for x in chain:
                x.value = slots[start:start + len(x.key)]
                start += len(x.key)
                if x.lock_ref:
                    self.protected_size += len(x.key)
                else:
                    self.evictable_size += len(x.key)
                self._update_leaf(x)
                if x.parent is not self.root:
                    self._update_leaf(x.parent)
            self.counters.loaded += tokens
            self._start(best, chain, load=True)   # ongoing_load_back: locked until the ack
            return chain
        finally:
            self.unlock(best)
            best.host_lock_ref -= 1
            self._update_leaf(best)

    def _device_slots(self, tokens: int) -> np.ndarray:
        p = self.page_size
        pages = self.pool.alloc_pages(tokens // p)
        return pages if p == 1 else (pages[:, None] * p + np.arange(p)).reshape(-1)

    # -- 3. insert (offload.md §3.3) ------------------------------------------------------------
    def insert(self, tokens: np.ndarray, value: np.ndarray | None = None, ns: Hashable = None,
               priority: int = 0, inserted_len: int = 0, length: int | None = None) -> tuple[int, Node]:
        """Insert ``tokens[:length]``; returns (the tokens the tree already held on the device,
        whose duplicate KV the caller frees, the node the insert ends on)."""
        tokens = _int64(tokens)
        k_len = len(tokens) if length is None else length
        assert k_len % self.page_size == 0 and value is not None and len(value) >= k_len
        root = self.root
        root.last_access_time = self.tick()
        if priority > root.priority:
            root.priority = priority
        node, off, device_end = root, 0, 0
        while off < k_len:
            child = node.children.get(self._child_key(node, tokens, off, ns))
            if child is None:
                break
            child.last_access_time = self.tick()
            m = self._match_len(child.key, tokens, off, k_len)
            if m < len(child.key):
                child = self._split(child, m)
            if priority > child.priority:
                child.priority = priority
            if child.value is None:               # host-only: the request's fresh KV takes its place
                self._unevict(child, value[off:off + m])
            else:
                device_end = off + m
            off += m
            if off > inserted_len:
                self._insert_pass(child)
            self._touched(child)
            node = child
        if off < k_len:
            leaf = self._attach_leaf(node, tokens, value, off, k_len, ns, priority, depths=True)
            self._update_leaf(leaf)
            self._update_leaf(node)
            if k_len > inserted_len:
                self._insert_pass(leaf)
            return device_end, leaf
        return device_end, node

    def _unevict(self, node: HiNode, fresh: np.ndarray) -> None:
        """``_unevict_node_on_insert``: a host-only node is on the device again (both tiers)."""
        node.value = fresh
        if node.lock_ref:
            self.protected_size += len(node.key)
        else:
            self.evictable_size += len(node.key)
        self._update_leaf(node)
        self._track_duplicate(node)
        if node.parent is not self.root:
            self._update_leaf(node.parent)

    def _insert_pass(self, node: HiNode) -> None:
        """``_inc_hit_count_and_check``: a hit, and a backup at the write policy's threshold."""
        if node.value is None or self.write_back:
            return
        node.hit_count += 1
        self._touched(node)
        if not node.host and node.hit_count >= self.threshold:
            chain, x = [node], node.parent
            while x is not self.root and not x.host:          # unbacked ancestors go first
                chain.append(x)
                x = x.parent
            for x in reversed(chain):
                if x.host:
                    continue
                if not self._backup(x):
                    break
                self._start(x, [x], load=False)                 # locked until the ack

    def _backup(self, node: HiNode) -> bool:
        """Copy a node's KV to host, evicting host-only leaves for room (``_execute_kv_backup``)."""
        need = len(node.key)
        free = self.host_capacity - self.host_used
        if free < need and self._evict_host(need - free) < need - free:
            self.counters.failed_backups += 1
            return False
        self.host_used += need
        node.host = True
        self.counters.backed_up += need
        self._update_leaf(node)
        return True

    def _split(self, child: Node, m: int) -> Node:
        new = super()._split(child, m)
        new.host = child.host
        new.host_lock_ref = child.host_lock_ref
        t = new.pending = child.pending
        if t is not None:            # the ack covers both fragments
            t.nodes.insert(t.nodes.index(child), new)
        self._update_leaf(new)
        self._track_duplicate(new)
        return new

    # -- 4. eviction (offload.md §3.4) ---------------------------------------------------------
    def _evict_leaf(self, x: HiNode) -> None:
        """``evict`` frees device leaves lowest key first (offload.md §3.4), each through
        ``evict_device_leaf``: demote a backed-up leaf, delete an unbacked one (write_back:
        back it up first; if the host has no room, drop it)."""
        if not x.host and self.write_back and self._backup(x):
            self._track_duplicate(x)              # the synchronous ack: briefly a duplicate
        if x.host:
            self._demote(x)
        else:
            self._delete_subtree(x)

    def _demote(self, x: HiNode) -> None:
        self.evictable_size -= len(x.key)
        x.value = None
        self.counters.demoted += len(x.key)
        self._update_leaf(x)
        if x.parent is not self.root:
            self._update_leaf(x.parent)

    def _delete_subtree(self, x: HiNode) -> None:
        """Drop an unbacked device leaf (and any host-only nodes under it), then childless
        tombstone ancestors (``_delete_unbacked_device_leaf``, ``drop_subtree_no_host``)."""
        for child in list(x.children.values()):
            self._drop_host_subtree(child)
        self.evictable_size -= len(x.key)
        self.counters.deleted += len(x.key)
        self._detach(x)

    def _drop_host_subtree(self, node: HiNode) -> None:
        for child in list(node.children.values()):
            self._drop_host_subtree(child)
        if node.host:
            self.host_used -= len(node.key)
        self._detach(node)

    def _detach(self, x: HiNode) -> None:
        parent = x.parent
        del parent.children[self._child_key(parent, x.key, 0, x.ns)]
        x.parent = None
        self.num_nodes -= 1
        self.evictable_leaves.discard(x)
        self.host_leaves.discard(x)
        self.duplicates.pop(x.id, None)
        if parent is not self.root:
            self._update_leaf(parent)

    def _evict_host(self, num_tokens: int) -> int:
        """``drive_host_eviction``: free host tokens; under ``write_back`` host copies of nodes
        still on the device go first (evictable device leaves spared in a first pass), then
        host-only leaves lowest key first. Returns the host tokens freed."""
        freed = 0
        if self.write_back:
            swept = []
            for spare_leaves in (True, False):
                if freed >= num_tokens:
                    break
                for nid, node in self.duplicates.items():
                    if freed >= num_tokens:
                        break
                    if node.value is None or not node.host:
                        swept.append(nid)            # stale entry
                        continue
                    if spare_leaves and node in self.evictable_leaves:
                        continue
                    if node.pending is not None or node.host_lock_ref:
                        continue
                    node.host = False
                    self.host_used -= len(node.key)
                    freed += len(node.key)
                    self.counters.host_evicted += len(node.key)
                    self._update_leaf(node)
                    swept.append(nid)
            for nid in swept:
                self.duplicates.pop(nid, None)
        heap = [(self._heap_key(n), n) for n in self.host_leaves]
        heapq.heapify(heap)
        while freed < num_tokens and heap:
            _, x = heapq.heappop(heap)
            if x not in self.host_leaves:
                continue
            parent = x.parent
            self.host_used -= len(x.key)
            freed += len(x.key)
            self.counters.host_evicted += len(x.key)
            self._detach(x)
            if parent in self.host_leaves:
                heapq.heappush(heap, (self._heap_key(parent), parent))
        return freed

    # -- inspection ------------------------------------------------------------------------
    def host_only_tokens(self) -> int:
        return sum(len(n.key) for n, _ in self.nodes() if n.value is None)

    def check(self) -> None:
        ev = pr = host = 0
        for node, _ in self.nodes():
            assert len(node.key) > 0 and len(node.key) % self.page_size == 0
            assert node.value is not None or node.host, "a node with KV on neither tier"
            if node.host:
                host += len(node.key)
            if node.value is not None:
                if node.lock_ref:
                    pr += len(node.key)
                else:
                    ev += len(node.key)
            assert node.parent.children[self._child_key(node.parent, node.key, 0, node.ns)] is node
        assert (ev, pr) == (self.evictable_size, self.protected_size), ((ev, pr), self.evictable_size,
                                                                        self.protected_size)
        assert host == self.host_used, (host, self.host_used)


def tier_run(tree: HiRadixTree, device: list[int], host: list[int]):
    """What the host tier did in a replay (:class:`~kvsim.tiers.report.TierRun`): per request the
    cached tokens from the device and from host (``split_cached_prefix_by_tier``, offload.md §3.6)."""
    from kvsim.tiers.report import TierRun

    s, c = tree.hicache, tree.counters
    return TierRun("hicache", s.describe(), {"cpu": s.host_tokens},
                   {"gpu": np.asarray(device, np.int64), "cpu": np.asarray(host, np.int64)},
                   {"cpu": c.backed_up}, {"cpu": c.loaded}, {"cpu": c.host_evicted}, {"cpu": c.failed_backups},
                   bytes_per_token=s.bytes_per_token, link_bytes_per_s={"cpu": s.link_bytes_per_s})


# -- the scheduler with HiCache ------------------------------------------------------------

@dataclass(frozen=True)
class HiCacheSchedSettings(SglangSchedSettings):
    """The scheduler's settings with a host cache (:class:`~kvsim.tiers.hicache.HiCacheSettings`)."""

    hicache: Any = None

    def engine(self, prompts, outputs, loras=None, salts=None, logprob_starts=None, **_other) -> "HiCacheEngine":
        return HiCacheEngine(self, prompts, outputs, loras, salts, logprob_starts)

    def without_tier(self) -> SglangSchedSettings:
        """The same scheduler without the host cache (the timed comparison)."""
        return SglangSchedSettings(**{k: getattr(self, k) for k in SglangSchedSettings.__dataclass_fields__})

    def describe(self) -> str:
        return f"{super().describe()}; {self.hicache.describe()}"


class HiCacheEngine(SglangEngine):
    """The scheduler process with HiCache."""

    def __init__(self, settings: HiCacheSchedSettings, *args, **kwargs) -> None:
        super().__init__(settings, *args, **kwargs)
        self.split: dict[int, tuple[int, int]] = {}    # request -> (device, host) cached tokens
        self.result.extra["offload"] = _LiveRun(self)

    def fast_forward(self, step: int, horizon: int) -> int:
        return 0

    @property
    def on_batch(self):
        return self._on_batch

    @on_batch.setter
    def on_batch(self, fn) -> None:
        """The timed clock's callback, told how long this step's load-backs take."""
        if fn is None:
            self._on_batch = None
            return

        def with_loads(step, reqs, new, context, decode):
            tokens, self.cache.pending_load = self.cache.pending_load, 0
            fn(step, reqs, new, context, decode, load_s=self.settings.hicache.load_seconds(tokens), overlap=True)
        self._on_batch = with_loads

    def get_next_batch_to_run(self):
        self.cache.check_hicache_events()
        return super().get_next_batch_to_run()

    def prepare_for_extend(self, batch) -> None:
        super().prepare_for_extend(batch)
        for r in batch.reqs:
            if r.index not in self.split and not r.retracted_stain:
                self.split[r.index] = split_cached_prefix(r.kv.prefix_len, r.kv.cached_host)

    def tier_run(self):
        n = len(self.prompts)
        device, host = np.zeros(n, np.int64), np.zeros(n, np.int64)
        for i, (d, h) in self.split.items():
            device[i], host[i] = d, h
        return tier_run(self.cache.tree, device.tolist(), host.tolist())


class _LiveRun:
    """The host tier's :class:`~kvsim.tiers.report.TierRun` as of now."""

    def __init__(self, engine: HiCacheEngine) -> None:
        self._engine = engine

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.snapshot(), name)

    def snapshot(self):
        return self._engine.tier_run()
