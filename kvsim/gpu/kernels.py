"""Triton kernels for a paged prefill: attention of the new tokens over cached KV pages plus
themselves, and the write of the new tokens' K/V into their pages.

Layouts (one layer): ``q [n, Hq, D]``, ``k_new/v_new [n, Hkv, D]`` for the ``n`` new
tokens, ``k_cache/v_cache [num_pages, page_size, Hkv, D]`` (vLLM's flash-attention
layout), ``block_table [>= ceil(total/page_size)]`` int32 physical page ids in token order.
Token ``p`` of the request lives at ``(block_table[p // page_size], p % page_size)``, so
pages may sit anywhere in the pool in any order, and any page size works (1, 16, 32, 64).

The same kernel source runs compiled on CUDA tensors and under Triton's interpreter on CPU
tensors. Triton decides once per process, when ``triton`` is first imported, whether it
interprets (``TRITON_INTERPRET=1``); this module sets that variable before importing triton
when no CUDA device is present, so on a CPU-only machine importing it is enough. A process
that wants the interpreter on a GPU machine must set ``TRITON_INTERPRET=1`` itself, before
anything imports triton.
"""
from __future__ import annotations

import math
import os
import sys

import torch

if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton
import triton.language as tl


@triton.jit
def _attend(q, k, v, keep, m_i, l_i, acc, qk_scale, p_dtype: tl.constexpr, DOT_FP32: tl.constexpr,
            PRECISION: tl.constexpr):
    """One online-softmax step: the keys ``k`` [D, N] and values ``v`` [N, D] that ``keep``
    allows, folded into the running row max ``m_i``, sum ``l_i`` and output ``acc`` (fp32;
    base-2 exponents, ``qk_scale`` includes log2(e)). Returns the new (m_i, l_i, acc)."""
    if DOT_FP32:
        k = k.to(tl.float32)
    qk = tl.dot(q, k, input_precision=PRECISION) * qk_scale
    qk = tl.where(keep, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(qk - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    p = p.to(p_dtype)
    if DOT_FP32:
        p = p.to(tl.float32)
        v = v.to(tl.float32)
    acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["cached_len", "new_len", "page_size", "group"])
def _prefill_attention_kernel(
    Q, K_new, V_new, K_cache, V_cache, Out, BlockTable,
    cached_len, new_len, qk_scale, page_size, group,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcp, stride_kco, stride_kch, stride_vcp, stride_vco, stride_vch,
    stride_ot, stride_oh,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, DOT_FP32: tl.constexpr, PRECISION: tl.constexpr,
):
    """One program: BLOCK_M new-token queries of one query head (online softmax, fp32 state)."""
    pid_m = tl.program_id(0)
    head = tl.program_id(1)
    kv_head = head // group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    m_valid = offs_m < new_len
    d_valid = offs_d < HEAD_DIM
    q = tl.load(Q + offs_m[:, None] * stride_qt + head * stride_qh + offs_d[None, :],
                mask=m_valid[:, None] & d_valid[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # 1) the cached prefix, through the block table: every query sees every cached token.
    for start_n in range(0, cached_len, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_valid = offs_n < cached_len
        page = tl.load(BlockTable + offs_n // page_size, mask=n_valid, other=0).to(tl.int64)
        slot = (offs_n % page_size).to(tl.int64)
        k = tl.load(K_cache + page[None, :] * stride_kcp + slot[None, :] * stride_kco
                    + kv_head * stride_kch + offs_d[:, None],
                    mask=n_valid[None, :] & d_valid[:, None], other=0.0)
        v = tl.load(V_cache + page[:, None] * stride_vcp + slot[:, None] * stride_vco
                    + kv_head * stride_vch + offs_d[None, :],
                    mask=n_valid[:, None] & d_valid[None, :], other=0.0)
        m_i, l_i, acc = _attend(q, k, v, n_valid[None, :], m_i, l_i, acc, qk_scale,
                                V_cache.dtype.element_ty, DOT_FP32, PRECISION)

    # 2) the new tokens themselves, causally (new token i sees new tokens 0..i).
    end_n = tl.minimum(new_len, (pid_m + 1) * BLOCK_M)
    for start_n in range(0, end_n, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        n_valid = offs_n < new_len
        k = tl.load(K_new + offs_n[None, :] * stride_kt + kv_head * stride_kh + offs_d[:, None],
                    mask=n_valid[None, :] & d_valid[:, None], other=0.0)
        v = tl.load(V_new + offs_n[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                    mask=n_valid[:, None] & d_valid[None, :], other=0.0)
        keep = n_valid[None, :] & (offs_m[:, None] >= offs_n[None, :])
        m_i, l_i, acc = _attend(q, k, v, keep, m_i, l_i, acc, qk_scale, V_cache.dtype.element_ty,
                                DOT_FP32, PRECISION)

    l_i = tl.where(l_i == 0.0, 1.0, l_i)  # rows past new_len only; never stored
    out = acc / l_i[:, None]
    tl.store(Out + offs_m[:, None] * stride_ot + head * stride_oh + offs_d[None, :],
             out.to(Out.dtype.element_ty), mask=m_valid[:, None] & d_valid[None, :])


@triton.jit(do_not_specialize=["start_pos", "num_tokens", "page_size"])
def _write_kv_kernel(
    K_new, V_new, K_cache, V_cache, BlockTable, start_pos, num_tokens, page_size,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcp, stride_kco, stride_kch, stride_vcp, stride_vco, stride_vch,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """One program: BLOCK_T new tokens of one KV head, stored at their (page, slot)."""
    pid_t = tl.program_id(0)
    head = tl.program_id(1)
    offs_t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, BLOCK_D)
    t_valid = offs_t < num_tokens
    mask = t_valid[:, None] & (offs_d < HEAD_DIM)[None, :]
    pos = start_pos + offs_t
    page = tl.load(BlockTable + pos // page_size, mask=t_valid, other=0).to(tl.int64)
    slot = (pos % page_size).to(tl.int64)
    k = tl.load(K_new + offs_t[:, None] * stride_kt + head * stride_kh + offs_d[None, :], mask=mask)
    v = tl.load(V_new + offs_t[:, None] * stride_vt + head * stride_vh + offs_d[None, :], mask=mask)
    tl.store(K_cache + page[:, None] * stride_kcp + slot[:, None] * stride_kco + head * stride_kch
             + offs_d[None, :], k, mask=mask)
    tl.store(V_cache + page[:, None] * stride_vcp + slot[:, None] * stride_vco + head * stride_vch
             + offs_d[None, :], v, mask=mask)


def interpreting() -> bool:
    """Whether this process's kernels were built for Triton's interpreter (CPU tensors)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_prefill_attention_kernel, InterpretedFunction)


def _kernel(kernel, t: torch.Tensor):
    """The kernel to launch for tensors on ``t``'s device, or a clear error."""
    if t.device.type != "cuda" and not interpreting():
        raise RuntimeError("Triton kernels on CPU tensors need the interpreter: set TRITON_INTERPRET=1 "
                           "before triton is first imported (or use the torch reference)")
    return kernel


def _check_layout(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                  k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor) -> None:
    if q.dim() != 3 or k_new.dim() != 3 or k_cache.dim() != 4:
        raise ValueError("expected q [n,Hq,D], k_new/v_new [n,Hkv,D], k_cache/v_cache [pages,P,Hkv,D]")
    if k_new.shape != v_new.shape or k_cache.shape != v_cache.shape:
        raise ValueError("K and V shapes differ")
    if k_new.shape[0] != q.shape[0] or k_new.shape[2] != q.shape[2] or k_cache.shape[2:] != k_new.shape[1:]:
        raise ValueError(f"inconsistent shapes q {tuple(q.shape)}, k_new {tuple(k_new.shape)}, "
                         f"k_cache {tuple(k_cache.shape)}")
    if q.shape[1] % k_new.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads are not a multiple of {k_new.shape[1]} KV heads")
    for t in (q, k_new, v_new, k_cache, v_cache):
        if t.stride(-1) != 1:
            raise ValueError("the head dimension must be contiguous")
    if block_table.dtype != torch.int32 or block_table.dim() != 1:
        raise ValueError("block_table must be a 1-D int32 tensor")


def _dot_fp32(t: torch.Tensor) -> bool:
    # Triton 3.9's interpreter multiplies bf16 tl.dot operands as raw uint16 bits (numpy has
    # no bf16), so under the interpreter bf16 operands are widened to fp32 right before each
    # dot: the same bf16-rounded values the GPU's tensor cores multiply, with fp32 products.
    return t.dtype == torch.bfloat16 and t.device.type != "cuda"


# fp32 inputs: full-precision products ("ieee"), not TF32, so fp32 runs compare at fp32
# tolerance; 16-bit inputs ignore the setting.


def _blocks(device: torch.device, head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps): 64x64 tiles on a GPU, 32x32 for the interpreter."""
    if device.type == "cuda":
        return 64, 64, 4 if head_dim <= 64 else 8
    return 32, 32, 1


def prefill_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                      k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                      cached_len: int, sm_scale: float | None = None,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of ``n`` new tokens over ``cached_len`` paged tokens plus themselves.

    Query ``i`` (absolute position ``cached_len + i``) attends to cached positions
    ``0..cached_len-1`` read through ``block_table`` and to new tokens ``0..i``. Grouped-query
    attention: query head ``h`` uses KV head ``h // (Hq // Hkv)``. Inputs fp16/bf16/fp32;
    scores, softmax and the accumulator are fp32. Returns ``[n, Hq, D]`` in ``q``'s dtype.
    """
    _check_layout(q, k_new, v_new, k_cache, v_cache, block_table)
    n, hq, d = q.shape
    page_size = k_cache.shape[1]
    if block_table.numel() * page_size < cached_len:
        raise ValueError(f"block table covers {block_table.numel() * page_size} tokens, "
                         f"fewer than the {cached_len} cached")
    if out is None:
        out = torch.empty_like(q)
    if n == 0:
        return out
    scale = (1.0 / math.sqrt(d)) if sm_scale is None else sm_scale
    block_m, block_n, warps = _blocks(q.device, d)
    grid = (triton.cdiv(n, block_m), hq)
    kernel = _kernel(_prefill_attention_kernel, q)
    kernel[grid](
        q, k_new, v_new, k_cache, v_cache, out, block_table,
        int(cached_len), n, scale * 1.4426950408889634,  # log2(e): the kernel uses exp2
        page_size, hq // k_new.shape[1],
        q.stride(0), q.stride(1), k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        out.stride(0), out.stride(1),
        HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_M=block_m, BLOCK_N=block_n,
        DOT_FP32=_dot_fp32(q), PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=warps, num_stages=2,
    )
    return out


def write_kv(k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             block_table: torch.Tensor, start_pos: int) -> None:
    """Store the K/V of tokens at positions ``start_pos..start_pos+n-1`` into their pages."""
    _check_layout(k_new, k_new, v_new, k_cache, v_cache, block_table)
    n, hkv, d = k_new.shape
    page_size = k_cache.shape[1]
    if block_table.numel() * page_size < start_pos + n:
        raise ValueError(f"block table covers {block_table.numel() * page_size} tokens, "
                         f"fewer than the {start_pos + n} to write")
    if n == 0:
        return
    block_t = 64 if k_new.device.type == "cuda" else 32
    kernel = _kernel(_write_kv_kernel, k_new)
    kernel[(triton.cdiv(n, block_t), hkv)](
        k_new, v_new, k_cache, v_cache, block_table, int(start_pos), n, page_size,
        k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_T=block_t,
        num_warps=4 if k_new.device.type == "cuda" else 1,
    )
