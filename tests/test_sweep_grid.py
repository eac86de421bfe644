"""Sweep grid: parsing the option lists and expanding combinations."""
from __future__ import annotations

import math

import pytest

from kvsim.errors import ConfigError
from kvsim.models import get_model
from kvsim.sweep.grid import (
    expand_grid,
    parse_capacities,
    parse_capacity,
    parse_eviction_policies,
    parse_ints,
    parse_policies,
)


def test_capacity_tokens_inf_and_memory():
    """Tokens in any float spelling, 'inf' as unlimited, memory sizes only with a model."""
    assert parse_capacity("1e5").tokens == 100000.0
    assert parse_capacity("250000").tokens == 250000.0
    assert math.isinf(parse_capacity("inf").tokens)
    assert math.isinf(parse_capacity("Infinity").tokens)
    cap = parse_capacity("20GiB", model="llama-3-8b")
    assert cap.memory_bytes == 20 * 1024**3 and cap.tokens is None
    assert cap.options() == {"kv_cache_memory": 20 * 1024**3}
    with pytest.raises(ConfigError, match="--model"):
        parse_capacity("20GiB")


@pytest.mark.parametrize("bad", ["abc", "0", "-5", "nan", "0.5", "1e5x", ""])
def test_bad_capacities_are_config_errors(bad):
    with pytest.raises(ConfigError):
        parse_capacities(bad)


def test_capacity_list_keeps_order_and_drops_duplicates():
    caps = parse_capacities("1e6, 1e4,1000000,inf")
    assert [c.label for c in caps] == ["1e6", "1e4", "inf"]


def test_int_lists_and_policies():
    assert parse_ints("16, 32,16", "--block-size") == [16, 32]
    for bad in ("0", "16,x", "1.5", ","):
        with pytest.raises(ConfigError):
            parse_ints(bad, "--block-size")
    assert parse_eviction_policies("LRU,lfu,lru") == ["lru", "lfu"]
    with pytest.raises(ConfigError, match="unknown eviction policy"):
        parse_eviction_policies("lru,random")
    assert parse_policies("apc") == ["apc"]
    with pytest.raises(ConfigError):
        parse_policies("apc,belady")


def test_expansion_never_multiplies_by_ignored_settings():
    """APC rows vary only the block size, radix rows only page size x eviction policy."""
    caps = parse_capacities("1e4,1e5,inf")
    pts = expand_grid(["apc", "radix"], caps, block_sizes=[16, 32], page_sizes=[1, 16],
                      eviction_policies=["lru", "fifo"])
    apc = [p for p in pts if p.policy == "apc"]
    radix = [p for p in pts if p.policy == "radix"]
    assert len(apc) == 2 * 3 and len(radix) == 2 * 2 * 3
    assert {(p.page_size, p.eviction_policy) for p in apc} == {(None, None)}
    assert {p.block_size for p in radix} == {None}
    assert [p.index for p in pts] == list(range(len(pts)))
    # fixed order: policy, its settings, then capacity
    assert [(p.block_size, p.capacity.label) for p in apc] == [
        (16, "1e4"), (16, "1e5"), (16, "inf"), (32, "1e4"), (32, "1e5"), (32, "inf")]
    assert [(p.page_size, p.eviction_policy) for p in radix[:4]] == [(1, "lru")] * 3 + [(1, "fifo")]


def test_point_options_carry_the_capacity_and_shared_settings():
    caps = parse_capacities("1e5,8GiB", model="llama-3-8b")
    pts = expand_grid(["apc"], caps, block_sizes=[32], base={"model": "llama-3-8b", "capacity_tokens": 5})
    o0, o1 = pts[0].options(), pts[1].options()
    assert (o0.capacity_tokens, o0.block_size, o0.model) == (100000.0, 32, "llama-3-8b")
    assert o1.capacity_tokens is None and o1.kv_cache_memory == 8 * 1024**3
    # the engine's own conversion: 8 GiB / (128 KiB per token * 32) blocks
    per_token = get_model("llama-3-8b").kv_bytes_per_token()
    from kvsim.models import apc_num_gpu_blocks

    assert apc_num_gpu_blocks(o1) == 8 * 1024**3 // (per_token * 32)


def test_empty_capacity_list_is_an_error():
    with pytest.raises(ConfigError):
        expand_grid(["apc"], [])
