"""Plain-torch versions of the paged-prefill kernels: gather the pages, mask, softmax.

They compute the same functions as :mod:`kvsim.gpu.kernels` in the most obvious way and
serve twice: as the CPU path of the Llama model and as the oracle the kernels are tested
against. Scores and softmax are fp32 whatever the input dtype.
"""
from __future__ import annotations

import math

import torch


def token_slots(block_table: torch.Tensor, page_size: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(page, offset) of token positions ``start..end-1`` of a request."""
    pos = torch.arange(start, end, device=block_table.device)
    return block_table.long()[pos // page_size], pos % page_size


def gather_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
              start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K/V of positions ``start..end-1`` read from the pages: two ``[end-start, Hkv, D]``."""
    page, off = token_slots(block_table, k_cache.shape[1], start, end)
    return k_cache[page, off], v_cache[page, off]


def write_kv_ref(k_new: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 block_table: torch.Tensor, start_pos: int) -> None:
    """Store new tokens' K/V at positions ``start_pos..`` into their pages (in place)."""
    page, off = token_slots(block_table, k_cache.shape[1], start_pos, start_pos + k_new.shape[0])
    k_cache[page, off] = k_new.to(k_cache.dtype)
    v_cache[page, off] = v_new.to(v_cache.dtype)


def prefill_attention_ref(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                          k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                          cached_len: int, sm_scale: float | None = None) -> torch.Tensor:
    """Reference for :func:`kvsim.gpu.kernels.prefill_attention` (same arguments and result)."""
    n, hq, d = q.shape
    k_pre, v_pre = gather_kv(k_cache, v_cache, block_table, 0, cached_len)
    k = torch.cat([k_pre.to(k_new.dtype), k_new]).float()
    v = torch.cat([v_pre.to(v_new.dtype), v_new]).float()
    group = hq // k.shape[1]
    k = k.repeat_interleave(group, dim=1)            # [c+n, Hq, D]
    v = v.repeat_interleave(group, dim=1)
    scale = (1.0 / math.sqrt(d)) if sm_scale is None else sm_scale
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    q_pos = torch.arange(cached_len, cached_len + n, device=q.device)[:, None]
    k_pos = torch.arange(cached_len + n, device=q.device)[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)


def dense_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention over a whole contiguous sequence ``[T, H, D]`` (fp32 SDPA, GQA expanded).

    An independent oracle: no pages, no block table, torch's own attention.
    """
    group = q.shape[1] // k.shape[1]
    qf = q.float().transpose(0, 1)
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    out = torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, is_causal=True)
    return out.transpose(0, 1).to(q.dtype)
