"""The prefill-time model: FLOPs and bytes of a prefill for a model shape, and device peaks.

A prefill of ``n`` new tokens after ``c`` cached ones does the linear layers for the ``n``
tokens (2 FLOPs per weight per token), attention over ``n*c + n(n+1)/2`` causal
query-key pairs (QK and PV: 4 * head_dim FLOPs per pair per query head), and the LM head
for the last position only (as engines do). It reads the weights once and the context's
KV once (the ideal of a fused attention kernel) and writes the new tokens' KV. The
roofline time ``max(FLOPs / peak FLOP/s, bytes / peak bandwidth)`` is a lower bound: norms,
RoPE, softmax and activations are left out, and kernels reach a fraction of peak.
"""
from __future__ import annotations

from dataclasses import dataclass

from typing import Any

import numpy as np



@dataclass(frozen=True)
class DevicePeak:
    """Dense peak rates of a device from its vendor's datasheet."""

    name: str
    flops_16bit: float     # dense bf16/fp16 tensor-core FLOP/s
    flops_fp32: float      # fp32 (non-tensor) FLOP/s
    mem_bandwidth: float   # bytes/s of device memory

    def flops(self, dtype_bytes: int) -> float:
        return self.flops_16bit if dtype_bytes <= 2 else self.flops_fp32


# NVIDIA datasheets, dense (no sparsity). Matched against torch.cuda.get_device_name().
DEVICES: dict[str, DevicePeak] = {d.name: d for d in [
    DevicePeak("H100-80GB-SXM", 989.4e12, 66.9e12, 3.35e12),
    DevicePeak("H100-PCIe", 756.0e12, 51.2e12, 2.0e12),
    DevicePeak("H200", 989.4e12, 66.9e12, 4.8e12),
    DevicePeak("H200-NVL", 835.0e12, 60.0e12, 4.8e12),
    DevicePeak("A100-80GB", 312.0e12, 19.5e12, 2.039e12),
    DevicePeak("L4", 121.0e12, 30.3e12, 0.3e12),
]}


def device_peak(device_name: str) -> DevicePeak | None:
    """Peaks for a CUDA device name (e.g. 'NVIDIA H100 80GB HBM3'); None when unknown (CPU)."""
    s = device_name.upper()
    if "H200" in s:
        return DEVICES["H200-NVL" if "NVL" in s else "H200"]
    if "H100" in s:
        return DEVICES["H100-PCIe" if "PCIE" in s else "H100-80GB-SXM"]
    if "A100" in s and "80G" in s:
        return DEVICES["A100-80GB"]
    if s.endswith(" L4") or s == "L4":
        return DEVICES["L4"]
    return None


def attention_pairs(new_tokens, cached_tokens):
    """Causal (query, key) pairs of a prefill: each new token sees the cache and earlier new tokens."""
    return new_tokens * cached_tokens + new_tokens * (new_tokens + 1) / 2


def prefill_flops(cfg: Any, new_tokens, cached_tokens):
    """Matmul FLOPs of prefilling ``new_tokens`` after ``cached_tokens`` (works on arrays)."""
    linear = 2.0 * cfg.num_layers * cfg.linear_params_per_layer * new_tokens
    attention = 4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * attention_pairs(new_tokens, cached_tokens)
    lm_head = 2.0 * cfg.hidden_size * cfg.vocab_size
    return linear + attention + lm_head


def prefill_bytes(cfg: Any, new_tokens, cached_tokens, dtype_bytes: int):
    """Device-memory bytes: weights once, context KV read once, new KV written once."""
    weights = (cfg.num_layers * cfg.linear_params_per_layer + cfg.vocab_size * cfg.hidden_size) * dtype_bytes
    kv = cfg.kv_elements_per_token() * dtype_bytes
    return weights + kv * (cached_tokens + new_tokens) + kv * new_tokens


def attention_flops(cfg: Any, new_tokens, cached_tokens, layers: int = 1):
    """FLOPs of the attention kernel alone (QK and PV) for ``layers`` layers."""
    return 4.0 * layers * cfg.num_heads * cfg.head_dim * attention_pairs(new_tokens, cached_tokens)


def attention_bytes(cfg: Any, new_tokens, cached_tokens, dtype_bytes: int, layers: int = 1):
    """Bytes the attention kernel must move: Q in, output out, context K/V read once."""
    q_and_out = 2 * new_tokens * cfg.num_heads * cfg.head_dim
    kv = 2 * (cached_tokens + new_tokens) * cfg.num_kv_heads * cfg.head_dim
    return layers * (q_and_out + kv) * dtype_bytes


def roofline_seconds(flops, nbytes, peak: DevicePeak | None, dtype_bytes: int):
    """max(compute time, memory time) at the device's peaks; None without known peaks."""
    if peak is None:
        return None
    return np.maximum(np.divide(flops, peak.flops(dtype_bytes)), np.divide(nbytes, peak.mem_bandwidth))
