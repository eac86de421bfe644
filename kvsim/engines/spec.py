"""What kvsim knows about one engine, in one object: :class:`EngineSpec`.

Every command reaches an engine through its spec: the settings it reads, its two sequential
implementations, its scheduler, its serve adapter, what a one-pass curve or an optimum of its
rules needs, and how reports name it. The built-in specs are
:data:`kvsim.engines.vllm.spec.APC` and :data:`kvsim.engines.sglang.spec.RADIX`; a plugin is
a subclass registered through :mod:`kvsim.engines.registry` (``examples/engines/lfu.py``).
Parts are imported when first used, so naming an engine never loads numba.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

from kvsim.errors import ConfigError

#: the two sequential implementations every engine has
IMPLEMENTATIONS = ("fast", "reference")


def load(path: str) -> Any:
    """``"module:name"`` -> the object."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


class EngineSpec:
    """One engine as kvsim's commands see it. Subclass and fill in the class attributes."""

    name: str = ""                 # the --policy value
    label: str = ""                # "vLLM APC", as reports name it
    short: str = ""                # "APC", in tight places
    release: str = ""              # the release whose rules it restates ("vLLM 0.33.0")
    family: str = ""               # whose request rules, scheduler and metrics it follows: vllm | sglang
    color: str = "#6b7280"         # its colour in figures
    unit: str = "block_size"       # the SimOptions field of its KV unit (block_size | page_size)
    unit_name: str = "block"       # "block" | "page"
    axes: tuple[str, ...] = ()     # SimOptions fields a sweep varies for it
    capacity_column: str = ""      # its own capacity unit in sweep rows (num_gpu_blocks | max_total_tokens)
    extra_keys: tuple[str, ...] = ()   # SimOptions.extra keys its settings read
    curve: str | None = None       # the one-pass curve kind that applies (kvsim.sweep.curves), if any
    curve_exact: bool = False      # the curve gives the exact replay's hits
    optimal: str | None = None     # the offline optimum kind (kvsim.sweep.optimal), if any
    orders: tuple[str, ...] = ()   # scheduler queue orders the "Under load" view compares

    # parts, as "module:name", loaded on use
    settings_type: str = ""        # typed settings: from_options(SimOptions), capacity_tokens
    reference: str = ""            # the readable SequentialCache (stepwise PrefixCache)
    fast: str = ""                 # the fast SequentialCache
    report: str = ""               # replay_report(settings, implementation, cache, work, columns)
    scheduler: str | None = None   # module with scheduler_settings(...) and make_engine(...)
    serve: str | None = None       # the ServeEngine adapter class
    validate: str | None = None    # gpu-validate: build_cache_model(trace, options)
    events: str | None = None      # KV events for fleet routers: module with record, sequential, scheduler_settings

    # -- settings ----------------------------------------------------------------------
    def settings(self, options: Any) -> Any:
        """The engine's typed settings for ``options`` (a ConfigError if a value is bad)."""
        return load(self.settings_type).from_options(options)

    def implementation(self, implementation: str) -> type:
        """The sequential engine class of ``implementation`` ("fast" or "reference")."""
        if implementation not in IMPLEMENTATIONS:
            raise ConfigError(f"unknown implementation {implementation!r} of the {self.name} engine; "
                              f"choose one of {', '.join(IMPLEMENTATIONS)}")
        return load(getattr(self, implementation))

    def replay_report(self) -> Callable:
        return load(self.report)

    def check_sequential(self, options: Any) -> None:
        """Options only some other replay models: a clear error (default: none)."""

    # -- the scheduler ---------------------------------------------------------------------
    def _scheduler(self) -> Any:
        if self.scheduler is None:
            raise ConfigError(f"--replay steps|timed has no scheduler model for {self.name!r}")
        return importlib.import_module(self.scheduler)

    def scheduler_settings(self, options: Any, overrides: dict[str, Any], trace: Any = None) -> tuple[Any, str]:
        """(scheduler settings, which defaults were taken) for ``options``; without a capacity
        the "unlimited" pool holds every request of ``trace`` at once."""
        return self._scheduler().scheduler_settings(options, overrides, trace)

    def make_scheduler(self, settings: Any, **inputs: Any) -> Any:
        """The stepped engine (scheduler + cache) for ``settings`` and the per-request inputs."""
        return self._scheduler().make_engine(settings, **inputs)

    def check_concurrent(self, options: Any) -> None:
        """Options only the sequential models read: a clear error rather than a silent ignore."""
        self._scheduler()

    def has_scheduler(self) -> bool:
        return self.scheduler is not None

    def curve_applies(self, settings: dict[str, Any]) -> bool:
        """Does the one-pass curve describe a replay with these settings (a sweep row's)?"""
        return self.curve is not None

    # -- reports -------------------------------------------------------------------------
    def describe(self, config: dict[str, Any]) -> str:
        """A replay's configuration in a few words: "vLLM APC (block 16)"."""
        return f"{self.label} ({self.unit_name} {config.get(self.unit, '?')})"

    def scheduler_label(self) -> str:
        """Its scheduler model and cache, as a table heading."""
        return f"{self.release} scheduler + {self.short}"

    def curve_gap(self) -> str:
        """Where it has no one-pass curve, in words (the sweep says so)."""
        return f"{self.name}"

    def setting_label(self, row: dict[str, Any]) -> str:
        """A sweep row's settings, short: "apc b16"."""
        return f"{self.name} {self.unit_name[0]}{row.get(self.unit)}"

    def sequential_figures(self, result: Any, hits: int, queries: int) -> dict[str, Any]:
        """Extra summary figures of a sequential replay (the engine's own logged rates)."""
        return {}

    # -- serve ---------------------------------------------------------------------------
    def serve_adapter(self, options: Any, implementation: str = "fast") -> Any:
        """The model behind ``kvsim serve``: one request at a time, as ``simulate`` serves them."""
        if self.serve is None:
            raise ConfigError(f"kvsim serve has no adapter for {self.name!r}")
        if implementation not in IMPLEMENTATIONS:
            raise ConfigError(f"unknown implementation {implementation!r}; choose fast or reference")
        adapter = load(self.serve)(options, implementation)
        adapter.policy = self.name
        return adapter

    # -- KV events (fleets) ------------------------------------------------------------------
    def kv_events(self) -> Any:
        """The module that makes this engine publish its KV events (``record(engine)`` ->
        ``drain()``, ``sequential(spec, settings)``, ``scheduler_settings(settings)``)."""
        if self.events is None:
            raise ConfigError(f"the {self.name} engine publishes no KV events; choose a router that "
                              "needs none (not dynamo mode=events, not llmd_precise)")
        return importlib.import_module(self.events)

    def build_cache_model(self, trace: Any, options: Any) -> Any:
        """gpu-validate's view of the reference model (block tables of running requests)."""
        if self.validate is None:
            raise ConfigError(f"gpu-validate cannot drive {self.name!r}")
        return load(self.validate)(trace, options)
