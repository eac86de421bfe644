"""The compiled key multiset (kvsim.kernels.multiset) against a Counter, and Dynamo's router on it.

The multiset holds Dynamo's active blocks (``kvsim.fleet.routers.dynamo``): a request's
whole key chain is added when it is routed and removed when it finishes, and the cost reads
the number of distinct keys and a request's booked prefix. Random chains that share
prefixes, added and removed in random interleavings (the table grows, removals shift probe
runs back), must leave exactly what a ``Counter`` holds.
"""
from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from kvsim.kernels.multiset import KeyMultiset


def _chains(rng: random.Random, n: int) -> list[np.ndarray]:
    """Prefix-chained keys: a chain extends a random earlier chain's prefix with new keys."""
    chains: list[list[int]] = []
    for _ in range(n):
        base = rng.choice(chains)[:rng.randint(0, 40)] if chains and rng.random() < 0.7 else []
        chains.append(base + [rng.getrandbits(64) or 1 for _ in range(rng.randint(0, 60))])
    return [np.array(c, np.uint64) for c in chains]


@pytest.mark.parametrize("seed", range(6))
def test_multiset_equals_a_counter(seed):
    rng = random.Random(seed)
    chains = _chains(rng, 300)
    ms, ref = KeyMultiset(), Counter()
    held: list[np.ndarray] = []
    for chain in chains:
        ms.add(chain)
        ref.update(chain.tolist())
        held.append(chain)
        while held and rng.random() < 0.45:
            gone = held.pop(rng.randrange(len(held)))
            ms.remove(gone)
            ref.subtract(gone.tolist())
            ref = +ref
        probe = rng.choice(chains)
        booked = 0
        for k in probe.tolist():
            if k not in ref:
                break
            booked += 1
        assert ms.held_prefix(probe) == booked == sum(k in ref for k in probe.tolist())   # a prefix
        assert len(ms) == len(ref)
    assert ms.as_dict() == dict(ref)
    assert all(ms.count(k) == v for k, v in ref.items())
    for chain in held:
        ms.remove(chain)
    assert len(ms) == 0 and ms.as_dict() == {}
    assert len(ms.keys) > 16                # the table grew on the way


def test_a_key_is_held_until_its_last_copy_is_removed():
    ms = KeyMultiset()
    a, b = np.array([5, 6, 7], np.uint64), np.array([5, 6, 9], np.uint64)
    ms.add(a)
    ms.add(b)
    assert (len(ms), ms.count(5), ms.count(7), ms.count(9)) == (4, 2, 1, 1)
    ms.remove(a)
    assert (len(ms), ms.count(5), ms.count(7), 7 in ms, 9 in ms) == (3, 1, 0, False, True)
    assert ms.held_prefix(np.array([5, 6, 7, 8], np.uint64)) == 2


def test_dynamo_python_keys_keep_their_identity_as_uint64():
    """The fed router's Python-hash keys (signed) become distinct nonzero uint64 keys."""
    from kvsim.fleet.keys import block_keys
    from kvsim.fleet.routers.dynamo import as_key_array

    keys = block_keys(np.arange(16 * 50), 16, ("lora", None))
    array = as_key_array(keys)
    assert array.dtype == np.uint64 and (array != 0).all()
    assert len(set(array.tolist())) == len(keys) == 50
    assert [int(k) & (2**64 - 1) for k in keys] == array.tolist()
    assert as_key_array([0, -2**63, 3]).tolist() == [1, 2**63, 3]
