"""SGLang 0.5.23 HiCache, the host side, readable (``docs/engines/offload.md §3``).

The radix tree is the engine's (kvsim's SGLang model); HiCache adds a host copy per node.
:class:`HiCacheHost` keeps, per tree node (by the tree's node id), its state and hit count
and the host pool's occupancy, and the tree calls it where SGLang's tree core does:

1. ``on_insert_pass(node, tokens)`` for every node a request's cache insert passes beyond
   what it inserted before (``_inc_hit_count_and_check``): the hit count rises and, at the
   policy's threshold (1 for ``write_through``, 2 for ``write_through_selective``, never for
   ``write_back``), the node is backed up to host (offload.md §3.3);
2. ``on_device_evict(node)`` when device eviction takes a leaf: a backed-up node is demoted
   to host-only, an unbacked one deleted, or under ``write_back`` backed up first (offload.md §3.4);
3. ``load_back(host_tokens, quota, delta)``: a request whose match continues on host loads
   all of it, or nothing when under ``load_back_threshold`` (10) tokens or over the device
   quota (offload.md §3.5);
4. :func:`split_cached_prefix` gives the per-request ``(device, host)`` split (offload.md §3.6).
"""
from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from enum import Enum

from kvsim.errors import ConfigError

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
LOAD_BACK_THRESHOLD = 10


def host_pool_tokens(device_tokens: int, page_size: int, ratio: float = 2.0, hicache_size_gb: float = 0.0,
                     bytes_per_token: int = 0) -> int:
    """Host pool size in tokens (``pool_host/base.py:214-228``, offload.md §3.2): ``ratio`` x the
    device pool, or ``hicache_size`` GB (10^9 bytes, per rank) over the host bytes per token,
    then whole pages plus one padding page."""
    if page_size <= 0:
        raise ConfigError("page size must be positive")
    if hicache_size_gb > 0:
        if bytes_per_token <= 0:
            raise ConfigError("--hicache-size needs the KV bytes per token (a --model)")
        size = int(hicache_size_gb * 1e9 // bytes_per_token)
    else:
        size = int(device_tokens * ratio)
    return (size // page_size + 1) * page_size


def mha_host_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int,
                             v_head_dim: int | None = None) -> int:
    """``MHATokenToKVPoolHost.get_size_per_token``: K and V of every layer."""
    return (head_dim + (v_head_dim or head_dim)) * kv_heads * layers * dtype_bytes


class NodeState(Enum):
    DEVICE = "device"          # KV on the GPU only
    BOTH = "both"              # backed up: on the GPU and on host
    HOST = "host"              # evicted from the GPU, kept on host


@dataclass
class HostNode:
    tokens: int
    hit_count: int = 0
    state: NodeState = NodeState.DEVICE


@dataclass(frozen=True)
class HiCacheSettings:
    """``--hicache-*`` for one rank (offload.md §3.1)."""

    host_tokens: int
    page_size: int = 1
    write_policy: str = "write_through"
    load_back_threshold: int = LOAD_BACK_THRESHOLD
    bytes_per_token: int = 0          # host KV bytes per token, for reports (0: unknown)
    link_bytes_per_s: float = 32e9    # host <-> GPU, for timed replays (kvsim.costs.links)

    def load_seconds(self, tokens: int) -> float:
        """A load-back of ``tokens`` over the host link."""
        return tokens * self.bytes_per_token / self.link_bytes_per_s

    def __post_init__(self) -> None:
        if self.write_policy not in WRITE_POLICIES:
            raise ConfigError(f"unknown --hicache-write-policy {self.write_policy!r} ({', '.join(WRITE_POLICIES)})")
        if self.host_tokens <= 0 or self.host_tokens % self.page_size:
            raise ConfigError("the host pool must be a positive number of whole pages")

    @property
    def write_through_threshold(self) -> int:
        return 1 if self.write_policy == "write_through" else 2

    def describe(self) -> str:
        return f"SGLang HiCache (host {self.host_tokens:,} tokens; {self.write_policy})"

    def as_dict(self) -> dict:
        return {"backend": "hicache", "capacity_tokens": {"cpu": self.host_tokens}, "write_policy": self.write_policy,
                "load_back_threshold": self.load_back_threshold, "bytes_per_token": self.bytes_per_token}


class HiCacheHost:
    """The host copies of a tree's nodes and the host pool they take."""

    def __init__(self, settings: HiCacheSettings) -> None:
        self.settings = settings
        self.nodes: dict[Hashable, HostNode] = {}
        self.used = 0
        self.backups = self.demotions = self.deletions = self.failed_backups = 0

    def state(self, node: Hashable) -> NodeState:
        n = self.nodes.get(node)
        return NodeState.DEVICE if n is None else n.state

    def backed_up(self, node: Hashable) -> bool:
        return self.state(node) is not NodeState.DEVICE

    # -- 1. inserts ---------------------------------------------------------------------
    def on_insert_pass(self, node: Hashable, tokens: int,
                       host_victims: Callable[[], Iterable[Hashable]] = tuple) -> bool:
        """A request's insert passed ``node`` (``tokens`` long); True if it is backed up now."""
        s = self.settings
        n = self.nodes.setdefault(node, HostNode(tokens))
        n.tokens = tokens
        if s.write_policy == "write_back" or n.state is NodeState.HOST:
            return False
        n.hit_count += 1
        if n.state is NodeState.DEVICE and n.hit_count >= s.write_through_threshold:
            return self.write_backup(node, host_victims)
        return False

    def on_split(self, parent: Hashable, child: Hashable, parent_tokens: int) -> None:
        """The tree split ``child`` at ``parent_tokens``: the new parent inherits its state
        and hit count (``new_node.hit_count = child.hit_count``)."""
        c = self.nodes.get(child)
        if c is None:
            return
        self.nodes[parent] = HostNode(parent_tokens, c.hit_count, c.state)
        c.tokens -= parent_tokens

    def write_backup(self, node: Hashable, host_victims: Callable[[], Iterable[Hashable]] = tuple) -> bool:
        """Copy the node to host, evicting host-only leaves (LRU first) for room; give up if
        there is still none (offload.md §3.4)."""
        n = self.nodes[node]
        need = -(-n.tokens // self.settings.page_size) * self.settings.page_size
        if self.used + need > self.settings.host_tokens:
            for victim in host_victims():
                self.evict_host(victim)
                if self.used + need <= self.settings.host_tokens:
                    break
        if self.used + need > self.settings.host_tokens:
            self.failed_backups += 1
            return False
        self.used += need
        n.state = NodeState.BOTH
        self.backups += 1
        return True

    def evict_host(self, node: Hashable) -> None:
        """Drop a host-only leaf: the node leaves the tree."""
        n = self.nodes.pop(node)
        assert n.state is NodeState.HOST, "only host-only leaves are evicted from host"
        self.used -= -(-n.tokens // self.settings.page_size) * self.settings.page_size

    # -- 2. device eviction ---------------------------------------------------------------
    def on_device_evict(self, node: Hashable, host_victims: Callable[[], Iterable[Hashable]] = tuple) -> bool:
        """Device eviction took the leaf ``node``: True if it stays as host-only, False if the
        tree deletes it (``evict_device_leaf``)."""
        n = self.nodes.get(node)
        unbacked = n is None or n.state is NodeState.DEVICE
        if unbacked and not (self.settings.write_policy == "write_back" and n is not None
                             and self.write_backup(node, host_victims)):
            self.nodes.pop(node, None)          # no host copy: the node leaves the tree
            self.deletions += 1
            return False
        self.nodes[node].state = NodeState.HOST
        self.demotions += 1
        return True

    # -- 3. load-back -----------------------------------------------------------------------
    def load_back(self, host_tokens: int, mem_quota: int | None = None, delta: int = 0) -> bool:
        """Whether the host part of a match (``host_tokens``) is loaded: all or nothing."""
        if host_tokens < max(1, self.settings.load_back_threshold):
            return False
        return mem_quota is None or host_tokens + delta <= mem_quota

    def loaded(self, nodes: Iterable[Hashable]) -> None:
        """The host-only nodes of a loaded path are on the device again (backed up)."""
        for node in nodes:
            self.nodes[node].state = NodeState.BOTH


def split_cached_prefix(prefix_len: int, host_hit_len: int) -> tuple[int, int]:
    """``split_cached_prefix_by_tier`` without storage: ``(device, host)`` tokens of the
    cached prefix (``managers/schedule_batch.py:231-260``, offload.md §3.6)."""
    host = min(prefix_len, host_hit_len)
    return prefix_len - host, host
