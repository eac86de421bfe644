"""`kvsim capacity`: KV bytes per token and the token capacity each engine would get."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from kvsim.cli.app import app, console


@app.command()
def capacity(
    model: Annotated[str, typer.Option("--model", help="Model shape name or a HF config.json path.")],
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="GPU name (H100-80GB, H200, ...) or memory (80GiB).",
                                               show_default=False)] = None,
    kv_cache_memory: Annotated[Optional[str], typer.Option(
        "--kv-cache-memory", help="Use this much KV memory instead of estimating it from --gpu.",
        show_default=False)] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size (KV heads split across GPUs).")] = 1,
    block_size: Annotated[int, typer.Option("--block-size", help="vLLM block size.")] = 16,
    page_size: Annotated[int, typer.Option("--page-size", help="SGLang page size.")] = 1,
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype", help="auto (model dtype) or fp8.")] = "auto",
    gpu_memory_utilization: Annotated[float, typer.Option("--gpu-memory-utilization")] = 0.9,
    mem_fraction_static: Annotated[Optional[float], typer.Option(
        "--mem-fraction-static", help="SGLang's setting (default: its own default for the GPU).",
        show_default=False)] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", help="Write the figures as JSON.",
                                                     show_default=False)] = None,
) -> None:
    """Print KV bytes per token (exact) and the KV capacity vLLM and SGLang would get (estimated)."""
    from kvsim.capacity import capacity_report
    from kvsim.render.capacity import render_capacity

    report = capacity_report(model, gpu=gpu, kv_cache_memory=kv_cache_memory, tp=tp, block_size=block_size,
                             page_size=page_size, kv_cache_dtype=kv_cache_dtype,
                             gpu_memory_utilization=gpu_memory_utilization,
                             mem_fraction_static=mem_fraction_static)
    render_capacity(console, report)
    if json_out is not None:
        from kvsim.outputs import check_output_path, write_json

        check_output_path(json_out)
        write_json(json_out, report["figures"])
