"""Options shared by several commands, defined once so their names and help agree."""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

LogPaths = Annotated[
    list[Path],
    typer.Argument(help="Prompt log(s): JSONL (plain or .gz), Mooncake hash-id JSONL, ShareGPT, Azure CSV, "
                   "Parquet trace.",
                   show_default=False),
]
TokenizerOpt = Annotated[
    str,
    typer.Option("--tokenizer", help="cl100k_base (default), any tiktoken encoding, hf:PATH/tokenizer.json, or bytes.",
                 rich_help_panel="Input"),
]
TemplateOpt = Annotated[
    str,
    typer.Option("--chat-template", help="Chat template: llama3 (default), chatml, mistral, plain, or a Jinja file.",
                 rich_help_panel="Input"),
]
WarmupOpt = Annotated[
    Optional[str],
    typer.Option("--warmup", help="Warm-up window: the first FRACTION (0.5, 50%) or N requests fill the cache but "
                 "are left out of every count.", show_default=False),
]
#: analyze's and report's shared settings (kvsim.analyze.options' own defaults; a test checks they agree)
ANALYZE_DEFAULT = {"block_sizes": "16,32,64,128,256,512", "top": 10}
BlockSizesOpt = Annotated[str, typer.Option("--block-sizes", help="Block (and page) sizes of the block-size "
                                            "table and chart.", rich_help_panel="Engine settings")]
TopOpt = Annotated[int, typer.Option("--top", help="Shared prefixes and divergence sites listed.")]
CalibrationFileOpt = Annotated[Optional[Path], typer.Option(
    "--calibration", help="gpu-validate calibration JSON: the prefill GPU time saved, and the cost of a step where "
    "the log is replayed as it arrived (--replay timed, the report's Under load section) instead of the roofline "
    "of --model on --gpu.", rich_help_panel="Output", show_default=False)]
ShowTextOpt = Annotated[
    bool,
    typer.Option("--show-text", help="Include raw prompt text in output (off by default: logs are sensitive)."),
]


#: the defaults of the input options (kvsim.io.load.load_trace's own; a test checks they agree)
INPUT_DEFAULT = {"format": "auto", "tokenizer": "cl100k_base", "chat_template": "llama3", "trace_block_size": 512,
                 "on_error": "fail"}


def load_from_cli(
    paths: list[Path],
    fmt: str = INPUT_DEFAULT["format"],
    tokenizer: str = INPUT_DEFAULT["tokenizer"],
    chat_template: str = INPUT_DEFAULT["chat_template"],
    trace_block_size: int = INPUT_DEFAULT["trace_block_size"],
    on_error: str = INPUT_DEFAULT["on_error"],
    limit: int | None = None,
):
    """Load a trace with the CLI's options and a progress bar.

    Says on stderr which tokenizer was used when it was a fallback, and how many bad
    lines ``--on-error skip`` skipped.
    """
    from kvsim.cli.app import err_console, session
    from kvsim.io.load import load_trace

    trace = load_trace(
        paths, format=fmt, tokenizer=tokenizer, chat_template=chat_template,
        trace_block_size=trace_block_size, on_error=on_error, limit=limit, progress=True,
        cache=session["trace_cache"], wait_for_store=False,  # the entry is written while the command goes on
    )
    for note in trace.meta.notes:
        if note.startswith("tokenizer:"):
            err_console.print(f"note: {note}", highlight=False, markup=False, soft_wrap=True)
    if trace.meta.skipped_lines:
        per_file = ", ".join(f"{Path(s).name}: {k}" for s, k in zip(trace.meta.sources, trace.meta.source_skipped) if k)
        err_console.print(f"skipped {trace.meta.skipped_lines} bad line(s) ({per_file}) because of --on-error skip",
                          highlight=False, markup=False, soft_wrap=True)
    return trace

# -- capacity and engine settings (simulate, report, sweep, gpu-validate) ------------------
# One name and one meaning per option in every command; a command that sweeps a setting
# takes a comma list. Defaults come from the library's own (SimOptions, the settings types).
_CAP = "Capacity"
_ENG = "Engine settings"


def _defaults() -> dict:
    from dataclasses import fields

    from kvsim.engines.sglang.settings import RadixSettings
    from kvsim.engines.options import SimOptions

    out = {f.name: f.default for f in fields(SimOptions) if f.name != "extra"}
    out.update({f"radix_{f.name}": f.default for f in fields(RadixSettings) if f.name != "policy_config"})
    return out


#: the defaults of every engine setting, read from SimOptions and RadixSettings
DEFAULT = _defaults()

PolicyOpt = Annotated[str, typer.Option(
    "--policy", "-p", help="Cache design: apc (vLLM APC), radix (SGLang RadixAttention), a comma list, or all.")]
CapacityListOpt = Annotated[str, typer.Option(
    "--capacity", "-c", help="Usable KV capacities, a comma list: tokens (1e4,1e5,250000), 'inf', or memory "
    "such as 20GiB (needs --model).", rich_help_panel=_CAP)]
ModelOpt = Annotated[Optional[str], typer.Option(
    "--model", help="Model shape (llama-3-8b, qwen2.5-72b, deepseek-v3, ...) or a HF config.json path.",
    rich_help_panel=_CAP, show_default=False)]
GpuOpt = Annotated[Optional[str], typer.Option(
    "--gpu", help="GPU (H100-80GB, H200, A100-80GB, L4, ...): estimate the capacity the engines would get.",
    rich_help_panel=_CAP, show_default=False)]
BlockSizeOpt = Annotated[int, typer.Option("--block-size", help="APC block size (tokens).", rich_help_panel=_ENG)]
BlockSizeListOpt = Annotated[str, typer.Option("--block-size", help="APC block sizes (tokens), a comma list.",
                                               rich_help_panel=_ENG)]
PageSizeOpt = Annotated[int, typer.Option("--page-size", help="Radix page size (tokens).", rich_help_panel=_ENG)]
PageSizeListOpt = Annotated[str, typer.Option("--page-size", help="Radix page sizes (tokens), a comma list.",
                                              rich_help_panel=_ENG)]
_EVICTIONS = "lru, lfu, fifo, mru, filo, priority, slru, tlru"
EvictionListOpt = Annotated[str, typer.Option(
    "--eviction", help=f"Radix eviction policies ({_EVICTIONS}), a comma list.", rich_help_panel=_ENG)]
EngineVersionOpt = Annotated[Optional[str], typer.Option(
    "--engine-version", help="vLLM behaviour profile: 0.33 (default) or 0.11.", rich_help_panel=_ENG,
    show_default=False)]


def parse_capacity_tokens(text: str | None) -> float | None:
    """A capacity in tokens: 'inf', '1e6', '250000' (a float, so that inf is allowed)."""
    from kvsim.errors import ConfigError
    from kvsim.sweep.grid import parse_capacity

    if text is None:
        return None
    cap = parse_capacity(text, model="")   # any model: a memory size is refused just below
    if cap.tokens is None:
        raise ConfigError(f"--capacity must be a number of tokens or 'inf' here, got {text!r}")
    return cap.tokens


def sim_options(capacity: str | None = None, num_gpu_blocks: int | None = None,
                max_total_tokens: int | None = None, kv_cache_memory: str | None = None, model: str | None = None,
                gpu: str | None = None, gpu_memory_utilization: float = DEFAULT["gpu_memory_utilization"],
                mem_fraction_static: float | None = None, **settings):
    """SimOptions from the shared capacity options (strings parsed, bad values -> ConfigError).

    ``capacity`` is tokens, 'inf', or a memory size (as ``--kv-cache-memory``, needs a model).
    """
    from kvsim.errors import ConfigError
    from kvsim.models import get_model, parse_bytes
    from kvsim.engines.options import SimOptions
    from kvsim.sweep.grid import parse_capacity

    if model is not None:
        get_model(model)  # a bad name fails before any log is read
    memory = None if kv_cache_memory is None else parse_bytes(kv_cache_memory)
    tokens = None
    if capacity is not None:
        try:
            cap = parse_capacity(capacity, model)
        except ConfigError as e:
            raise ConfigError(f"--capacity: {e}") from None
        if cap.memory_bytes is not None and memory is not None:
            raise ConfigError("give the KV memory once: --capacity 20GiB or --kv-cache-memory 20GiB")
        tokens = cap.tokens
        memory = cap.memory_bytes if cap.memory_bytes is not None else memory
    return SimOptions(
        capacity_tokens=tokens, num_gpu_blocks=num_gpu_blocks, max_total_tokens=max_total_tokens,
        kv_cache_memory=memory, model=model, gpu=gpu, gpu_memory_utilization=gpu_memory_utilization,
        mem_fraction_static=mem_fraction_static, **settings)


# -- option groups: options several commands share, declared once and added to each command whole --
# A Group is a set of options (name -> (annotation, default)) and a function that turns their
# values into one object. ``@with_groups(INPUT, CAPACITY)`` appends the groups' options to a
# command's signature (so Typer offers them, with one name, help and default everywhere) and
# passes the command one keyword argument per group, named after it, holding that object.

@dataclass(frozen=True)
class Group:
    """Options that travel together; ``build(**values)`` makes what the command receives."""

    name: str
    options: dict[str, tuple[Any, Any]]          # parameter name -> (Annotated type, default)
    build: Callable[..., Any] = dict

    def but(self, **changes: tuple[Any, Any] | None) -> "Group":
        """The same group with some options replaced (a new annotation or default) or dropped (None)."""
        options = dict(self.options)
        for name, value in changes.items():
            if value is None:
                options.pop(name)
            else:
                options[name] = value
        return Group(self.name, options, self.build)


def option(kind: Any, flag: str | tuple[str, ...], text: str, panel: str, default: Any = None) -> tuple[Any, Any]:
    """One option of a group: ``(Annotated[kind, typer.Option(...)], default)``; ``flag`` is one
    name or several (``("--capacity", "-c")``); a default of None is not shown in ``--help``."""
    flags = (flag,) if isinstance(flag, str) else flag
    return Annotated[kind, typer.Option(*flags, help=text, rich_help_panel=panel,
                                        show_default=default is not None)], default


def with_groups(*groups: Group) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the groups' options to a command; it receives one object per group."""
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(command, eval_str=True)
        params = [p for p in own.parameters.values() if p.name not in {g.name for g in groups}]
        for group in groups:
            for name, (annotation, default) in group.options.items():
                params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                                annotation=annotation))

        @functools.wraps(command)
        def run(**values: Any) -> Any:
            for group in groups:
                values[group.name] = group.build(**{name: values.pop(name) for name in group.options})
            return command(**values)

        run.__signature__ = own.replace(parameters=params)
        run.__annotations__ = {p.name: p.annotation for p in params}
        del run.__wrapped__        # Typer reads the signature above, not the command's own
        return run
    return decorate



@dataclass(frozen=True)
class LogInput:
    """How to read the logs (the Input options)."""

    fmt: str = INPUT_DEFAULT["format"]
    tokenizer: str = INPUT_DEFAULT["tokenizer"]
    chat_template: str = INPUT_DEFAULT["chat_template"]
    trace_block_size: int = INPUT_DEFAULT["trace_block_size"]
    on_error: str = INPUT_DEFAULT["on_error"]
    limit: int | None = None

    def load(self, paths: list[Path]):
        """The logs as one trace, read with these options (see :func:`load_from_cli`)."""
        return load_from_cli(paths, self.fmt, self.tokenizer, self.chat_template, self.trace_block_size,
                             self.on_error, self.limit)


def _in(kind, flag, text: str, default=None):
    return option(kind, flag, text, "Input", default)


#: how to read the logs (every command that reads them)
INPUT = Group("log_input", {
    "fmt": _in(str, ("--format", "-f"), "Input format: auto, chat, completion, tokens, mooncake, sharegpt, "
               "kvcache-tester, azure-csv, parquet.", INPUT_DEFAULT["format"]),
    "tokenizer": (TokenizerOpt, INPUT_DEFAULT["tokenizer"]),
    "chat_template": (TemplateOpt, INPUT_DEFAULT["chat_template"]),
    "trace_block_size": _in(int, "--trace-block-size", "Tokens per hash id in hash-id traces (Mooncake: 512).",
                            INPUT_DEFAULT["trace_block_size"]),
    "on_error": _in(str, "--on-error", "What to do with a bad input line: fail (exit 2) or skip (count and "
                    "report).", INPUT_DEFAULT["on_error"]),
    "limit": _in(Optional[int], "--limit", "Read at most this many requests."),
}, LogInput)

_RAD = "SGLang radix settings"


@dataclass(frozen=True)
class EngineOptions:
    """The capacity and engine settings of one replay (the Capacity, Engine and radix options)."""

    capacity: str | None = None
    num_gpu_blocks: int | None = None
    max_total_tokens: int | None = None
    kv_cache_memory: str | None = None
    model: str | None = None
    gpu: str | None = None
    gpu_memory_utilization: float = DEFAULT["gpu_memory_utilization"]
    mem_fraction_static: float | None = None
    block_size: int = DEFAULT["block_size"]
    page_size: int = DEFAULT["page_size"]
    eviction: str = DEFAULT["eviction_policy"]
    engine_version: str | None = None
    hash_algo: str = DEFAULT["hash_algo"]
    radix_tree: str = DEFAULT["radix_tree"]
    disable_overlap_schedule: bool = not DEFAULT["radix_overlap"]
    chunked_prefill_size: int | None = None
    eviction_amount: str = DEFAULT["radix_eviction_amount"]
    radix: bool = True            # the command has the radix options (else they keep SGLang's defaults)

    def sim_options(self, **extra):
        """The SimOptions these settings describe; ``extra`` adds engine settings (``finish``)."""
        radix = dict(radix_tree=self.radix_tree, overlap=not self.disable_overlap_schedule, **extra,
                     eviction_amount=self.eviction_amount) if self.radix else dict(extra)
        if self.chunked_prefill_size is not None:
            radix["chunked_prefill_size"] = self.chunked_prefill_size
        return sim_options(self.capacity, self.num_gpu_blocks, self.max_total_tokens, self.kv_cache_memory,
                           self.model, self.gpu, self.gpu_memory_utilization, self.mem_fraction_static,
                           block_size=self.block_size, page_size=self.page_size, eviction_policy=self.eviction,
                           engine_version=self.engine_version, hash_algo=self.hash_algo, extra=radix)


def _cap(kind, flag: str, text: str, default=None):
    return option(kind, flag, text, _CAP, default)


def _eng(kind, flag: str, text: str, default=None):
    return option(kind, flag, text, _ENG, default)


def _rad(kind, flag: str, text: str, default=None):
    return option(kind, flag, text, _RAD, default)


#: capacity and engine settings, one value each (report; simulate and serve with ENGINE's)
CAPACITY = Group("engine", {
    "capacity": _cap(Optional[str], ("--capacity", "-c"), "Usable KV capacity: tokens (250000, 1e6), 'inf' for the "
                     "unlimited upper bound, or memory such as 20GiB (needs --model)."),
    "num_gpu_blocks": _cap(Optional[int], "--num-gpu-blocks", "vLLM's num_gpu_blocks (the reserved null block "
                           "included)."),
    "max_total_tokens": _cap(Optional[int], "--max-total-tokens", "SGLang's max_total_num_tokens."),
    "kv_cache_memory": _cap(Optional[str], "--kv-cache-memory", "KV cache memory, e.g. 20GiB (needs --model)."),
    "model": (ModelOpt, None),
    "gpu": (GpuOpt, None),
    "gpu_memory_utilization": _cap(float, "--gpu-memory-utilization", "vLLM's setting, used with --gpu.",
                                   DEFAULT["gpu_memory_utilization"]),
    "mem_fraction_static": _cap(Optional[float], "--mem-fraction-static", "SGLang's setting, used with --gpu "
                                "(default: SGLang's own default)."),
    "block_size": (BlockSizeOpt, DEFAULT["block_size"]),
    "page_size": (PageSizeOpt, DEFAULT["page_size"]),
    "eviction": _eng(str, "--eviction", f"Radix eviction policy ({_EVICTIONS}).", DEFAULT["eviction_policy"]),
    "engine_version": (EngineVersionOpt, None),
}, lambda **values: EngineOptions(**values, radix=False))
#: capacity, engine and radix settings (simulate, serve)
ENGINE = Group("engine", {
    **CAPACITY.options,
    "hash_algo": _eng(str, "--hash-algo", "APC block hash: fast, sha256 or sha256_cbor (the last two reproduce "
                      "vLLM's hash bytes).", DEFAULT["hash_algo"]),
    "radix_tree": _rad(str, "--radix-tree", "SGLang tree: unified (what a default 0.5.23 server builds) or classic "
                       "(RadixCache).", DEFAULT["radix_tree"]),
    "disable_overlap_schedule": _rad(bool, "--disable-overlap-schedule", "SGLang's non-overlap scheduler "
                                     "(default: overlap on, as SGLang; also for --replay steps|timed).",
                                     not DEFAULT["radix_overlap"]),
    "chunked_prefill_size": _rad(Optional[int], "--chunked-prefill-size", "SGLang's chunk size (-1 off; default: "
                                 "SGLang's for --gpu, else 4096; also for --replay steps|timed)."),
    "eviction_amount": _rad(str, "--eviction-amount", "shortfall (SGLang 0.5.23: need - free) or need (older "
                            "releases).", DEFAULT["radix_eviction_amount"]),
}, EngineOptions)


# -- fleets: N replicas behind a router (simulate; sweep takes comma lists) -------------------
FLEET_PANEL = "Fleet (--replicas)"
#: the routers' --router names (kvsim.fleet.routers.ROUTERS; a test checks they agree)
ROUTER_NAMES = ("round_robin", "random", "least_load", "power_of_two", "session", "cache_aware", "prefix_hash",
                "dynamo", "llmd_approx", "llmd_precise", "prefixaware")


def _fleet(replicas=None, router=None, router_option=None):
    if replicas is None and router is None and not router_option:
        return None             # no fleet: a single engine's command does not import the fleet package
    from kvsim.fleet.config import fleet_from_cli

    return fleet_from_cli(replicas, router, router_option)


#: the fleet options: the command receives a kvsim.fleet.config.FleetSpec, or None without --replicas
FLEET = Group("fleet", {
    "replicas": option(Optional[int], "--replicas", "Replicas of the engine, each one as the options above configure "
                       "it (capacity and scheduler limits are per replica), behind --router (docs/fleet.md).",
                       FLEET_PANEL),
    "router": option(Optional[str], "--router", f"The router in front of them: {', '.join(ROUTER_NAMES)} (default "
                     "round_robin).", FLEET_PANEL),
    "router_option": option(Optional[list[str]], "--router-option", "A router option KEY=VALUE, named as the router "
                            "names it (repeatable; docs/engines/routers.md).", FLEET_PANEL),
}, _fleet)


# -- offload tiers: vLLM's native CPU offloading, LMCache, SGLang HiCache (simulate; docs/offload.md) --
OFFLOAD_PANEL = "Offload tier (--offload)"


def _offload(**values) -> dict:
    """The tier options given, as SimOptions.extra keys (kvsim.engines.offload checks them)."""
    return {key: value for key, value in values.items() if value not in (None, False)}


def _off(kind, flag: str, text: str, default=None):
    return option(kind, flag, text, OFFLOAD_PANEL, default)


#: the offload-tier options: the command receives a dict of SimOptions.extra keys (empty without them)
OFFLOAD = Group("offload", {
    "offload": _off(Optional[str], "--offload", "A KV tier beside the GPU: native (vLLM's CPU offloading) or lmcache "
                    "with --policy apc, hicache (SGLang's host cache) with --policy radix."),
    "offload_size": _off(Optional[str], "--offload-size", "The tier's size: tokens (250000, 1e6) or memory such as "
                         "100GiB (needs --model), per GPU, as --capacity reads it."),
    "disk_size": _off(Optional[str], "--disk-size", "LMCache: a local disk tier of this size (tokens or memory)."),
    "offload_block_size": _off(Optional[int], "--offload-block-size", "vLLM native: the offload block in tokens, a "
                               "multiple of --block-size (default: the GPU block)."),
    "offload_eviction_policy": _off(Optional[str], "--offload-eviction-policy", "vLLM native: lru (default) or arc."),
    "offload_store_threshold": _off(Optional[int], "--offload-store-threshold", "vLLM native: store a block once it "
                                    "was offered this many times (default 0: always)."),
    "hicache_ratio": _off(Optional[float], "--hicache-ratio", "SGLang: the host pool as a multiple of the device pool "
                          "(default 2.0)."),
    "hicache_size": _off(Optional[float], "--hicache-size", "SGLang: the host pool in GB (10^9 bytes, needs --model); "
                         "overrides --hicache-ratio."),
    "hicache_write_policy": _off(Optional[str], "--hicache-write-policy", "SGLang: write_through (default), "
                                 "write_through_selective or write_back."),
    "lmcache_chunk_size": _off(Optional[int], "--lmcache-chunk-size", "LMCache: chunk_size in tokens (default 256)."),
    "lmcache_max_local_cpu_size": _off(Optional[float], "--lmcache-max-local-cpu-size", "LMCache: max_local_cpu_size "
                                       "in GiB (default 5.0; needs --model; or --offload-size)."),
    "lmcache_local_disk": _off(Optional[str], "--lmcache-local-disk", "LMCache: local_disk (a path; its size from "
                               "--lmcache-max-local-disk-size or --disk-size)."),
    "lmcache_max_local_disk_size": _off(Optional[float], "--lmcache-max-local-disk-size", "LMCache: "
                                        "max_local_disk_size in GiB (needs --model)."),
    "lmcache_save_unfull_chunk": _off(bool, "--lmcache-save-unfull-chunk", "LMCache: save the prompt's last partial "
                                      "chunk too.", False),
    "lmcache_min_retrieve_tokens": _off(Optional[int], "--lmcache-min-retrieve-tokens", "LMCache: load nothing below "
                                        "this many tokens (default 0)."),
    "offload_bandwidth": _off(Optional[float], "--offload-bandwidth", "--replay timed: GPU <-> host GB/s (default: "
                              "the PCIe / NVLink-C2C link of --gpu, kvsim/costs/links.py)."),
    "disk_bandwidth": _off(Optional[float], "--disk-bandwidth", "--replay timed: LMCache disk GB/s (default 7, one "
                           "NVMe drive)."),
}, _offload)
