"""Scheduler settings from kvsim's options, with the engines' defaults for the GPU.

The capacity comes from the same options as the sequential replay (``SimOptions``: blocks,
tokens, memory, or model and GPU). The scheduler's own defaults are the engines':

- vLLM 0.33.0 (``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args``, OpenAI
  server): ``max_num_batched_tokens`` / ``max_num_seqs`` = 16384 / 1024 on GPUs with at
  least 160 GiB, 8192 / 1024 on GPUs with at least 70 GiB that are not A100s, else
  2048 / 256 (also when the GPU is unknown);
- SGLang 0.5.23: ``chunked_prefill_size`` by GPU memory (as the sequential replay),
  ``max_running_requests`` from the pool size (``default_max_running_requests``).

``defaults_note`` says which defaults were taken, for the summary.
"""
from __future__ import annotations

from kvsim.models import GiB, apc_num_gpu_blocks, gpu_memory_bytes, radix_max_total_tokens
from kvsim.engines.options import SimOptions
from kvsim.engines.sglang.settings import sglang_chunked_prefill_size
from kvsim.engines.sglang.scheduler import SglangSchedSettings, default_max_running_requests
from kvsim.engines.vllm.scheduler import VllmSchedSettings

UNLIMITED_BLOCKS = 1 << 22      # an "unlimited" cache for the step replay: 64M tokens at B = 16


def vllm_budget_defaults(gpu: str | None) -> tuple[int, int, str]:
    """(max_num_batched_tokens, max_num_seqs, where they come from) for ``--gpu``."""
    if gpu:
        memory = gpu_memory_bytes(gpu)
        if memory >= 160 * GiB:
            return 16384, 1024, f"vLLM's defaults for {gpu} (>= 160 GiB)"
        if memory >= 70 * GiB and "a100" not in gpu.lower():
            return 8192, 1024, f"vLLM's defaults for {gpu} (>= 70 GiB)"
        return 2048, 256, f"vLLM's defaults for {gpu}"
    return 2048, 256, "vLLM's generic defaults (no --gpu)"


def vllm_settings(options: SimOptions, unlimited_blocks: int | None = None,
                  **overrides) -> tuple[VllmSchedSettings, str]:
    """vLLM scheduler settings for ``options``; explicit overrides win over the defaults.

    Without a capacity the pool is "unlimited": ``unlimited_blocks`` (enough for every request
    of the workload at once, so nothing is ever evicted) or at most ``UNLIMITED_BLOCKS``.
    """
    tokens, seqs, note = vllm_budget_defaults(options.gpu)
    blocks = apc_num_gpu_blocks(options) or min(unlimited_blocks or UNLIMITED_BLOCKS, UNLIMITED_BLOCKS)
    knobs = {"max_num_batched_tokens": tokens, "max_num_seqs": seqs,
             **{k: v for k, v in overrides.items() if v is not None}}
    if "max_num_batched_tokens" in overrides or "max_num_seqs" in overrides:
        note = "as given"
    return VllmSchedSettings(num_gpu_blocks=blocks, block_size=int(options.block_size),
                             hash_algo=options.hash_algo, **knobs), note


def sglang_settings(options: SimOptions, unlimited_tokens: int | None = None,
                    **overrides) -> tuple[SglangSchedSettings, str]:
    """SGLang scheduler settings for ``options``; explicit overrides win over the defaults.

    Without a capacity the pool is "unlimited": ``unlimited_tokens`` (enough for every request
    of the workload at once) or at most ``UNLIMITED_BLOCKS * 16`` tokens; the request slots are
    then those of the largest pool, so the pool's size changes nothing.
    """
    capacity = radix_max_total_tokens(options)
    if capacity is None:
        capacity = min(unlimited_tokens or UNLIMITED_BLOCKS * 16, UNLIMITED_BLOCKS * 16)
        if overrides.get("max_running_requests") is None:
            context = overrides.get("context_len") or SglangSchedSettings.context_len
            overrides["max_running_requests"] = default_max_running_requests(UNLIMITED_BLOCKS * 16, context)
    p = int(options.page_size)
    capacity -= capacity % p
    knobs = {"chunked_prefill_size": sglang_chunked_prefill_size(options.gpu),
             **{k: v for k, v in overrides.items() if v is not None}}
    note = (f"SGLang's defaults for {options.gpu}" if options.gpu else "SGLang's defaults (no --gpu)")
    return SglangSchedSettings(capacity=capacity, page_size=p, eviction_policy=options.eviction_policy,
                               **knobs), note
