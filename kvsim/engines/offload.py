"""The offload tier a replay asks for (``--offload native|lmcache|hicache``), read once from the options.

The tier's settings travel in :class:`~kvsim.engines.options.SimOptions` ``extra`` under the
keys of :data:`KEYS` (the CLI's OFFLOAD group fills them); each engine's settings type
(``APCSettings``, ``RadixSettings``) calls :func:`vllm_tier` or :func:`hicache_tier` in its
``from_options``, so a bad value is one :class:`~kvsim.errors.ConfigError` before any log is
read. Sizes are tokens (``250000``, ``1e6``) or memory (``100GiB``, needs ``--model``), as
``--capacity`` reads them; a memory size becomes chunks as each engine derives it
(``docs/engines/offload.md §1.2``, §2.3, §3.2).
"""
from __future__ import annotations

import math
from typing import Any

from kvsim.errors import ConfigError

BACKENDS = ("native", "lmcache", "hicache")
#: which engine family each backend sits under
FAMILY = {"native": "vllm", "lmcache": "vllm", "hicache": "sglang"}
#: SimOptions.extra key -> (CLI flag, the backends that read it; () = every backend)
OPTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "offload": ("--offload", ()),
    "offload_size": ("--offload-size", ()),
    "disk_size": ("--disk-size", ("lmcache",)),
    "offload_block_size": ("--offload-block-size", ("native",)),
    "offload_eviction_policy": ("--offload-eviction-policy", ("native",)),
    "offload_store_threshold": ("--offload-store-threshold", ("native",)),
    "hicache_ratio": ("--hicache-ratio", ("hicache",)),
    "hicache_size": ("--hicache-size", ("hicache",)),
    "hicache_write_policy": ("--hicache-write-policy", ("hicache",)),
    "lmcache_chunk_size": ("--lmcache-chunk-size", ("lmcache",)),
    "lmcache_max_local_cpu_size": ("--lmcache-max-local-cpu-size", ("lmcache",)),
    "lmcache_local_disk": ("--lmcache-local-disk", ("lmcache",)),
    "lmcache_max_local_disk_size": ("--lmcache-max-local-disk-size", ("lmcache",)),
    "lmcache_save_unfull_chunk": ("--lmcache-save-unfull-chunk", ("lmcache",)),
    "lmcache_min_retrieve_tokens": ("--lmcache-min-retrieve-tokens", ("lmcache",)),
    "offload_bandwidth": ("--offload-bandwidth", ()),
    "disk_bandwidth": ("--disk-bandwidth", ("lmcache",)),
}
#: the SimOptions.extra keys of the offload tiers (both engine specs declare them)
KEYS = tuple(OPTIONS)


def requested(options: Any, family: str) -> dict[str, Any] | None:
    """The tier keys of ``options.extra`` for an engine of ``family`` (vllm | sglang), checked:
    None without ``--offload``; an option of another backend, or a backend of the other
    engine, is a ConfigError."""
    extra = options.extra or {}
    given = {k: v for k, v in extra.items() if k in OPTIONS and v is not None}
    backend = given.get("offload")
    if backend is None:
        if given:
            flags = ", ".join(OPTIONS[k][0] for k in given)
            raise ConfigError(f"{flags} need(s) --offload native|lmcache|hicache")
        return None
    backend = str(backend).lower()
    if backend not in BACKENDS:
        raise ConfigError(f"unknown --offload {given['offload']!r}; choose native, lmcache or hicache")
    for key in given:
        owners = OPTIONS[key][1]
        if owners and backend not in owners:
            raise ConfigError(f"{OPTIONS[key][0]} is an option of --offload {' / '.join(owners)}, "
                              f"not of --offload {backend}")
    if FAMILY[backend] != family:
        if family == "vllm":
            raise ConfigError(f"--offload {backend} is SGLang's host cache: use it with --policy radix "
                              "(vLLM APC takes --offload native or lmcache)")
        raise ConfigError(f"--offload {backend} is a vLLM connector: use it with --policy apc "
                          "(SGLang radix takes --offload hicache)")
    return {**given, "offload": backend}


def parse_size(value: Any, flag: str, model: str | None) -> tuple[float | None, int | None]:
    """``(tokens, bytes)`` of a size: a number of tokens, or memory such as ``100GiB`` (needs a model)."""
    from kvsim.models import parse_bytes

    label = str(value).strip()
    try:
        tokens = float(label.replace("_", ""))
    except ValueError:
        tokens = None
    if tokens is not None:
        if math.isnan(tokens) or math.isinf(tokens) or tokens < 1:
            raise ConfigError(f"{flag} must be a positive number of tokens or a memory size, got {label!r}")
        return tokens, None
    try:
        nbytes = parse_bytes(label)
    except ConfigError:
        raise ConfigError(f"{flag}: not a size: {label!r} (tokens such as 250000 or 1e6, or memory such as "
                          "100GiB with --model)") from None
    if not model:
        raise ConfigError(f"{flag} {label!r} is a memory size: give --model to convert it into tokens")
    if nbytes <= 0:
        raise ConfigError(f"{flag} must be positive, got {label!r}")
    return None, int(nbytes)


def _int(tier: dict, key: str, default: int, low: int = 0) -> int:
    value = tier.get(key, default)
    try:
        number = int(float(value))
        if float(value) != number:
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(f"{OPTIONS[key][0]} must be a whole number, got {value!r}") from None
    if number < low:
        raise ConfigError(f"{OPTIONS[key][0]} must be at least {low}, got {number}")
    return number


def _float(tier: dict, key: str, default: float) -> float:
    value = tier.get(key, default)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{OPTIONS[key][0]} must be a number, got {value!r}") from None
    if math.isnan(number) or number < 0:
        raise ConfigError(f"{OPTIONS[key][0]} must be a non-negative number, got {value!r}")
    return number


def _bytes_per_token(options: Any) -> int:
    """KV bytes of one token on one GPU for ``--model`` (0: no model given)."""
    if not options.model:
        return 0
    from kvsim.models import get_model

    return get_model(options.model).kv_bytes_per_token()


def _links(options: Any, tier: dict) -> dict[str, float]:
    """The tier's link bandwidths (bytes/s) for a timed replay: the GPU's host link and the disk's."""
    from kvsim.costs.links import disk_bytes_per_s, host_link_bytes_per_s

    return {"link_bytes_per_s": host_link_bytes_per_s(options.gpu, tier.get("offload_bandwidth")),
            "disk_bytes_per_s": disk_bytes_per_s(tier.get("disk_bandwidth"))}


def _needs_gpu_pool(capacity: int | None, backend: str) -> None:
    if capacity is None:
        raise ConfigError(f"--offload {backend} keeps what a finite GPU pool evicts: give a capacity "
                          "(--capacity, --num-gpu-blocks, --max-total-tokens or --kv-cache-memory)")


def vllm_tier(options: Any, block_size: int, num_gpu_blocks: int | None):
    """The vLLM tier the options ask for (:class:`~kvsim.tiers.setup.VllmTier`), or None."""
    tier = requested(options, "vllm")
    if tier is None:
        return None
    from kvsim.tiers.lmcache import LMCacheSettings
    from kvsim.tiers.setup import VllmTier
    from kvsim.tiers.vllm_connector import OffloadSettings
    from kvsim.tiers.vllm_offload import num_cpu_chunks

    backend = tier["offload"]
    _needs_gpu_pool(num_gpu_blocks, backend)
    per_token = _bytes_per_token(options)
    budget = _token_budget(options)
    if backend == "native":
        if "offload_size" not in tier:
            raise ConfigError("--offload native needs --offload-size (vLLM's cpu_bytes_to_use / "
                              "--kv-offloading-size)")
        chunk = _int(tier, "offload_block_size", block_size, 1)
        if chunk % block_size:
            raise ConfigError(f"--offload-block-size {chunk} must be a multiple of the GPU block size "
                              f"({block_size} tokens)")
        tokens, nbytes = parse_size(tier["offload_size"], "--offload-size", options.model)
        chunks = (int(tokens) // chunk if nbytes is None
                  else num_cpu_chunks(nbytes, per_token * block_size, chunk // block_size))
        policy = str(tier.get("offload_eviction_policy", "lru")).lower()
        if policy not in ("lru", "arc"):
            raise ConfigError(f"unknown --offload-eviction-policy {policy!r}; choose lru or arc")
        native = OffloadSettings(num_chunks=chunks, gpu_block_size=block_size, block_size=chunk,
                                 eviction_policy=policy,
                                 store_threshold=_int(tier, "offload_store_threshold", 0))
        return VllmTier("native", native=native, token_budget=budget, bytes_per_token=per_token, **_links(options, tier))
    # LMCache (offload.md §2.1): --offload-size or LMCache's own max_local_cpu_size (GiB)
    chunk = _int(tier, "lmcache_chunk_size", 256, 1)
    if "offload_size" in tier and "lmcache_max_local_cpu_size" in tier:
        raise ConfigError("give the CPU tier's size once: --offload-size or --lmcache-max-local-cpu-size")
    if "disk_size" in tier and "lmcache_max_local_disk_size" in tier:
        raise ConfigError("give the disk tier's size once: --disk-size or --lmcache-max-local-disk-size")
    cpu = _lmcache_chunks(tier, "offload_size", "lmcache_max_local_cpu_size", 5.0, chunk, per_token, options)
    disk = 0
    if any(k in tier for k in ("disk_size", "lmcache_max_local_disk_size", "lmcache_local_disk")):
        disk = _lmcache_chunks(tier, "disk_size", "lmcache_max_local_disk_size", 0.0, chunk, per_token, options)
        if disk == 0:
            raise ConfigError("an LMCache disk tier needs a size: --disk-size or --lmcache-max-local-disk-size")
    settings = LMCacheSettings(chunk_bytes=max(chunk * per_token, 1), chunk_size=chunk,
                               max_local_cpu_size=cpu * max(chunk * per_token, 1) / 1024**3,
                               save_unfull_chunk=bool(tier.get("lmcache_save_unfull_chunk", False)),
                               min_retrieve_tokens=_int(tier, "lmcache_min_retrieve_tokens", 0))
    return VllmTier("lmcache", lmcache=settings, cpu_chunks=cpu, disk_chunks=disk, token_budget=budget,
                    bytes_per_token=per_token, **_links(options, tier))


def _lmcache_chunks(tier: dict, size_key: str, gib_key: str, default_gib: float, chunk: int, per_token: int,
                    options: Any) -> int:
    """Chunks an LMCache tier holds: tokens // chunk, or bytes over 4 KiB-aligned chunk slots (§2.3)."""
    from kvsim.tiers.lmcache import num_cpu_chunks

    if size_key in tier:
        tokens, nbytes = parse_size(tier[size_key], OPTIONS[size_key][0], options.model)
        if nbytes is None:
            return int(tokens) // chunk
        return num_cpu_chunks(nbytes / 1024**3, chunk * per_token)
    if gib_key not in tier and default_gib == 0.0:
        return 0
    gib = _float(tier, gib_key, default_gib)
    if not per_token:
        raise ConfigError(f"{OPTIONS[gib_key][0]} is GiB of memory: give --model to convert it into chunks "
                          f"(or --offload-size in tokens)")
    return num_cpu_chunks(gib, chunk * per_token)


def _token_budget(options: Any) -> int:
    """The vLLM token budget a sequential replay's prefill steps take (``max_num_batched_tokens``):
    vLLM's default for ``--gpu``; stores are planned per step (offload.md §4)."""
    from kvsim.engines.vllm.scheduler import vllm_budget_defaults

    return vllm_budget_defaults(options.gpu)[0]


def hicache_tier(options: Any, capacity: int | None, page_size: int):
    """SGLang's host cache the options ask for (:class:`~kvsim.tiers.hicache.HiCacheSettings`), or None:
    ``--hicache-ratio`` (2.0) x the device pool unless ``--offload-size`` / ``--hicache-size`` (GB of
    10^9 bytes) gives the size (offload.md §3.2)."""
    tier = requested(options, "sglang")
    if tier is None:
        return None
    from kvsim.tiers.hicache import WRITE_POLICIES, HiCacheSettings, host_pool_tokens

    _needs_gpu_pool(capacity, "hicache")
    if "offload_size" in tier and "hicache_size" in tier:
        raise ConfigError("give the host pool's size once: --offload-size or --hicache-size")
    policy = str(tier.get("hicache_write_policy", "write_through"))
    if policy not in WRITE_POLICIES:
        raise ConfigError(f"unknown --hicache-write-policy {policy!r}; choose {', '.join(WRITE_POLICIES)}")
    ratio = _float(tier, "hicache_ratio", 2.0)
    per_token = _bytes_per_token(options)
    if "offload_size" in tier:
        tokens, nbytes = parse_size(tier["offload_size"], "--offload-size", options.model)
        size = int(tokens) if nbytes is None else nbytes // per_token
        host = (size // page_size + 1) * page_size
    else:
        gb = _float(tier, "hicache_size", 0.0)
        if gb > 0 and not per_token:
            raise ConfigError("--hicache-size is GB of host memory: give --model to convert it into tokens")
        if gb <= 0 and ratio <= 0:
            raise ConfigError("--hicache-ratio must be positive (or give --hicache-size / --offload-size)")
        host = host_pool_tokens(capacity, page_size, ratio, gb, per_token)
    return HiCacheSettings(host_tokens=host, page_size=page_size, write_policy=policy, bytes_per_token=per_token,
                           link_bytes_per_s=_links(options, tier)["link_bytes_per_s"])
