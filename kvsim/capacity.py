"""The figures `kvsim capacity` prints: exact KV sizes, estimated engine capacities."""
from __future__ import annotations

from typing import Any

from kvsim.errors import ConfigError
from kvsim.models import (GiB, get_model, gpu_memory_bytes, parse_bytes, sglang_kv_memory_estimate,
                          sglang_mem_fraction_static, sglang_tokens_for_memory, vllm_blocks_for_memory,
                          vllm_kv_memory_estimate)


def capacity_report(model: str, gpu: str | None = None, kv_cache_memory: str | None = None, tp: int = 1,
                    block_size: int = 16, page_size: int = 1, kv_cache_dtype: str = "auto",
                    gpu_memory_utilization: float = 0.9, mem_fraction_static: float | None = None) -> dict[str, Any]:
    """KV bytes per token and vLLM / SGLang capacities, with each figure marked exact or estimated."""
    if tp < 1 or block_size < 1 or page_size < 1:
        raise ConfigError("--tp, --block-size and --page-size must be positive")
    if kv_cache_dtype not in ("auto", "fp8"):
        raise ConfigError(f"--kv-cache-dtype must be auto or fp8, got {kv_cache_dtype!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ConfigError("--gpu-memory-utilization must be in (0, 1]")
    shape = get_model(model)
    kv_bytes = shape.kv_bytes_per_token(tp, 1 if kv_cache_dtype == "fp8" else None)
    fig: dict[str, Any] = {
        "model": shape.name, "gpu": gpu, "tp": tp, "kv_bytes_per_token": kv_bytes,
        "vllm_block_bytes": kv_bytes * block_size, "weights_bytes_per_gpu": shape.weight_bytes(tp),
    }
    rows = [
        ("KV bytes per token (per GPU)", f"{kv_bytes:,} B ({kv_bytes / 1024:.1f} KiB)", "exact: " + (
            "layers x (kv_lora_rank + rope_dim) x dtype" if shape.is_mla else "2 x layers x kv_heads/tp x head_dim x dtype")),
        (f"vLLM block ({block_size} tokens)", f"{kv_bytes * block_size / 2**20:,.2f} MiB", "exact"),
        ("weights per GPU", f"{shape.weight_bytes(tp) / GiB:,.1f} GiB", "params x dtype / tp"),
    ]
    if kv_cache_memory is not None:
        mem_v = mem_s = parse_bytes(kv_cache_memory)
        note = "from --kv-cache-memory"
    elif gpu is not None:
        total = gpu_memory_bytes(gpu)
        fig["gpu_memory_bytes"] = total
        mem_v = vllm_kv_memory_estimate(shape, total, gpu_memory_utilization, tp)
        frac = sglang_mem_fraction_static(total, tp) if mem_fraction_static is None else mem_fraction_static
        mem_s = sglang_kv_memory_estimate(shape, total, frac, tp)
        fig["sglang_mem_fraction_static"] = frac
        rows.append(("GPU memory", f"{total / GiB:,.1f} GiB", "driver-reported total (table)"))
        note = "estimated (engines profile this at start-up)"
    else:
        return {"model": shape.name, "gpu": None, "rows": rows, "figures": fig}
    if mem_v <= 0 or mem_s <= 0:
        raise ConfigError(f"{shape.name} (tp={tp}) leaves no memory for the KV cache on {gpu}")
    blocks = vllm_blocks_for_memory(mem_v, kv_bytes, block_size)
    sg_tokens = sglang_tokens_for_memory(mem_s, kv_bytes, page_size)
    fig.update(vllm_kv_memory_bytes=mem_v, vllm_num_gpu_blocks=blocks, vllm_token_capacity=(blocks - 1) * block_size,
               sglang_kv_memory_bytes=mem_s, sglang_max_total_num_tokens=sg_tokens)
    rows += [
        ("vLLM KV memory", f"{mem_v / GiB:,.2f} GiB", note + f"; gpu_memory_utilization={gpu_memory_utilization}"),
        ("vLLM num_gpu_blocks", f"{blocks:,}", "memory // (block bytes); block 0 is the null block"),
        ("vLLM token capacity", f"{(blocks - 1) * block_size:,}", "usable (num_gpu_blocks - 1) x block size"),
        ("SGLang KV memory", f"{mem_s / GiB:,.2f} GiB",
         note + (f"; mem_fraction_static={fig['sglang_mem_fraction_static']}" if "sglang_mem_fraction_static" in fig else "")),
        ("SGLang max_total_num_tokens", f"{sg_tokens:,}", "memory // cell size, page-aligned"),
    ]
    return {"model": shape.name, "gpu": gpu, "rows": rows, "figures": fig}
