"""Model shapes, GPU sizes, KV bytes per token, and each engine's cache capacity.

The exact parts: KV bytes per token for a shape (vLLM's page formula, spec
``docs/engines/apc.md §8``; SGLang's cell size, ``docs/engines/radix.md §6``) and the conversions
between capacity units. The estimated parts: how much memory an engine finds free for
KV after loading weights on a given GPU — both engines *measure* this with a profiling
pass that cannot be reproduced offline, so kvsim estimates it and says so.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from kvsim.errors import ConfigError, InputError

GiB = 1024**3
MiB = 1024**2


@dataclass(frozen=True)
class ModelShape:
    """The parts of a model config that decide KV size and prefill cost."""

    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    params: float                       # total parameters (weights memory)
    dtype_bytes: int = 2                # activations and KV (bf16/fp16)
    weight_dtype_bytes: int | None = None  # weights, when stored narrower (fp8 checkpoints)
    kv_lora_rank: int | None = None     # MLA (DeepSeek): latent KV rank
    qk_rope_head_dim: int | None = None # MLA: decoupled RoPE key dim

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    def kv_bytes_per_token(self, tp: int = 1, kv_dtype_bytes: int | None = None) -> int:
        """KV-cache bytes one token occupies on one GPU (vLLM and SGLang agree on this)."""
        b = self.dtype_bytes if kv_dtype_bytes is None else kv_dtype_bytes
        if self.is_mla:  # one latent vector + rope key per layer, not split by TP
            return self.num_layers * (self.kv_lora_rank + self.qk_rope_head_dim) * b
        kv_heads = max(1, self.num_kv_heads // tp)
        return 2 * self.num_layers * kv_heads * self.head_dim * b

    def weight_bytes(self, tp: int = 1) -> float:
        return self.params * (self.weight_dtype_bytes or self.dtype_bytes) / tp


# Public configs (Hugging Face config.json of each model).
MODELS: dict[str, ModelShape] = {m.name: m for m in [
    ModelShape("llama-3-8b", 32, 32, 8, 128, 4096, 14336, 128256, 8.03e9),
    ModelShape("llama-3-70b", 80, 64, 8, 128, 8192, 28672, 128256, 70.6e9),
    ModelShape("qwen2.5-7b", 28, 28, 4, 128, 3584, 18944, 152064, 7.62e9),
    ModelShape("qwen2.5-72b", 80, 64, 8, 128, 8192, 29568, 152064, 72.7e9),
    ModelShape("mistral-7b", 32, 32, 8, 128, 4096, 14336, 32768, 7.25e9),
    ModelShape("deepseek-v3", 61, 128, 128, 192, 7168, 18432, 129280, 671e9,
               weight_dtype_bytes=1, kv_lora_rank=512, qk_rope_head_dim=64),
]}
ALIASES = {
    "llama-3.1-8b": "llama-3-8b", "llama-3.1-70b": "llama-3-70b", "llama3-8b": "llama-3-8b",
    "llama-3-8b-shape": "llama-3-8b", "llama3-70b": "llama-3-70b", "qwen2.5-7b-instruct": "qwen2.5-7b",
    "qwen2.5-72b-instruct": "qwen2.5-72b", "mistral-7b-instruct": "mistral-7b", "deepseek-v3-mla": "deepseek-v3",
    "deepseek-r1": "deepseek-v3",
}

# Total device memory as the driver reports it (MiB, nvidia-smi / rocm-smi; approximate).
GPUS: dict[str, int] = {
    "H100-80GB": 81559, "H100-94GB": 95830, "H200": 143771, "H20": 97871,
    "A100-80GB": 81920, "A100-40GB": 40960, "L40S": 46068, "L4": 23034, "A10": 23028,
    "RTX-4090": 24564, "B200": 183359, "MI300X": 196592,
}


def get_model(name_or_path: str) -> ModelShape:
    """A model shape by table name (case-insensitive) or from a Hugging Face config.json path."""
    key = name_or_path.lower()
    key = ALIASES.get(key, key)
    if key in MODELS:
        return MODELS[key]
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        return model_from_config(path)
    raise ConfigError(f"unknown model {name_or_path!r}; choose one of {', '.join(MODELS)} "
                      "or pass a path to a Hugging Face config.json")


def model_from_config(path: Path) -> ModelShape:
    """Read the KV-relevant fields of a Hugging Face config.json."""
    if path.is_dir():
        path = path / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(path, "no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(path, f"not a readable JSON config ({e.__class__.__name__})") from None
    if not isinstance(cfg, dict):
        raise InputError(path, "config.json must hold a JSON object")
    cfg = cfg.get("text_config", cfg)  # multimodal wrappers keep the LM config inside
    try:
        layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(path, f"missing or invalid field {e} (need num_hidden_layers, "
                               "num_attention_heads, hidden_size)") from None
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    inter = int(cfg.get("intermediate_size") or 4 * hidden)
    vocab = int(cfg.get("vocab_size") or 32000)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    dtype_bytes = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}.get(dtype, 2)
    # parameters: embeddings + per layer attention and MLP (ignores norms and biases)
    attn = hidden * (heads * head_dim) * 2 + hidden * (kv_heads * head_dim) * 2
    mlp = 3 * hidden * inter
    params = layers * (attn + mlp) + 2 * vocab * hidden
    return ModelShape(
        name=str(cfg.get("_name_or_path") or path.parent.name or path.stem),
        num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        hidden_size=hidden, intermediate_size=inter, vocab_size=vocab, params=float(params),
        dtype_bytes=dtype_bytes,
        kv_lora_rank=cfg.get("kv_lora_rank"), qk_rope_head_dim=cfg.get("qk_rope_head_dim"),
    )


def gpu_memory_bytes(name: str) -> int:
    """Total memory of a GPU from the table (case-insensitive), or a size like '80GiB'."""
    for key, mib in GPUS.items():
        if key.lower() == name.lower():
            return mib * MiB
    try:
        return parse_bytes(name)
    except ConfigError:
        raise ConfigError(f"unknown GPU {name!r}; choose one of {', '.join(GPUS)} "
                          "or give its memory, e.g. 80GiB") from None


def parse_bytes(text: str | int | float) -> int:
    """'20GiB', '512MiB', '80GB', '1e9' -> bytes."""
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        s = str(text).strip()
        units = {"kib": 1024, "mib": MiB, "gib": GiB, "tib": 1024 * GiB,
                 "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "b": 1}
        factor = 1.0
        low = s.lower()
        for unit, mult in units.items():
            if low.endswith(unit):
                factor, s = mult, s[: -len(unit)]
                break
        try:
            value = float(s) * factor
        except ValueError:
            raise ConfigError(f"not a memory size: {text!r} (examples: 20GiB, 512MiB, 8e10)") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"memory size must be positive and finite, got {text!r}")
    return int(value)


# -- what each engine would find free for KV (estimates) ------------------------------

def vllm_kv_memory_estimate(model: ModelShape, gpu_bytes: int, utilization: float = 0.9,
                            tp: int = 1, max_num_batched_tokens: int = 8192) -> int:
    """vLLM: total * gpu_memory_utilization - weights - profiled peak (estimated).

    The real value comes from a profiling forward pass (``docs/engines/apc.md §8``); we
    estimate its peak activations from ``max_num_batched_tokens`` and add 1 GiB for
    CUDA graphs and non-torch allocations.
    """
    activations = max_num_batched_tokens * (4 * model.hidden_size + 2 * model.intermediate_size // tp) * 2
    return int(gpu_bytes * utilization - model.weight_bytes(tp) - activations - GiB)


def sglang_mem_fraction_static(gpu_bytes: int, tp: int = 1) -> float:
    """SGLang 0.5.23's default --mem-fraction-static (arg_groups/memory_hook.py).

    reserved = 512 + 1.5 * max(chunked_prefill_size, 2048) + tp/8 * 1024 + 2 * cuda_graph_max_bs
    MiB, at least 10 GiB on GPUs above 60 GiB; fraction = (gpu - reserved) / gpu.
    The prefill CUDA-graph term is left out (it depends on the capture list).
    """
    gpu_mib = gpu_bytes / MiB
    if gpu_mib < 20 * 1024:
        chunk, max_bs = 2048, 8
    elif gpu_mib < 35 * 1024:
        chunk, max_bs = 4096, 48 if tp < 4 else 160
    elif gpu_mib < 60 * 1024:
        chunk, max_bs = 4096, 32 if tp < 4 else 160
    elif gpu_mib < 160 * 1024:
        chunk, max_bs = 8192, 256 if tp < 4 else 512
    else:
        chunk, max_bs = 16384, 512
    reserved = 512 + max(chunk, 2048) * 1.5 + tp / 8 * 1024 + max_bs * 2
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return round((gpu_mib - reserved) / gpu_mib, 3)


def sglang_kv_memory_estimate(model: ModelShape, gpu_bytes: int, mem_fraction_static: float | None = None,
                              tp: int = 1) -> int:
    """SGLang: rest = free-after-weights - total * (1 - mem_fraction_static) (docs/engines/radix.md §6)."""
    frac = sglang_mem_fraction_static(gpu_bytes, tp) if mem_fraction_static is None else mem_fraction_static
    after_weights = gpu_bytes - model.weight_bytes(tp)
    return int(after_weights - gpu_bytes * (1 - frac))


# -- capacity resolution for the two policies -----------------------------------------

def _model_of(options) -> ModelShape:
    if not options.model:
        raise ConfigError("--kv-cache-memory and --gpu need --model to convert memory into tokens")
    return get_model(options.model)


def vllm_blocks_for_memory(memory_bytes: int, kv_bytes_per_token: int, block_size: int) -> int:
    """vLLM's num_gpu_blocks for this much KV memory (whole blocks; block 0 is the null block)."""
    return int(memory_bytes) // (int(kv_bytes_per_token) * int(block_size))


def sglang_tokens_for_memory(memory_bytes: int, kv_bytes_per_token: int, page_size: int) -> int:
    """SGLang's max_total_num_tokens for this much KV memory (whole tokens, page-aligned)."""
    tokens = int(memory_bytes) // int(kv_bytes_per_token)
    return tokens - tokens % int(page_size)


def apc_num_gpu_blocks(options) -> int | None:
    """vLLM's num_gpu_blocks (null block included) for these options; None = unlimited."""
    b = int(options.block_size)
    if options.num_gpu_blocks is not None:
        n = int(options.num_gpu_blocks)
        if n < 2:
            raise ConfigError("--num-gpu-blocks must be at least 2 (block 0 is vLLM's reserved null block)")
        return n
    if options.capacity_tokens is not None:
        if math.isinf(float(options.capacity_tokens)):
            return None
        return int(float(options.capacity_tokens)) // b + 1
    if options.max_total_tokens is not None:
        return int(options.max_total_tokens) // b + 1
    if options.kv_cache_memory is not None:
        model = _model_of(options)
        return vllm_blocks_for_memory(options.kv_cache_memory, model.kv_bytes_per_token(), b)
    if options.gpu is not None:
        model = _model_of(options)
        mem = vllm_kv_memory_estimate(model, gpu_memory_bytes(options.gpu), options.gpu_memory_utilization)
        if mem <= 0:
            raise ConfigError(f"{model.name} does not fit on {options.gpu} (no memory left for KV)")
        return vllm_blocks_for_memory(mem, model.kv_bytes_per_token(), b)
    return None


def radix_max_total_tokens(options) -> int | None:
    """SGLang's max_total_num_tokens for these options (page-aligned); None = unlimited."""
    p = int(options.page_size)
    if options.max_total_tokens is not None:
        tokens = int(options.max_total_tokens)
    elif options.num_gpu_blocks is not None:
        tokens = (int(options.num_gpu_blocks) - 1) * int(options.block_size)
    elif options.capacity_tokens is not None:
        if math.isinf(float(options.capacity_tokens)):
            return None
        tokens = int(float(options.capacity_tokens))
    elif options.kv_cache_memory is not None:
        tokens = int(options.kv_cache_memory) // _model_of(options).kv_bytes_per_token()
    elif options.gpu is not None:
        model = _model_of(options)
        mem = sglang_kv_memory_estimate(model, gpu_memory_bytes(options.gpu), options.mem_fraction_static)
        if mem <= 0:
            raise ConfigError(f"{model.name} does not fit on {options.gpu} (no memory left for KV)")
        tokens = mem // model.kv_bytes_per_token()
    else:
        return None
    tokens -= tokens % p        # whole pages
    if tokens <= 0:
        raise ConfigError(f"capacity rounds down to 0 tokens at page size {p}")
    return tokens
