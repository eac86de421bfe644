"""A Llama-architecture decoder with seeded random weights whose prefill runs through a paged
KV cache: RMSNorm, rotary embeddings at absolute positions, grouped-query attention through
the paged-prefill kernel (or its torch reference), SwiGLU MLP.

Random weights are enough for gpu-validate: whether reused KV gives the same logits as
recomputing it, and how long a prefill of a given shape takes, do not depend on what the
weights are. Nothing is downloaded.
"""
from __future__ import annotations

import torch

from kvsim.gpu.configs import LlamaConfig
from kvsim.gpu.paged_cache import PagedKVCache

QK_GAIN = 1.5


class LlamaModel:
    """Prefill-only Llama decoder: ``prefill`` computes new tokens after a cached prefix."""

    def __init__(self, config: LlamaConfig, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, seed: int = 0, attention: str = "torch"):
        if attention not in ("torch", "triton"):
            raise ValueError(f"attention must be 'torch' or 'triton', got {attention!r}")
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        self.attention = attention
        c = config
        g = torch.Generator(device=self.device).manual_seed(seed)

        def weight(rows: int, cols: int, gain: float = 1.0) -> torch.Tensor:
            # std gain/sqrt(fan_in): unit-scale activations, attention scores of std ~gain^2, so
            # attention is sharp and the logits depend strongly on every cached K/V and position.
            w = torch.randn(rows, cols, generator=g, device=self.device, dtype=torch.float32)
            return (w * (gain / cols**0.5)).to(dtype).contiguous()

        q_out, kv_out = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        self.embed = weight(c.vocab_size, c.hidden_size)
        self.layers = []
        for _ in range(c.num_layers):
            self.layers.append({
                "attn_norm": torch.ones(c.hidden_size, device=self.device, dtype=dtype),
                "qkv": weight(q_out + 2 * kv_out, c.hidden_size, QK_GAIN),
                "o": weight(c.hidden_size, q_out),
                "mlp_norm": torch.ones(c.hidden_size, device=self.device, dtype=dtype),
                "gate_up": weight(2 * c.intermediate_size, c.hidden_size),
                "down": weight(c.hidden_size, c.intermediate_size),
            })
        self.final_norm = torch.ones(c.hidden_size, device=self.device, dtype=dtype)
        self.lm_head = weight(c.vocab_size, c.hidden_size)
        self.inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, device=self.device,
                                                             dtype=torch.float32) / c.head_dim))

    def new_cache(self, num_pages: int, page_size: int, poison: bool = True) -> PagedKVCache:
        """An empty (NaN-poisoned) page pool shaped for this model."""
        c = self.config
        return PagedKVCache(c.num_layers, num_pages, page_size, c.num_kv_heads, c.head_dim,
                            self.dtype, self.device, poison=poison)

    def token_ids(self, tokens) -> torch.Tensor:
        """Trace token ids as embedding rows (ids are folded into the vocabulary: any fixed map works)."""
        t = torch.as_tensor(tokens, dtype=torch.int64, device=self.device)
        return torch.remainder(t, self.config.vocab_size)

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin tables ``[T, head_dim]`` for absolute positions (HF Llama's half-rotation layout)."""
        angles = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()

    @staticmethod
    def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        half = xf.shape[-1] // 2
        rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
        return (xf * cos[:, None, :] + rotated * sin[:, None, :]).to(x.dtype)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.config.rms_eps)
        return xf.to(x.dtype) * weight

    def _attend(self, q, k, v, k_cache, v_cache, block_table, start_pos):
        if self.attention == "triton":
            from kvsim.gpu import kernels

            kernels.write_kv(k, v, k_cache, v_cache, block_table, start_pos)
            return kernels.prefill_attention(q, k, v, k_cache, v_cache, block_table, start_pos)
        from kvsim.gpu import reference

        reference.write_kv_ref(k, v, k_cache, v_cache, block_table, start_pos)
        return reference.prefill_attention_ref(q, k, v, k_cache, v_cache, block_table, start_pos)

    @torch.inference_mode()
    def prefill(self, tokens, start_pos: int, cache: PagedKVCache, block_table: torch.Tensor,
                rope_offset: int | None = None) -> torch.Tensor:
        """Compute ``tokens`` at positions ``start_pos..``, attending to the ``start_pos`` tokens
        already in ``cache`` through ``block_table``; write their K/V into their pages.

        Returns the fp32 logits of the last position. ``rope_offset`` overrides the rotary
        position of the first new token (tests use it to show that a wrong offset is caught).
        """
        c = self.config
        ids = self.token_ids(tokens)
        n = ids.shape[0]
        if n == 0:
            raise ValueError("prefill needs at least one new token (engines always recompute one)")
        first = start_pos if rope_offset is None else rope_offset
        cos, sin = self.rotary(torch.arange(first, first + n, device=self.device))
        q_out, kv_out = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        x = self.embed[ids]
        for i, w in enumerate(self.layers):
            h = self.rms_norm(x, w["attn_norm"])
            qkv = h @ w["qkv"].T
            q = self.apply_rotary(qkv[:, :q_out].view(n, c.num_heads, c.head_dim), cos, sin)
            k = self.apply_rotary(qkv[:, q_out:q_out + kv_out].view(n, c.num_kv_heads, c.head_dim), cos, sin)
            v = qkv[:, q_out + kv_out:].reshape(n, c.num_kv_heads, c.head_dim)
            k_cache, v_cache = cache.layer(i)
            o = self._attend(q.contiguous(), k.contiguous(), v.contiguous(), k_cache, v_cache, block_table, start_pos)
            x = x + o.reshape(n, q_out) @ w["o"].T
            h = self.rms_norm(x, w["mlp_norm"])
            gate, up = (h @ w["gate_up"].T).split(c.intermediate_size, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ w["down"].T
        last = self.rms_norm(x[-1:], self.final_norm)
        return (last @ self.lm_head.T).float()[0]
