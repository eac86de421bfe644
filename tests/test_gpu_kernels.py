"""The Triton paged-prefill kernels under Triton's interpreter (CPU tensors), against the torch
reference and dense causal attention: block sizes, GQA ratios, prefix lengths, page orders,
dtypes, poisoned outputs and pools."""
from __future__ import annotations

import os

import pytest

# Triton chooses interpreter or compiler once, when it is first imported: set it first.
os.environ.setdefault("TRITON_INTERPRET", "1")
torch = pytest.importorskip("torch", reason="gpu extra not installed (pip install 'kvsim[gpu]')")
pytest.importorskip("triton", reason="gpu extra not installed (pip install 'kvsim[gpu]')")

from kvsim.gpu import kernels
from kvsim.gpu.reference import (
    dense_causal_attention,
    gather_kv,
    prefill_attention_ref,
    write_kv_ref,
)

if not kernels.interpreting():
    pytest.skip("triton was imported before TRITON_INTERPRET=1 was set; run this file on its own",
                allow_module_level=True)

HEAD_DIM = 16
NUM_HEADS = 8
NEW_TOKENS = 40
# Relative L2 error vs an fp32 computation on the same inputs: about one rounding of the
# output (and of the softmax weights before the PV product) in the dtype.
TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def prefix_lengths(page: int) -> dict[str, int]:
    return {"none": 0, "partial": 2 * page + 5 if page > 1 else 37, "aligned": 3 * page if page > 1 else 48}


def setup(page: int, kv_heads: int, cached: int, dtype: torch.dtype, seed: int):
    """A NaN-poisoned pool with the prefix written at shuffled pages, and fresh q/k/v."""
    g = torch.Generator().manual_seed(seed)
    total = cached + NEW_TOKENS
    used = -(-total // page)
    num_pages = used + 5
    k_cache = torch.full((num_pages, page, kv_heads, HEAD_DIM), float("nan"), dtype=dtype)
    v_cache = k_cache.clone()
    table = torch.randperm(num_pages, generator=g)[:used].to(torch.int32)
    k = torch.randn(total, kv_heads, HEAD_DIM, generator=g).to(dtype)
    v = torch.randn(total, kv_heads, HEAD_DIM, generator=g).to(dtype)
    q = torch.randn(total, NUM_HEADS, HEAD_DIM, generator=g).to(dtype)
    write_kv_ref(k[:cached], v[:cached], k_cache, v_cache, table, 0)
    return q, k, v, k_cache, v_cache, table


CASES = [(page, group, prefix, dtype)
         for page in (1, 16, 32, 64)
         for group in (1, 4, 8)
         for prefix in ("none", "partial", "aligned")
         for dtype in (torch.float16, torch.bfloat16)]


@pytest.mark.parametrize("page,group,prefix,dtype", CASES,
                         ids=[f"P{p}-gqa{g}-{x}-{str(d)[6:]}" for p, g, x, d in CASES])
def test_attention_matches_reference_and_dense(page, group, prefix, dtype):
    """New tokens attend to shuffled cached pages plus themselves, as the reference and dense causal attention do."""
    cached = prefix_lengths(page)[prefix]
    seed = CASES.index((page, group, prefix, dtype))        # fresh inputs per case, reproducible
    q, k, v, k_cache, v_cache, table = setup(page, NUM_HEADS // group, cached, dtype, seed)
    out = torch.full((NEW_TOKENS, NUM_HEADS, HEAD_DIM), float("nan"), dtype=dtype)  # poisoned
    kernels.prefill_attention(q[cached:], k[cached:], v[cached:], k_cache, v_cache, table, cached, out=out)
    assert torch.isfinite(out.float()).all(), "an output element was not written (or a poisoned slot was read)"
    ref = prefill_attention_ref(q[cached:], k[cached:], v[cached:], k_cache, v_cache, table, cached)
    dense = dense_causal_attention(q, k, v)[cached:]
    # the reference and the dense oracle must agree with each other, and the kernel with both
    assert rel(ref, dense) < TOL[dtype]
    assert rel(out, ref) < TOL[dtype]
    assert rel(out, dense) < TOL[dtype]


def test_attention_fp32_is_exact_to_rounding():
    """In fp32 the kernel equals dense causal attention to float rounding (no hidden approximations)."""
    q, k, v, k_cache, v_cache, table = setup(16, 2, 37, torch.float32, 7)
    out = kernels.prefill_attention(q[37:], k[37:], v[37:], k_cache, v_cache, table, 37)
    assert rel(out, dense_causal_attention(q, k, v)[37:]) < TOL[torch.float32]


def test_attention_uses_the_block_table_not_the_page_order():
    """Moving the cached pages elsewhere in the pool (and updating the table) leaves the output unchanged."""
    q, k, v, k_cache, v_cache, table = setup(16, 2, 48, torch.float16, 11)
    a = kernels.prefill_attention(q[48:], k[48:], v[48:], k_cache, v_cache, table, 48)
    perm = torch.randperm(k_cache.shape[0], generator=torch.Generator().manual_seed(3))
    inverse = torch.argsort(perm)
    moved_k, moved_v = k_cache[perm], v_cache[perm]          # page p now sits at inverse[p]
    b = kernels.prefill_attention(q[48:], k[48:], v[48:], moved_k, moved_v,
                                  inverse[table.long()].to(torch.int32), 48)
    assert torch.equal(a, b)


def test_attention_sees_a_wrong_page():
    """Swapping one cached page for another page's K/V changes the output far beyond tolerance."""
    q, k, v, k_cache, v_cache, table = setup(16, 2, 48, torch.float32, 13)
    good = kernels.prefill_attention(q[48:], k[48:], v[48:], k_cache, v_cache, table, 48)
    wrong = table.clone()
    wrong[0] = table[3]                      # the first cached block names another page, holding other K/V
    g = torch.Generator().manual_seed(14)
    other_k, other_v = torch.randn(2, 16, 2, HEAD_DIM, generator=g)
    write_kv_ref(other_k, other_v, k_cache, v_cache, wrong[:1], 0)
    bad = kernels.prefill_attention(q[48:], k[48:], v[48:], k_cache, v_cache, wrong, 48)
    assert rel(bad, good) > 100 * TOL[torch.float32]


@pytest.mark.parametrize("page", [1, 16, 32, 64])
@pytest.mark.parametrize("start", [0, 5, 64])
def test_write_kv_writes_exactly_its_slots(page, start):
    """K/V of tokens start..start+n-1 land in their (page, offset) slots; every other slot stays untouched (NaN)."""
    g = torch.Generator().manual_seed(page * 100 + start)
    n, kv_heads = 45, 2
    used = -(-(start + n) // page)
    num_pages = used + 4
    k_cache = torch.full((num_pages, page, kv_heads, HEAD_DIM), float("nan"), dtype=torch.bfloat16)
    v_cache = k_cache.clone()
    table = torch.randperm(num_pages, generator=g)[:used].to(torch.int32)
    k = torch.randn(n, kv_heads, HEAD_DIM, generator=g).to(torch.bfloat16)
    v = torch.randn(n, kv_heads, HEAD_DIM, generator=g).to(torch.bfloat16)
    kernels.write_kv(k, v, k_cache, v_cache, table, start)
    got_k, got_v = gather_kv(k_cache, v_cache, table, start, start + n)
    assert torch.equal(got_k, k) and torch.equal(got_v, v)
    written = torch.isfinite(k_cache.float()).all(dim=(-1, -2)).sum().item()
    assert written == n, "the kernel wrote slots it does not own"
    # same result as the reference writer
    k_ref = torch.full_like(k_cache, float("nan"))
    v_ref = torch.full_like(v_cache, float("nan"))
    write_kv_ref(k, v, k_ref, v_ref, table, start)
    assert torch.equal(torch.nan_to_num(k_ref.float()), torch.nan_to_num(k_cache.float()))
    assert torch.equal(torch.nan_to_num(v_ref.float()), torch.nan_to_num(v_cache.float()))


def test_bad_layouts_are_refused():
    """A block table too short for the cached tokens, or heads that do not divide, raise ValueError."""
    q, k, v, k_cache, v_cache, table = setup(16, 2, 48, torch.float16, 1)
    with pytest.raises(ValueError, match="covers"):
        kernels.prefill_attention(q[48:], k[48:], v[48:], k_cache, v_cache, table[:2], 48)
    with pytest.raises(ValueError, match="int32"):
        kernels.prefill_attention(q[48:], k[48:], v[48:], k_cache, v_cache, table.long(), 48)
    with pytest.raises(ValueError, match="multiple"):
        kernels.prefill_attention(q[48:, :3], k[48:], v[48:], k_cache, v_cache, table, 48)
    with pytest.raises(ValueError, match="fewer than"):
        kernels.write_kv(k[:40], v[:40], k_cache, v_cache, table[:1], 0)
