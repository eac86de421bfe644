"""The physical KV pool that a cache model's block tables address.

:class:`PagedKVCache` holds every layer's K and V pages on the device, filled with NaN at
start so that reading a slot nobody wrote poisons the result.
"""
from __future__ import annotations

import torch

from kvsim.gpu.reference import gather_kv


class PagedKVCache:
    """K/V pages of all layers: ``k[layer]`` is ``[num_pages, page_size, kv_heads, head_dim]``."""

    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str, poison: bool = True):
        shape = (num_layers, num_pages, page_size, num_kv_heads, head_dim)
        fill = float("nan") if poison else 0.0
        self.k = torch.full(shape, fill, dtype=dtype, device=device)
        self.v = torch.full(shape, fill, dtype=dtype, device=device)
        self.page_size = page_size
        self.num_pages = num_pages

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[i], self.v[i]

    def read(self, block_table: torch.Tensor, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of token positions ``start..end-1`` in every layer: two ``[layers, T, Hkv, D]``."""
        ks, vs = zip(*(gather_kv(self.k[i], self.v[i], block_table, start, end) for i in range(self.k.shape[0])))
        return torch.stack(ks), torch.stack(vs)

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()
