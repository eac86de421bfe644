"""SGLang 0.5.23 HiCache's host side as kvsim models it (``docs/engines/offload.md §3``).

The tree is the engine's; these tests drive :class:`HiCacheHost` with node ids the way the
tree core calls it, on the acceptance scenarios of offload.md §3.7 (the same scenarios run
through the real scheduler in ``test_tiers_hicache_oracle.py``).
"""
from __future__ import annotations

import pytest

from kvsim.errors import ConfigError
from kvsim.tiers.hicache import (HiCacheHost, HiCacheSettings, NodeState, host_pool_tokens, mha_host_bytes_per_token,
                                 split_cached_prefix)


def host(policy: str = "write_through", tokens: int = 336, page: int = 16) -> HiCacheHost:
    return HiCacheHost(HiCacheSettings(host_tokens=tokens, page_size=page, write_policy=policy))


def test_host_pool_size():
    """(floor(device x ratio / page) + 1) x page, or hicache_size GB (10^9 B) per token."""
    assert host_pool_tokens(160, 16) == 336
    assert host_pool_tokens(1000, 1) == 2001
    assert host_pool_tokens(1000, 16, ratio=1.5) == 1504
    assert host_pool_tokens(4096, 64, ratio=3.0) == 12352
    per_token = mha_host_bytes_per_token(layers=2, kv_heads=1, head_dim=4, dtype_bytes=4)
    assert per_token == 64
    assert host_pool_tokens(512, 16, hicache_size_gb=0.001, bytes_per_token=per_token) == 15632
    with pytest.raises(ConfigError, match="model"):
        host_pool_tokens(512, 16, hicache_size_gb=1.0)


def test_h1_write_through_backs_up_at_insert_and_keeps_host_only_nodes():
    """H1: A's node is backed up when inserted; device eviction demotes it to host-only."""
    h = host("write_through")
    assert h.on_insert_pass("A", 64) is True
    assert h.state("A") is NodeState.BOTH and h.used == 64
    assert h.on_device_evict("A") is True and h.state("A") is NodeState.HOST


def test_h2_selective_needs_a_second_pass():
    """H2: write_through_selective backs up at the second insert pass; a prefix evicted
    after one pass is deleted, so it can never be a host hit."""
    h = host("write_through_selective")
    assert h.on_insert_pass("A", 64) is False
    assert h.on_device_evict("A") is False and h.state("A") is NodeState.DEVICE and "A" not in h.nodes
    assert h.on_insert_pass("B", 64) is False and h.on_insert_pass("B", 64) is True


def test_h3_write_back_backs_up_at_device_eviction():
    h = host("write_back")
    assert h.on_insert_pass("A", 64) is False and h.used == 0
    assert h.on_device_evict("A") is True and h.state("A") is NodeState.HOST and h.used == 64


def test_a_full_host_pool_evicts_host_only_leaves_then_gives_up():
    """A backup evicts host-only leaves, oldest first, for room; with none, it is not made."""
    h = host("write_through", tokens=128)
    h.on_insert_pass("A", 64)
    h.on_insert_pass("B", 64)
    h.on_device_evict("A")
    assert h.on_insert_pass("C", 64, host_victims=lambda: ["A"]) is True
    assert "A" not in h.nodes and h.used == 128
    assert h.on_insert_pass("D", 20) is False and h.failed_backups == 1   # B, C are on the device
    assert h.on_device_evict("D") is False                                 # unbacked: deleted


def test_pages_round_up_host_usage():
    h = host("write_through", tokens=64, page=16)
    h.on_insert_pass("A", 17)
    assert h.used == 32


def test_h5_load_back_is_all_or_nothing_from_ten_tokens():
    h = host()
    assert h.load_back(9) is False and h.load_back(10) is True
    assert h.load_back(48, mem_quota=40) is False and h.load_back(48, mem_quota=60, delta=12) is True
    h.on_insert_pass("A", 48)
    h.on_device_evict("A")
    h.loaded(["A"])
    assert h.state("A") is NodeState.BOTH


def test_split_inherits_state_and_hit_count():
    h = host("write_through_selective")
    h.on_insert_pass("A", 64)
    h.on_split("A48", "A", 48)
    assert h.nodes["A48"].hit_count == 1 and h.nodes["A"].tokens == 16
    assert h.on_insert_pass("A48", 48) is True


def test_the_cached_prefix_split():
    """H1's request 3: 48 cached, all from host; H4: all on device."""
    assert split_cached_prefix(48, 48) == (0, 48)
    assert split_cached_prefix(48, 0) == (48, 0)
    assert split_cached_prefix(30, 21) == (9, 21)


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="write-policy"):
        HiCacheSettings(host_tokens=32, write_policy="write_around")
    with pytest.raises(ConfigError):
        HiCacheSettings(host_tokens=30, page_size=16)
