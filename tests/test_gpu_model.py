"""The random-weight Llama decoder: a prefill after a cached prefix equals a full prefill."""
from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (kernels on CPU tensors)
torch = pytest.importorskip("torch", reason="gpu extra not installed (pip install 'kvsim[gpu]')")

from kvsim.gpu.configs import CONFIGS, get_config
from kvsim.gpu.llama import LlamaModel
from kvsim.gpu.validate import TOLERANCE, rel_err


def prefill_pair(model: LlamaModel, tokens: np.ndarray, cached: int, page: int, rope_offset=None):
    """(reuse logits, full logits, reuse pool K/V, full pool K/V) for one prompt."""
    L = len(tokens)
    pages = -(-L // page)
    g = torch.Generator().manual_seed(L + cached)
    table = torch.randperm(pages + 3, generator=g)[:pages].to(torch.int32)   # shuffled pages
    pool = model.new_cache(pages + 3, page)
    if cached:
        model.prefill(tokens[:cached], 0, pool, table)                        # an earlier request
    reuse = model.prefill(tokens[cached:], cached, pool, table, rope_offset=rope_offset)
    ref_pool = model.new_cache(pages, page)
    ref_table = torch.arange(pages, dtype=torch.int32)
    full = model.prefill(tokens, 0, ref_pool, ref_table)
    return reuse, full, pool.read(table, 0, L), ref_pool.read(ref_table, 0, L)


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize("cached", [0, 37, 64])
def test_reuse_equals_full_prefill(page, cached):
    """Logits and every layer's K/V agree (fp32) whether the prefix is recomputed or read from pages."""
    model = LlamaModel(get_config("tiny"), seed=1)
    tokens = np.random.default_rng(cached + page).integers(0, 100_000, 97)
    reuse, full, (k, v), (kf, vf) = prefill_pair(model, tokens, cached, page)
    assert rel_err(reuse, full) < TOLERANCE["float32"]
    assert rel_err(k, kf) < TOLERANCE["float32"] and rel_err(v, vf) < TOLERANCE["float32"]


def test_reuse_equals_full_prefill_bf16():
    """In bf16 the agreement holds within the bf16 tolerance."""
    model = LlamaModel(get_config("tiny"), dtype=torch.bfloat16, seed=2)
    tokens = np.random.default_rng(5).integers(0, 100_000, 120)
    reuse, full, (k, v), (kf, vf) = prefill_pair(model, tokens, 64, 16)
    assert rel_err(reuse, full) < TOLERANCE["bfloat16"]
    assert rel_err(k, kf) < TOLERANCE["bfloat16"] and rel_err(v, vf) < TOLERANCE["bfloat16"]


def test_rope_positions_start_after_the_prefix():
    """Rotating the new tokens as if they started at 0 (the classic reuse bug) breaks the agreement by far."""
    model = LlamaModel(get_config("tiny"), seed=1)
    tokens = np.random.default_rng(9).integers(0, 100_000, 97)
    reuse, full, *_ = prefill_pair(model, tokens, 64, 16, rope_offset=0)
    assert rel_err(reuse, full) > 1000 * TOLERANCE["float32"]


def test_logits_depend_on_the_cached_kv():
    """Changing one cached token (its K/V) changes the last logits far beyond tolerance: the check has power."""
    model = LlamaModel(get_config("tiny"), seed=1)
    tokens = np.random.default_rng(10).integers(0, 100_000, 97)
    _, full, *_ = prefill_pair(model, tokens, 0, 16)
    other = tokens.copy()
    other[3] += 1
    _, changed, *_ = prefill_pair(model, other, 0, 16)
    assert rel_err(changed, full) > 1000 * TOLERANCE["float32"]


def test_triton_kernels_match_torch_path():
    """The model through the Triton kernels (interpreter) equals the torch-reference model."""
    pytest.importorskip("triton", reason="gpu extra not installed (pip install 'kvsim[gpu]')")
    from kvsim.gpu import kernels

    if not kernels.interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set")
    tokens = np.random.default_rng(3).integers(0, 100_000, 70)
    results = []
    for attention in ("torch", "triton"):
        model = LlamaModel(get_config("tiny"), seed=4, attention=attention)
        reuse, full, (k, _), _ = prefill_pair(model, tokens, 32, 16)
        results.append((reuse, full, k))
    assert rel_err(results[1][0], results[0][0]) < TOLERANCE["float32"]
    assert rel_err(results[1][1], results[0][1]) < TOLERANCE["float32"]
    assert rel_err(results[1][2], results[0][2]) < TOLERANCE["float32"]


def test_weights_are_seeded():
    """The same seed gives the same model; another seed another."""
    tokens = np.arange(20)
    logits = []
    for seed in (0, 0, 1):
        m = LlamaModel(get_config("tiny"), seed=seed)
        pool = m.new_cache(2, 16)
        logits.append(m.prefill(tokens, 0, pool, torch.arange(2, dtype=torch.int32)))
    assert torch.equal(logits[0], logits[1])
    assert not torch.equal(logits[0], logits[2])


def test_config_shapes():
    """The 8B shape matches Llama-3-8B's published size (8.03e9 parameters) and GQA layout."""
    c = CONFIGS["llama-3-8b-shape"]
    assert abs(c.params - 8.03e9) / 8.03e9 < 0.005
    assert c.num_heads // c.num_kv_heads == 4 and c.head_dim * c.num_heads == c.hidden_size
    assert c.kv_elements_per_token() * 2 == 131072   # 128 KiB of bf16 KV per token
