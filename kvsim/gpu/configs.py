"""Shapes of the Llama-architecture decoders gpu-validate can build (no torch needed).

Weights are never downloaded: the model is built with seeded random weights of these
shapes. ``tiny`` is for CPU tests; the ``*-shape`` entries copy the public Hugging Face
configs of the named models (layers, heads, sizes, RoPE base) for timing on a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvsim.errors import ConfigError
from kvsim.models import ModelShape


@dataclass(frozen=True)
class LlamaConfig:
    """A Llama decoder shape: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP."""

    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 500000.0
    rms_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(f"{self.name}: {self.num_heads} heads are not a multiple of "
                              f"{self.num_kv_heads} KV heads")

    @property
    def linear_params_per_layer(self) -> int:
        """Weights of one decoder layer's matmuls (q, k, v, o, gate, up, down)."""
        h, d = self.hidden_size, self.head_dim
        attn = h * self.num_heads * d * 2 + h * self.num_kv_heads * d * 2
        return attn + 3 * h * self.intermediate_size

    @property
    def params(self) -> int:
        """All weights: layers, embedding and (untied) LM head; norms are negligible and left out."""
        return self.num_layers * self.linear_params_per_layer + 2 * self.vocab_size * self.hidden_size

    def kv_elements_per_token(self) -> int:
        """K and V values one token stores across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    def shape(self, dtype_bytes: int = 2) -> ModelShape:
        """The same shape as kvsim's :class:`~kvsim.models.ModelShape` (for capacity and KV size)."""
        return ModelShape(self.name, self.num_layers, self.num_heads, self.num_kv_heads, self.head_dim,
                          self.hidden_size, self.intermediate_size, self.vocab_size, float(self.params),
                          dtype_bytes=dtype_bytes)


CONFIGS: dict[str, LlamaConfig] = {c.name: c for c in [
    # 2 layers, GQA 4:1, head_dim 16: a CPU prefill of a few hundred tokens takes milliseconds.
    LlamaConfig("tiny", vocab_size=1024, hidden_size=128, intermediate_size=256, num_layers=2,
                num_heads=8, num_kv_heads=2, head_dim=16),
    # meta-llama/Llama-3.2-1B config.json (rope scaling left out: positions stay far below 8192).
    LlamaConfig("llama-3.2-1b-shape", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64),
    # meta-llama/Meta-Llama-3-8B config.json.
    LlamaConfig("llama-3-8b-shape", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128),
]}


def get_config(name: str) -> LlamaConfig:
    """A named model shape, or a clear error listing the choices."""
    key = name.lower()
    if key not in CONFIGS:
        raise ConfigError(f"unknown --model {name!r}; choose one of {', '.join(CONFIGS)}")
    return CONFIGS[key]
