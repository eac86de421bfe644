"""Block hashing: vLLM's exact sha256 / sha256_cbor bytes, extra keys, and the fast 64-bit hash."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from kvsim.engines.vllm import hash_kernels

from kvsim.engines.vllm import hashing
from kvsim.errors import ConfigError

# Golden vectors from vLLM 0.33.0 itself (get_request_block_hasher, block size 4, tokens
# 0..9, NONE_HASH from the default seed): with LoRARequest("my-adapter", 1,
# "/models/my-adapter") and cache_salt "tenant-a", and plain. The oracle tests compare
# thousands more against the live code.
GOLDEN = {
    "sha256": (["e73c82d363d913001c6469706a083e0ed3c516a715004b3a633c551f6915e833",
                "a0c569a208447d5f3fe309dbefaf27315f13d9e178034e34033e1ce4a87b912e"],
               ["9da1c53089c000ad1a79a77c143b68dda00e2a85315bc1f690bbd03ba4a195dd",
                "1c9b6c0620e875631f1c5395ed56f2243aa113f88fc842f04fbb0654074b8d43"]),
    "sha256_cbor": (["bf758e76c5da240988c803d6a6d4e3652d4c94319f7b0a8fe084acda50f24714",
                     "2c7e1f2e8472060ee6394f145ecf57828cb02a06a1af1c5bdc988317ed8085fb"],
                    ["c49ab11fb576db6f376aef58c24f728a0ba1807e8cac5f940f1a5c4c20741898",
                     "9d0a7c928c548f9aeea31ae98471cf515045a206851732ac14cb3083c18d40f9"]),
}


@pytest.fixture(autouse=True)
def _no_hash_seed(monkeypatch):
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)


@pytest.mark.parametrize("algo", ["sha256", "sha256_cbor"])
def test_exact_hashes_equal_vllm_golden_vectors(algo):
    """Full blocks only (10 tokens, B=4: two hashes), LoRA name+path and salt as vLLM 0.33 keys them."""
    with_ns, plain = GOLDEN[algo]
    got = hashing.exact_block_hashes(range(10), 4, algo, ("my-adapter", "/models/my-adapter"), "tenant-a")
    assert [h.hex() for h in got] == with_ns
    assert [h.hex() for h in hashing.exact_block_hashes(list(range(10)), 4, algo)] == plain


def test_exact_hashes_extend_from_a_parent():
    """Hashing appended blocks from the last hash gives the same chain (vLLM's incremental hasher)."""
    tokens = list(range(40))
    full = hashing.exact_block_hashes(tokens, 8, "sha256", cache_salt="s")
    head = hashing.exact_block_hashes(tokens[:16], 8, "sha256", cache_salt="s")
    tail = hashing.exact_block_hashes(tokens, 8, "sha256", cache_salt="s", start_block=2, parent=head[-1])
    assert head + tail == full
    assert hashing.exact_block_hashes(np.array(tokens, np.int32), 8, "sha256", cache_salt="s") == full


def test_none_hash_seed_follows_pythonhashseed(monkeypatch):
    """NONE_HASH = H("vllm-none-hash") unless PYTHONHASHSEED is set (0.33 init_none_hash)."""
    default = hashing.none_hash("sha256")
    assert default == hashing.sha256_pickle("vllm-none-hash")
    monkeypatch.setenv("PYTHONHASHSEED", "42")
    assert hashing.none_hash("sha256") == hashing.sha256_pickle("42") != default
    assert hashing.exact_block_hashes(range(8), 8, "sha256") != hashing.exact_block_hashes(
        range(8), 8, "sha256", seed=hashing.DEFAULT_NONE_HASH_SEED)


def test_extra_keys_order_and_scope():
    """LoRA on every block, mm items overlapping the block, salt on block 0 only (docs/engines/apc.md §1.3, 0.33 form)."""
    lora = ("a", "/p/a")
    assert hashing.extra_keys(0, 16, lora, "salt") == (("lora", "a", "/p/a"), ("cache_salt", "salt"))
    assert hashing.extra_keys(16, 32, lora, "salt") == (("lora", "a", "/p/a"),)
    assert hashing.extra_keys(16, 32, None, "salt") is None
    assert hashing.extra_keys(0, 16, None, "") is None  # an empty salt is no salt
    mm = [(0, 5, "hash1"), (10, 5, "hash2")]
    assert hashing.extra_keys(0, 5, mm_items=mm) == (("mm", "hash1", 0),)
    assert hashing.extra_keys(3, 8, mm_items=mm) == (("mm", "hash1", -3),)
    assert hashing.extra_keys(6, 10, mm_items=mm) is None
    assert hashing.extra_keys(0, 15, mm_items=mm) == (("mm", "hash1", 0), ("mm", "hash2", 10))
    assert hashing.extra_keys(0, 1, cache_salt="salt") == (("cache_salt", "salt"),)
    assert hashing.extra_keys(1, 2, cache_salt="salt") is None
    assert hashing.extra_keys(0, 5, None, "salt", [(0, 5, "hash1")]) == (("mm", "hash1", 0), ("cache_salt", "salt"))


def _fresh(text: str) -> str:
    return "".join(list(text))  # a new string object with the same value


def test_extra_key_strings_are_distinct_objects_for_pickle():
    """pickle back-references a repeated string object; vLLM's decoded name and path are two objects."""
    name = "adapter"
    keys = hashing.extra_keys(0, 4, (name, name))
    assert keys[0][1] == keys[0][2] and keys[0][1] is not keys[0][2]
    assert pickle.dumps(keys) == pickle.dumps((("lora", "adapter", _fresh("adapter")),))


def test_namespaces_change_every_block_hash():
    """A salt (block 0 only) or an adapter (every block) changes the whole chain: nothing is shared."""
    tokens = list(range(64))
    plain = hashing.exact_block_hashes(tokens, 16, "sha256")
    salted = hashing.exact_block_hashes(tokens, 16, "sha256", cache_salt="t1")
    other = hashing.exact_block_hashes(tokens, 16, "sha256", cache_salt="t2")
    lora = hashing.exact_block_hashes(tokens, 16, "sha256", lora=("x", "x"))
    for a, b in [(plain, salted), (salted, other), (plain, lora)]:
        assert all(x != y for x, y in zip(a, b))


def test_unknown_algorithm_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown hash algorithm"):
        hashing.check_algo("md5")
    with pytest.raises(ConfigError):
        hashing.hash_function("fast")


def _py_chain(tokens, B, every, first):
    out, parent = [], hashing.FAST_ROOT
    for j in range(len(tokens) // B):
        parent = hashing.fast_block_hash_py(parent, tokens[j * B:(j + 1) * B], every, first if j == 0 else 0)
        out.append(parent)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_compiled_fast_hash_follows_its_python_definition(seed):
    rng = np.random.default_rng(seed)
    B = int(rng.choice([1, 3, 16]))
    tokens = rng.integers(-(2**40), 2**40, 70).tolist()
    every, first = hashing.namespace_key("lora", "a", "a"), hashing.namespace_key("cache_salt", "s")
    out = np.zeros(len(tokens) // B, np.uint64)
    hash_kernels.fast_hash_sequence(np.array(tokens, np.int64), 0, len(out), B, np.uint64(hashing.FAST_ROOT),
                               np.uint64(every), np.uint64(first), out)
    assert [int(h) for h in out] == _py_chain(tokens, B, every, first)


def test_fast_hash_of_many_requests_spans_prompt_and_output():
    """Request i hashes prompt_i + output_i; each request restarts the chain."""
    prompts = [[1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9], []]
    outputs = [[-1, -2, -3, -4], [-5], [-6, -7]]
    p_off = np.cumsum([0] + [len(p) for p in prompts])
    o_off = np.cumsum([0] + [len(o) for o in outputs])
    nblocks = np.array([2, 2, 0])
    off = np.concatenate([[0], np.cumsum(nblocks)])
    every = np.array([0, 7, 0], np.uint64)
    first = np.array([0, 0, 9], np.uint64)
    out = np.zeros(off[-1], np.uint64)
    hashing.fast_hash_requests(np.concatenate(prompts).astype(np.int32), p_off, np.concatenate(outputs),
                               o_off, nblocks, 4, every, first, off, out)
    assert [int(h) for h in out[:2]] == _py_chain([1, 2, 3, 4, 5, -1, -2, -3], 4, 0, 0)
    assert [int(h) for h in out[2:]] == _py_chain([1, 2, 3, 4, 5, 6, 7, 8], 4, 7, 0)
    assert out[0] != out[2]  # same tokens, different adapter


def test_fast_hash_is_prefix_chained():
    """Equal hash at block i iff equal tokens (and keys) in blocks 0..i."""
    a = list(range(64))
    b = a[:]
    b[40] = -1
    ha, hb = _py_chain(a, 16, 0, 0), _py_chain(b, 16, 0, 0)
    assert ha[:2] == hb[:2] and ha[2] != hb[2] and ha[3] != hb[3]
    assert 0 not in ha


def test_few_blocks_hash_in_python_as_the_kernel_does():
    """hashing.fast_hash_sequence hashes a short sequence without compiled code (a command on a
    tiny log starts without numba): the same keys as the kernel."""
    rng = np.random.default_rng(11)
    tokens = rng.integers(0, 2**31, 96)
    every, first = hashing.namespace_key("lora", "a", "a"), hashing.namespace_key("cache_salt", "s")
    for start in (0, 2):
        a, b = np.zeros(4, np.uint64), np.zeros(4, np.uint64)
        args = (start, 4, 16, np.uint64(hashing.FAST_ROOT), np.uint64(every), np.uint64(first))
        hash_kernels.fast_hash_sequence(tokens, *args, a)
        saved = dict(__import__("sys").modules)
        try:  # as if the kernels were not loaded yet
            __import__("sys").modules.pop("kvsim.engines.vllm.hash_kernels")
            hashing.fast_hash_sequence(tokens, *args, b)
        finally:
            __import__("sys").modules.update(saved)
        assert a.tolist() == b.tolist()
