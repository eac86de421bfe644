"""Gather what the report shows for one trace: ``kvsim analyze``, one-pass curves, exact
replays at the chosen capacity, over capacities and over block sizes; then the charts.

:func:`build_report` returns a :class:`ReportData` (key numbers, sections with charts and
tables, notes) that :mod:`kvsim.report.html` turns into one HTML page. A command that has
already computed part of it (analyze's report, simulate's replays, a sweep) passes it in
and only the rest is computed.

The report covers the engines of ``ReportOptions.policies`` (default: every registered one)
and asks each one's spec (:mod:`kvsim.engines.registry`) how to draw it: an engine with an
exact one-pass curve gets the curve and a few exact replays; any other, exact replays dense
enough to draw as a line (:mod:`kvsim.sweep.dense`); its optimum where its spec names one.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from kvsim.analyze.options import DEFAULT_BLOCK_SIZES
from kvsim.engines import registry
from kvsim.errors import ConfigError
from kvsim.io.trace.columns import NONE, Trace
from kvsim.engines.options import SimOptions
from kvsim.report import figures as F
from kvsim.report import text as T
from kvsim.report.document import Chart, KeyNumber, ReportData, Section, Table
from kvsim.sweep.curves import capacity_for_share

Say = Callable[[str], None]
CAPACITY_POINTS = 7          # exact replays along the capacity axis of an engine drawn by its exact curve
DENSE_POINTS = 16            # exact replays along the capacity axis of any other engine to start with (its line),
DENSE_STEP = 0.01            # then more wherever neighbours differ by more than this,
DENSE_MAX_POINTS = 96        # up to this many (twice DENSE_POINTS for logs of DENSE_BIG_TOKENS and more)
DENSE_BIG_TOKENS = 20_000_000
#: a batch of exact replays of at least this many prompt tokens in all (replays x the log's
#: prompt tokens) runs on every core by default; a smaller one in this process, where the
#: worker pool's start would cost more than it saves (docs/performance.md, "The report")
PARALLEL_MIN_TOKENS = 2_000_000
OPTIMAL_POINTS = 48          # capacities of each optimal curve
NEAR_OPTIMAL = 0.9           # "reaches 90% of the optimum"
MAX_GROUPS = 12              # bars per grouping panel
#: the sweep's list argument of each SimOptions setting an engine may read
SWEEP_LISTS = {"block_size": "block_sizes", "page_size": "page_sizes", "eviction_policy": "eviction_policies"}


@dataclass
class ReportOptions:
    """What to put in the report. ``sim`` carries the chosen capacity and engine settings;
    without a capacity in it, the report uses the KV needed for ``target_share`` of the
    upper bound (from the exact curve of the first engine that has one)."""

    sim: SimOptions = field(default_factory=SimOptions)
    block_sizes: tuple[int, ...] = DEFAULT_BLOCK_SIZES
    top: int = 10
    show_text: bool = False
    model: str | None = None                 # GiB figures (default: sim.model)
    calibration: Any = None                  # kvsim.gpu.calibration.Calibration
    gpu_results: Path | None = None          # gpu_validate.json of kvsim gpu-validate
    jobs: int | None = None                  # parallel replays (None: every core for large batches)
    target_share: float = 0.9
    curve_points: int = 96
    title: str | None = None
    command: str | None = None               # the command line, shown in the notes
    warmup: Any = None                       # kvsim.warmup: first requests fill the cache, are not counted
    concurrent: bool = True                  # the "Under load" section (kvsim.report.concurrent)
    speedup: float = 1.0                     # its arrivals, this many times faster than logged
    fleet: Any = None                        # kvsim.fleet.config.FleetSpec: the Fleet section (docs/fleet.md)
    offload: dict[str, Any] | None = None    # tier options (SimOptions.extra keys): the Memory tiers section
    policies: Any = None                     # the engines: names, a comma list or "all" (None: all)

    def __post_init__(self) -> None:
        if not 0 < self.target_share < 1:
            raise ConfigError(f"target share must be in (0, 1), got {self.target_share!r}")
        if not self.speedup > 0:
            raise ConfigError(f"--speedup must be positive, got {self.speedup!r}")
        self.block_sizes = tuple(sorted({int(b) for b in self.block_sizes}))
        if not self.block_sizes or self.block_sizes[0] < 1:
            raise ConfigError("block sizes must be positive integers")
        if self.model is None:
            self.model = self.sim.model
        from kvsim.warmup import parse_warmup

        self.warmup = parse_warmup(self.warmup)
        self.policies = _policies(self.policies)
        if self.offload:   # bad tier settings fail before any log is read (docs/offload.md)
            from kvsim.report.offload import tier_engines

            tier_engines(self.sim, self.offload, self.policies)


def _policies(given: Any) -> tuple[str, ...]:
    """The report's engines, in order, each once."""
    text = "all" if given is None else given if isinstance(given, str) else ",".join(given)
    names = tuple(dict.fromkeys(registry.resolve_policies(text)))
    if not names:
        raise ConfigError("the report needs at least one engine (--policy)")
    return names


def build_report(trace: Trace, options: ReportOptions | None = None, *, analysis: dict[str, Any] | None = None,
                 runs: dict[str, Any] | None = None, sweep_result: Any = None,
                 progress: Say | None = None) -> ReportData:
    """Compute (or reuse) every figure of the report for ``trace``.

    ``analysis``: ``AnalysisReport.to_dict()`` of this trace; ``runs``: policy ->
    ReplayResult replayed with ``options.sim`` (used when it names a capacity);
    ``sweep_result``: a :class:`kvsim.sweep.SweepResult` whose rows and curves replace the
    report's own capacity sweep. ``progress`` receives one line per phase.
    """
    return _Builder(trace, options or ReportOptions(), progress).build(analysis, runs, sweep_result)


def has_capacity(sim: SimOptions) -> bool:
    """Does ``sim`` name a capacity (else the replay would be unlimited)?"""
    return any(v is not None for v in (sim.capacity_tokens, sim.num_gpu_blocks, sim.max_total_tokens,
                                       sim.kv_cache_memory)) or bool(sim.model and sim.gpu)


@dataclass(frozen=True)
class _Chosen:
    """One engine at the report's settings, as the sweep's optimum builder reads a sweep point."""

    policy: str
    block_size: int
    page_size: int
    sim: SimOptions

    def options(self) -> SimOptions:
        return self.sim


class _Builder:
    def __init__(self, trace: Trace, opts: ReportOptions, progress: Say | None) -> None:
        self.trace = trace
        self.opts = opts
        self.say = progress or (lambda _msg: None)
        self.t0 = time.perf_counter()
        self.kv_bytes = None
        if opts.model is not None:
            from kvsim.models import get_model

            self.kv_bytes = int(get_model(opts.model).kv_bytes_per_token())
        self.notes: list[str] = []
        self.specs = [registry.engine(p) for p in opts.policies]
        self.names = [s.name for s in self.specs]
        self.colors = {s.name: s.color for s in self.specs}
        self._to_draw: list[tuple[Chart, Any]] = []   # charts whose PNG is not drawn yet, with their figures

    def _phase(self, text: str) -> None:
        self.say(f"[{time.perf_counter() - self.t0:5.1f} s] {text}")

    # -- computation ---------------------------------------------------------------------
    def build(self, analysis: dict[str, Any] | None, runs: dict[str, Any] | None, sweep_result: Any) -> ReportData:
        tr, o = self.trace, self.opts
        tr.require_tokens("a report")
        if analysis is None:
            from kvsim.analyze import AnalyzeOptions, analyze

            self._phase(f"analyzing {len(tr):,} requests ({tr.num_prompt_tokens:,} prompt tokens)")
            analysis = analyze(tr, AnalyzeOptions(block_sizes=o.block_sizes, top=o.top, show_text=o.show_text,
                                                  model=o.model, progress=True, warmup=o.warmup)).to_dict()
        self.an = analysis
        self._phase("one-pass hit-rate curves")
        self.models = self._curve_models()
        self.exact_curves = [s.name for s in self.specs if s.curve_exact and self.models[s.name] is not None]
        self.target_caps = {p: (capacity_for_share(m, o.target_share) if m is not None else None)
                            for p, m in self.models.items()}
        self.yardstick = self._yardstick()
        self.chosen_sim, self.chosen_source = self._chosen_options()
        self.runs = self._chosen_runs(runs)
        self.caps = {p: _cap(r.capacity_tokens) for p, r in self.runs.items()}
        self._phase("exact replays along the capacity axis" if sweep_result is None else "reading the sweep")
        cap_series, cap_rows = self._capacity_series(sweep_result)
        self._phase("exact replays over block and page sizes")
        block_series = self._block_series()
        self._phase("prefix tree and isolation replays")
        from kvsim.report.prefix_tree import icicle_layout

        tree = icicle_layout(tr, (analysis.get("prefixes") or {}).get("top", []))
        groups = self._group_panels()
        load = self._load_section() if o.concurrent else None
        self._phase("drawing the charts")
        sections = [
            self._capacity_section(cap_series, cap_rows),
            self._block_section(block_series),
            self._fraction_section(),
            load,
            self._divergence_section(),
            self._prefix_section(tree),
            self._group_section(groups),
            self._recommendation_section(),
        ]
        if o.fleet is not None:
            sections.append(self._fleet_section())
        if o.offload:
            sections.append(self._offload_section())
        if o.gpu_results is not None:
            sections.append(self._gpu_section())
        sections.append(self._notes_section())
        sections = [s for s in sections if s is not None]
        key, numbers = self._key_numbers()
        title = o.title or f"kvsim report: {', '.join(Path(s).name for s in tr.meta.sources) or 'trace'}"
        subtitle = T.trace_line(analysis["shape"])
        self._draw_charts()
        self._phase(f"{sum(len(s.charts) for s in sections)} charts ready")
        return ReportData(title, subtitle, key, sections, self.notes, numbers)

    def _curve_models(self) -> dict[str, Any]:
        """Each engine's one-pass curve at the report's settings (None: it has none, or none that
        models these settings)."""
        from kvsim.sweep.curves import curve_model
        from kvsim.warmup import as_fraction

        sim = self.opts.sim
        warm = as_fraction(len(self.trace), self.opts.warmup)
        models: dict[str, Any] = {}
        for s in self.specs:
            applies = s.curve is not None and s.curve_applies(T.config(s.name, sim))
            models[s.name] = (curve_model(self.trace, s.name, block_size=sim.block_size, page_size=sim.page_size,
                                          eviction_policy=sim.eviction_policy, engine_version=sim.engine_version,
                                          warmup=warm) if applies else None)
        return models

    def _yardstick(self) -> tuple[str | None, Any]:
        """(engine, curve) the capacity for the target share is read from: the first engine with
        an exact curve; with none, block LRU over the trace's blocks (its exact one-pass curve)."""
        if self.exact_curves:
            return self.exact_curves[0], self.models[self.exact_curves[0]]
        from kvsim.sweep.curves import block_lru_curve
        from kvsim.warmup import as_fraction

        block = self.opts.sim.block_size
        return None, block_lru_curve(self.trace, block, warmup=as_fraction(len(self.trace), self.opts.warmup))

    def _yardstick_name(self) -> str:
        return f"a block LRU cache of {self.yardstick[1].unit_tokens}-token blocks"

    def _target(self) -> float | None:
        """The capacity for the target share, from the yardstick curve."""
        source, curve = self.yardstick
        return self.target_caps[source] if source is not None else capacity_for_share(curve, self.opts.target_share)

    def _chosen_options(self) -> tuple[SimOptions, str]:
        sim = self.opts.sim
        if has_capacity(sim):
            return sim, "given"
        cap = self._target()
        if cap is None:
            self.notes.append("Nothing in this trace is reused, so there is no capacity for a share of the upper "
                              "bound: the report replays with an unlimited cache.")
            return replace(sim, capacity_tokens=math.inf), "unlimited (nothing is reused)"
        source = f"the KV needed for {self.opts.target_share:.0%} of the upper bound"
        if self.yardstick[0] is None:
            self.notes.append(f"No engine in this report has an exact one-pass curve, so the chosen capacity is the KV "
                              f"{self._yardstick_name()} needs for {self.opts.target_share:.0%} of its unlimited hit "
                              "rate (its one-pass curve, exact for that store).")
            source += " (block LRU curve)"
        return replace(sim, capacity_tokens=cap), source

    def _chosen_runs(self, runs: dict[str, Any] | None) -> dict[str, Any]:
        from kvsim.drive.simulate import run_simulation

        have = dict(runs or {}) if self.chosen_source == "given" else {}
        missing = [p for p in self.names if p not in have]
        if missing:
            self._phase(f"replaying {' and '.join(missing)} at the chosen capacity")
            have.update(run_simulation(self.trace, missing, self.chosen_sim))
        return self._counted({p: have[p] for p in self.names})

    def _counted(self, runs: dict[str, Any]) -> dict[str, Any]:
        """The runs with the warm-up window left out of their figures."""
        from kvsim.warmup import apply_warmup

        apply_warmup(runs, len(self.trace), self.opts.warmup)
        return runs

    def _sweep(self, policy: str, capacities: list[float], **lists: list[Any]):
        """Exact replays of ``policy`` at ``capacities``, at the report's settings but for
        ``lists`` (a setting -> the values to replay)."""
        from kvsim.sweep import sweep

        sim = self.opts.sim
        settings = {name: [getattr(sim, name)] for name in SWEEP_LISTS} | lists
        grid = {SWEEP_LISTS[name]: values for name, values in settings.items()}
        extra = {"engine_version": sim.engine_version} if sim.engine_version else {}
        replays = len(capacities) * math.prod(map(len, lists.values()))
        return sweep(self.trace, policy, capacities, jobs=self._jobs(replays), curves=False, warmup=self.opts.warmup,
                     optimal=False, **grid, **extra).frame

    def _jobs(self, replays: int) -> int | None:
        """Worker processes for a batch of ``replays`` (None: one per core): ``--jobs`` if given."""
        if self.opts.jobs is not None:
            return self.opts.jobs
        return None if replays * self.trace.num_prompt_tokens >= PARALLEL_MIN_TOKENS else 1

    def _capacity_range(self) -> tuple[float, float]:
        """The capacity axis: from where the yardstick curve is exact (and every engine drawn by
        its replays admits every request) to well past saturation."""
        source, yard = self.yardstick
        lo = float(max(yard.extra.get("min_exact_tokens", yard.unit_tokens), 16))
        if source is None:   # the largest request fits
            lo = max(lo, float((self.trace.prompt_lengths + self.trace.output_lengths).max(initial=0)))
        for p in self._replayed():
            m = self.models[p]
            if m is not None and len(m.den_thr):
                lo = max(lo, float(m.den_thr[-1]))
        models = [m for m in (yard, *self.models.values()) if m is not None]
        sat = max(float(m.saturation_units * m.unit_tokens) for m in models)
        return lo, max(sat * 1.5, lo * 8)

    def _replayed(self) -> list[str]:
        """The engines the capacity chart draws by their exact replays (no exact curve)."""
        return [p for p in self.names if p not in self.exact_curves]

    def _capacity_series(self, sweep_result: Any) -> tuple[list[dict[str, Any]], list[list[str]]]:
        self.optimal = self._optimal_models(sweep_result)
        if sweep_result is not None:
            return self._series_from_sweep(sweep_result)
        lo, hi = self._capacity_range()
        chosen = sorted({c for c in self.caps.values() if math.isfinite(c)})
        replays = {p: (self._curve_replays(p, lo, hi, chosen) if p in self.exact_curves
                       else self._dense_replays(p, lo, hi, chosen)) for p in self.names}
        series = [self._curve_series(p, lo, hi) for p in self.exact_curves]
        self.inside: dict[str, np.ndarray] = {}
        for p, (x, y) in replays.items():
            series += self._replay_series(p, x, y, lo, hi)
        from kvsim.sweep.dense import largest_step

        self.steps = {p: largest_step(replays[p][1][self.inside[p]]) for p in self._replayed()}
        self.curve_error = {p: float(np.abs(self.models[p].hit_rate(replays[p][0]) - replays[p][1]).max())
                            for p in self.exact_curves}
        opt_x = np.unique(np.geomspace(lo, hi, OPTIMAL_POINTS).round())
        series += [self._optimal_series(p, opt_x) for p in self.optimal]
        self.near: dict[str, float | None] = {p: self._near(p, opt_x, *replays[p]) for p in self.optimal}
        return series, self._capacity_rows(replays)

    def _curve_series(self, policy: str, lo: float, hi: float) -> dict[str, Any]:
        xs, ys = self.models[policy].grid(self.opts.curve_points, lo_tokens=lo, hi_tokens=hi)
        return {"policy": policy, "label": f"{T.policy_label(policy, self.opts.sim)}: one-pass curve (exact)",
                "setting": policy, "kind": "curve", "capacity_tokens": xs, "hit_rate": ys}

    def _curve_replays(self, policy: str, lo: float, hi: float, chosen: list[float]) -> tuple[np.ndarray, np.ndarray]:
        """A few exact replays beside an exact curve (and at the chosen capacities)."""
        caps = sorted({float(round(c / 16) * 16) for c in np.geomspace(lo, hi / 1.5, CAPACITY_POINTS)} | set(chosen))
        frame = self._sweep(policy, caps)
        return frame["capacity_tokens"].to_numpy(np.float64), frame["token_hit_rate"].to_numpy(np.float64)

    def _dense_replays(self, policy: str, lo: float, hi: float, chosen: list[float]) -> tuple[np.ndarray, np.ndarray]:
        """No one-pass model tracks this engine within a point: its exact replays, dense enough
        that neighbours differ by at most DENSE_STEP (kvsim.sweep.dense)."""
        from kvsim.sweep.dense import dense_capacities

        def rates(batch: list[float]) -> list[float]:
            return self._sweep(policy, batch)["token_hit_rate"].tolist()

        big = self.trace.num_prompt_tokens >= DENSE_BIG_TOKENS   # replays take seconds each: fewer
        return dense_capacities(rates, lo, hi / 1.5, start=DENSE_POINTS, step=DENSE_STEP,
                                max_points=DENSE_POINTS * 2 if big else DENSE_MAX_POINTS, extra=chosen)

    def _replay_series(self, policy: str, x: np.ndarray, y: np.ndarray, lo: float, hi: float) -> list[dict[str, Any]]:
        """The exact replays of ``policy``: markers beside its curve, else a joined line (a chosen
        capacity outside the range as a marker of its own)."""
        label = T.policy_label(policy, self.opts.sim)
        if policy in self.exact_curves:
            return [{"policy": policy, "label": f"{label}: exact replays", "setting": policy, "kind": "exact",
                     "capacity_tokens": x, "hit_rate": y}]
        inside = (x >= lo - 16) & (x <= hi)   # a chosen capacity below the range stands alone
        self.inside[policy] = inside
        out = [{"policy": policy, "label": f"{label}: exact replays at {int(inside.sum())} capacities, joined",
                "setting": policy, "kind": "joined", "capacity_tokens": x[inside], "hit_rate": y[inside]}]
        if not inside.all():
            out.append({"policy": policy, "label": f"{label}: exact replay", "setting": policy, "kind": "exact",
                        "capacity_tokens": x[~inside], "hit_rate": y[~inside]})
        return out

    def _near(self, policy: str, opt_x: np.ndarray, x: np.ndarray, y: np.ndarray) -> float | None:
        """Where ``policy`` comes within NEAR_OPTIMAL of its optimum: along its curve, else
        along its replays."""
        optimum = self.optimal[policy]
        if policy in self.exact_curves:
            return _near_optimal(opt_x, self.models[policy].hit_rate(opt_x), optimum.hit_rate(opt_x))
        inside = self.inside[policy]
        return _near_optimal(x[inside], y[inside], optimum.hit_rate(x[inside]))

    def _capacity_rows(self, replays: dict[str, tuple[np.ndarray, np.ndarray]]) -> list[list[str]]:
        """The table under the capacity chart: every replayed capacity, each engine's hit rate
        and optimum there, and the exact curves."""
        rows = []
        for cap in sorted(set().union(*(set(x) for x, _ in replays.values()))):
            cells = []
            for p, (xs, ys) in replays.items():
                hit = ys[xs == cap]
                cells.append(T.pct(float(hit[0]) if len(hit) else None))
                if p in self.optimal:
                    cells.append(T.pct(float(self.optimal[p].hit_rate([cap])[0])))
            curves = [T.pct(float(self.models[p].hit_rate([cap])[0])) for p in self.exact_curves]
            rows.append([T.tokens(cap), T.gib(cap, self.kv_bytes), *cells, *curves])
        return rows

    def _optimal_models(self, sweep_result: Any) -> dict[str, Any]:
        """The optimum of each engine that has one, at the report's block / page size (the sweep's, if given)."""
        want = [s.name for s in self.specs if s.optimal]
        if sweep_result is not None and getattr(sweep_result, "optimal", None):
            found = {o.engine: o.model for o in sweep_result.optimal if o.model is not None}
            if set(want) <= set(found):
                return {p: found[p] for p in want}
        from kvsim.sweep.optimal_rows import build_model, model_key

        sim = self.chosen_sim
        return {p: build_model(self.trace, model_key(_Chosen(p, sim.block_size, sim.page_size, sim)), self.opts.warmup)
                for p in want}

    def _optimal_series(self, policy: str, caps: np.ndarray) -> dict[str, Any]:
        model = self.optimal[policy]
        size = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in model.settings.items() if k.endswith("size"))
        return {"policy": policy, "label": f"{T.short(policy)} optimum (any eviction, {size})",
                "setting": f"optimal-{policy}", "kind": "optimal", "capacity_tokens": caps,
                "hit_rate": model.hit_rate(caps)}

    def _series_from_sweep(self, result: Any) -> tuple[list[dict[str, Any]], list[list[str]]]:
        series: list[dict[str, Any]] = []
        lo, _ = self._capacity_range()
        for c in result.curves:
            if c.policy not in self.names:
                continue
            setting = T.setting_label(c.policy, c.settings)
            what = "exact" if T.spec(c.policy).curve_exact else "estimate"
            keep = c.capacity_tokens >= lo  # below, the largest requests are rejected
            series.append({"policy": c.policy, "label": f"{setting}: one-pass curve ({what})", "setting": setting,
                           "kind": "curve", "capacity_tokens": c.capacity_tokens[keep], "hit_rate": c.hit_rate[keep]})
        for o in getattr(result, "optimal", []):
            size = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in o.settings.items() if k.endswith("size"))
            keep = o.capacity_tokens >= lo
            series.append({"policy": o.engine, "label": f"{T.short(o.engine)} optimum (any eviction, {size})",
                           "setting": f"optimal-{o.engine}-{size}", "kind": "optimal",
                           "capacity_tokens": o.capacity_tokens[keep], "hit_rate": o.hit_rate[keep]})
        frame = result.frame
        rows = []
        keys = ["policy", "block_size", "page_size", "eviction_policy"]
        self.near = {}
        for _key, sub in frame.groupby(keys, dropna=False, sort=False):
            first = sub.iloc[0].to_dict()
            setting = T.setting_label(first["policy"], first)
            x = sub["capacity_tokens"].to_numpy(np.float64)
            y = sub["token_hit_rate"].to_numpy(np.float64)
            series.append({"policy": first["policy"], "label": f"{setting}: exact replays", "setting": setting,
                           "kind": "exact", "capacity_tokens": x, "hit_rate": y})
            if "optimal_hit_rate" in sub and first["policy"] not in self.near and T.spec(first["policy"]).optimal:
                order = np.argsort(x)
                self.near[first["policy"]] = _near_optimal(x[order], y[order],
                                                           sub["optimal_hit_rate"].to_numpy(np.float64)[order])
            for row in sub.to_dict(orient="records"):
                rows.append([T.tokens(row["capacity_tokens"]), T.gib(row["capacity_tokens"], self.kv_bytes),
                             setting, T.pct(row["token_hit_rate"]), T.pct(row.get("optimal_hit_rate")),
                             T.pct(row.get("curve_hit_rate"))])
        self.curve_error = {}
        self.sweep_table = True
        return series, rows

    def _block_series(self) -> list[dict[str, Any]]:
        sim = self.opts.sim
        sizes = list(self.opts.block_sizes)
        series = []
        self.block_rates = {}
        for s in self.specs:
            units = sorted({1, *sizes}) if s.unit_name == "page" else sizes   # pages also at 1: token level
            frame = self._sweep(s.name, [self.caps[s.name]], **{s.unit: units})
            got = frame[s.unit].astype(int)
            self.block_rates[s.name] = dict(zip(got, frame["token_hit_rate"]))
            series.append({"policy": s.name, "label": T.unit_series_label(s.name, sim), "sizes": got.tolist(),
                           "hit_rate": frame["token_hit_rate"].tolist()})
        ub = self.an["upper_bound"]
        bound_sizes = [1] + [b["block_size"] for b in ub["blocks"]]
        bound_rates = [ub["token"]["token_weighted_recompute"]] + [b["token_weighted_recompute"] for b in ub["blocks"]]
        series.append({"policy": "bound", "label": "unlimited cache (upper bound, last token recomputed)",
                       "sizes": bound_sizes, "hit_rate": bound_rates, "dashed": True})
        return series

    def _group_panels(self) -> list[dict[str, Any]]:
        from kvsim.drive.metrics import breakdown
        from kvsim.drive.simulate import run_simulation

        tr = self.trace
        present = {c: len(np.unique(getattr(tr, c))) > 1 for c in ("tenant", "cache_salt", "lora")}
        columns = [c for c in ("tenant", "cache_salt", "lora") if present[c]]
        if present["tenant"] and present["cache_salt"]:
            columns.remove("cache_salt")
        if not columns:
            return []
        n = len(tr)
        counterfactual = {}
        if (tr.cache_salt != NONE).any():
            counterfactual["salt"] = replace(tr, cache_salt=np.full(n, NONE, np.int32), salt_names=[])
        if (tr.lora != NONE).any():
            counterfactual["lora"] = replace(tr, lora=np.full(n, NONE, np.int32), lora_names=[])
        shared_runs = {k: self._counted(run_simulation(t, list(self.names), self.chosen_sim))
                       for k, t in counterfactual.items()}
        self.isolation_overall = {k: {p: _hit_rate(r[p], tr) for p in self.names} for k, r in shared_runs.items()}
        panels = []
        for column in columns:
            which = "lora" if column == "lora" else "salt"
            base = {p: breakdown(self.runs[p], tr, column) for p in self.names}
            first = base[self.names[0]]
            order = first.sort_values("prompt_tokens", ascending=False).index[:MAX_GROUPS]
            series = []
            for p in self.names:
                series.append({"policy": p, "label": T.policy_label(p, self.chosen_sim),
                               "values": base[p].loc[order, "token_hit_rate"].tolist()})
                if which in shared_runs:
                    alt = breakdown(shared_runs[which][p], tr, column)
                    series.append({"policy": p, "hatched": True,
                                   "label": f"{T.short(p)}, {T.IGNORED[which]}",
                                   "values": alt.loc[order, "token_hit_rate"].tolist()})
            panels.append({"title": f"by {T.COLUMN_NAMES[column]}" + (
                f" (largest {MAX_GROUPS} of {len(first)})" if len(first) > MAX_GROUPS else ""),
                "xlabel": f"{T.COLUMN_NAMES[column]} [name]", "groups": [str(g) for g in order],
                "series": series, "column": column, "which": which})
        return panels

    # -- sections ------------------------------------------------------------------------
    def _fleet_section(self) -> Section:
        """N replicas of each engine behind the router, at the chosen capacity per replica."""
        from kvsim.engines import registry
        from kvsim.fleet.sequential import run_fleet_simulation
        from kvsim.report.fleet import fleet_section

        self._phase(f"replaying fleets: {self.opts.fleet.describe()}")
        runs = run_fleet_simulation(self.trace, list(self.runs), self.chosen_sim, self.opts.fleet)
        fleets = {name: run.fleet_summary(self.trace) for name, run in runs.items()}
        return fleet_section(fleets, {name: registry.engine(name).label for name in fleets}, self._chart)

    def _offload_section(self) -> Section:
        """Each engine of the tier's family with the tier, at the chosen capacity (docs/offload.md)."""
        from kvsim.report.offload import offload_section, tier_engines, tier_summaries, timed_tiers

        names = [p for p in tier_engines(self.chosen_sim, self.opts.offload, self.names) if p in self.runs]
        if any(not math.isfinite(self.caps[p]) for p in names):
            self.tiers = None
            return Section("offload", f"Memory tiers: --offload {self.opts.offload['offload']}", paragraphs=[
                "No tier section: the chosen capacity is unlimited, so nothing is evicted to a tier."])
        self._phase(f"replaying {' and '.join(names)} with the --offload {self.opts.offload['offload']} tier")
        summaries = tier_summaries(self.trace, names, self.chosen_sim, self.opts.offload, self.opts)
        timed = timed_tiers(self.trace, names, self.chosen_sim, self.opts.offload, self.opts)
        self.tiers = {p: {**summaries[p], **({"timed": timed[p]} if p in timed else {})} for p in names}
        return offload_section(summaries, {p: registry.engine(p).label for p in names}, dict(self.caps),
                               {p: _hit_rate(self.runs[p], self.trace) for p in names}, self._chart, timed)

    def _chart(self, name: str, fig: Any, caption: str, alt: str) -> Chart:
        """A chart of ``fig``; its PNG is drawn with the others at the end (:meth:`_draw_charts`)."""
        title = fig.axes[0].get_title(loc="left") if fig.axes else name
        if getattr(fig, "_suptitle", None) is not None:
            title = fig._suptitle.get_text()
        chart = Chart(name, title, caption, b"", alt)
        self._to_draw.append((chart, fig))
        return chart

    def _draw_charts(self) -> None:
        """Draw the PNG of every chart made so far: every other one in a forked child, beside
        this process, where a second core is free (:class:`kvsim.drive.side.Side`; else in
        turn). Matplotlib draws a figure to the same bytes in either process (tests/test_report.py)."""
        from kvsim.drive.side import Side

        todo, self._to_draw = self._to_draw, []
        figs = [fig for _, fig in todo]
        pngs: list[bytes] = [b""] * len(figs)
        if len(figs) < 4:   # (a child for one chart costs more than it saves)
            pngs = [F.png_bytes(f) for f in figs]
        else:
            theirs = figs[1::2]
            with Side(lambda here: [F.png_bytes(f) for f in theirs]) as side:
                pngs[0::2] = [F.png_bytes(f) for f in figs[0::2]]
                pngs[1::2] = side.result()
        for (chart, _), png in zip(todo, pngs):
            chart.png = png

    def _cap_text(self, policy: str) -> str:
        return T.capacity_text(self.caps[policy], self.kv_bytes)

    def _one_capacity(self) -> bool:
        """Do all engines replay at the same capacity?"""
        return len(set(self.caps.values())) == 1

    def _caps_text(self) -> str:
        """The chosen capacity, or each engine's when they differ."""
        if self._one_capacity():
            return self._cap_text(self.names[0])
        return ", ".join(f"{T.short(p)} {self._cap_text(p)}" for p in self.names)

    def _capacity_section(self, series: list[dict[str, Any]], rows: list[list[str]]) -> Section:
        bound = self.an["bound"]
        bounds = {f"unlimited cache, token level ({T.pct(bound['radix'])})": bound["radix"],
                  f"unlimited cache, APC block 16 ({T.pct(bound['block16'])})": bound["block16"]}
        chosen = {"bound": self.caps[self.names[0]]} if self._one_capacity() else self.caps
        near = getattr(self, "near", {})
        marks = {p: (f"{T.short(p)} stays within {NEAR_OPTIMAL:.0%} of its optimum from", c)
                 for p, c in near.items()}
        fig = F.capacity_chart(series, bounds, chosen=chosen, kv_bytes_per_token=self.kv_bytes, marks=marks,
                               colors=self.colors)
        from_sweep = getattr(self, "sweep_table", False)
        caption = T.capacity_caption(self.target_caps, self.opts.target_share, self.curve_error,
                                     from_sweep=from_sweep, near=near, near_share=NEAR_OPTIMAL,
                                     steps=getattr(self, "steps", {}), yardstick=self._yardstick_reach())
        chart = self._chart("capacity", fig, caption, T.capacity_alt(self.names))
        memory = ["memory"] if self.kv_bytes is not None else []
        if self.kv_bytes is None:  # no model: the memory column would be empty
            rows = [r[:1] + r[2:] for r in rows]
        if from_sweep:
            table = Table("Exact replays of the sweep, the optimum, and the one-pass estimate where available",
                          ["capacity (tokens)", *memory, "setting", "hit rate", "optimum", "one-pass"], rows)
        else:
            table = Table(T.capacity_table_caption(bool(self.optimal), self.exact_curves),
                          ["capacity (tokens)", *memory, *self._capacity_columns()], rows)
        charts = [chart]
        lab = self._block_policies_chart()
        if lab is not None:
            charts.append(lab)
        return Section("capacity", "Hit rate vs cache capacity", charts=charts, tables=[table],
                       paragraphs=[T.CAPACITY_INTRO, T.OPTIMAL_INTRO])

    def _capacity_columns(self) -> list[str]:
        """The columns of :meth:`_capacity_rows`."""
        cols = []
        for p in self.names:
            cols += [f"{T.short(p)} hit rate"] + ([f"{T.short(p)} optimum"] if p in self.optimal else [])
        return cols + [f"{T.short(p)} one-pass" for p in self.exact_curves]

    def _yardstick_reach(self) -> str | None:
        """The capacity caption's words for the yardstick curve, when it is no engine's."""
        if self.yardstick[0] is not None or self._target() is None:
            return None
        return f"{self._yardstick_name()} (one-pass) at {T.human(self._target())} tokens"

    def _block_policies_chart(self) -> Chart | None:
        """kvcache-lab's view: block FIFO, block LRU and the optimum of a block store."""
        from kvsim.sweep.curves import block_lru_curve
        from kvsim.sweep.kvcache_lab import block_events, lab_hit_rates
        from kvsim.sweep.optimal import block_optimal
        from kvsim.warmup import as_fraction, parse_warmup

        tr = self.trace
        B = int(tr.meta.hash_block_size or self.opts.sim.block_size)
        tail = "drop" if "kvcache-tester" in tr.meta.formats else "weighted"
        events = block_events(tr, B, tail)
        distinct = events.unique_in(len(tr))
        if distinct < 2:
            return None
        units = np.unique(np.geomspace(1, distinct * 1.2, 40).round().astype(np.int64))
        window = parse_warmup(self.opts.warmup)
        fifo = lab_hit_rates(tr, "fifo", units, B, window, tail)
        lru_model = block_lru_curve(tr, B, warmup=as_fraction(len(tr), window))
        opt = block_optimal(tr, B, warmup=window, tail=tail)
        xs = units * B
        series = [
            {"policy": "block-fifo", "label": "block FIFO (kvcache-lab's)", "setting": "fifo", "kind": "joined",
             "capacity_tokens": xs, "hit_rate": fifo},
            {"policy": "block-lru", "label": "block LRU (leaf-first, one pass)", "setting": "lru", "kind": "curve",
             "capacity_tokens": xs, "hit_rate": lru_model.hit_rate_at_units(units)},
            {"policy": "optimal", "label": "optimum of a block store (any eviction, bypass)", "setting": "opt",
             "kind": "optimal", "capacity_tokens": xs, "hit_rate": opt.hit_rate(xs)},
        ]
        ceiling = opt.at(None).hit_rate
        fig = F.capacity_chart(series, {f"unlimited ({T.pct(ceiling)})": ceiling}, kv_bytes_per_token=self.kv_bytes,
                               title=f"Block-level policies, as kvcache-lab draws them ({B}-token blocks)")
        caption = T.block_policies_caption(B, tail, window.describe(len(tr)) if window.active else None,
                                           opt.exact)
        return self._chart("block_policies", fig, caption, "Line chart of token hit rate against cache capacity "
                           "for block FIFO, block LRU and the optimum of a block store")

    def _block_section(self, series: list[dict[str, Any]]) -> Section:
        cap = self._caps_text()
        title, xlabel = T.unit_axis(self.names)
        fig = F.block_size_chart(series, f"capacity {cap}", title=title, xlabel=xlabel, colors=self.colors)
        caption = T.block_caption(self.block_rates, cap)
        alt = "Line chart of token hit rate against " + T.and_list(
            f"{s.short} {s.unit_name} size" for s in self.specs)
        return Section("block-size", "Hit rate vs block size", charts=[self._chart("block_size", fig, caption, alt)],
                       paragraphs=[T.BLOCK_INTRO])

    def _fraction_section(self) -> Section:
        fractions = {p: _fractions(self.runs[p], self.trace) for p in self.names}
        labels = {p: f"{T.policy_label(p, self.chosen_sim)} at {self._cap_text(p)}" for p in self.names}
        fig = F.cached_fraction_chart(fractions, labels, colors=self.colors)
        caption = T.fraction_caption(fractions)
        return Section("cached-fraction", "Cached share per request", charts=[self._chart(
            "cached_fraction", fig, caption, "Histogram of the cached share of each request's prompt")])

    def _load_section(self) -> Section:
        from kvsim.report.concurrent import concurrent_section

        section, self.concurrent = concurrent_section(self.trace, self.chosen_sim, self.runs, self.opts,
                                                      self._chart, self._phase)
        return section

    def _divergence_section(self) -> Section:
        dv = self.an.get("divergence") or {}
        h = dv.get("histogram")
        if not h:
            return Section("divergence", "Where sharing stops", paragraphs=["No divergence data for this trace."])
        shown = [b for b in h["bins"] if b["requests"] or b["from"] == 0]
        vol = dv.get("volatile") or {}
        sites = vol.get("sites") or []
        marks: dict[int, str] = {}
        for k, s in enumerate(sites, 1):
            for j, b in enumerate(shown):
                if b["from"] <= s["offset"] <= (b["to"] if b["to"] is not None else math.inf):
                    marks[j] = (marks[j] + ", " if j in marks else "site ") + f"#{k}"
        fig = F.divergence_chart([b["label"] for b in shown], [b["requests"] for b in shown],
                                 h["requests_whole_prompt_seen"], marks)
        caption = T.divergence_caption(h, sites)
        section = Section("divergence", "Where sharing stops, and what breaks it", charts=[self._chart(
            "divergence", fig, caption, "Bar chart of the token position where each request stops sharing")])
        section.footer.append(T.divergence_summary(h))
        if dv.get("volatile") is None:
            section.footer.append("Volatile-content detection does not apply to this trace (hash-id traces: "
                                  "their ids are prefix-chained).")
        elif not sites:
            section.footer.append("Volatile content: none found (no place where requests that share a prefix "
                                  "differ briefly and then share again).")
        else:
            section.tables.append(T.volatile_table(sites))
            if vol.get("all_moved_bound"):
                section.footer.append(T.moved_summary(vol, self.an["bound"]))
        return section

    def _prefix_section(self, tree: dict[str, Any]) -> Section:
        fig = F.prefix_tree_chart(tree["segments"], tree["namespaces"], tree["total_requests"],
                                  tree["max_depth_tokens"])
        top = (self.an.get("prefixes") or {}).get("top", [])
        caption = T.tree_caption(tree, top)
        section = Section("prefixes", "Top shared prefixes", charts=[self._chart(
            "prefix_tree", fig, caption, "Icicle chart of the prompt prefix tree")])
        if top:
            section.tables.append(T.prefix_table(top, self.opts.show_text))
        tr = (self.an.get("prefixes") or {}).get("tree")
        if tr:
            section.footer.append(T.tree_summary(tr))
        if not self.opts.show_text:
            section.footer.append("Prefixes are named by a content hash; prompt text is left out "
                                      "(rerun with --show-text to include it).")
        return section

    def _group_section(self, panels: list[dict[str, Any]]) -> Section:
        section = Section("groups", "Tenants, adapters and the cost of isolation")
        iso = self.an.get("isolation")
        if iso is not None and len(iso) > 1:
            section.tables.append(T.isolation_table(iso))
        if not panels:
            section.paragraphs.append("This trace has no tenants, cache salts or LoRA adapters: one namespace, "
                                      "nothing to break down.")
            return section
        fig = F.group_chart(panels, title=f"Hit rate per group at the chosen capacity ({self._cap_text(self.names[0])})",
                            colors=self.colors)
        caption = T.group_caption(self.isolation_overall, {p: _hit_rate(self.runs[p], self.trace) for p in self.names})
        section.charts.append(self._chart("groups", fig, caption, "Bar charts of token hit rate per tenant and "
                                          "per LoRA adapter, with namespaces honoured and ignored"))
        return section

    def _recommendation_section(self) -> Section | None:
        r = self.an.get("recommendation")
        if not r:
            return None
        s = Section("recommendation", "Recommendation (from kvsim analyze)")
        s.paragraphs.append(f"{r['engine']}, {r['size_text']}" if r.get("size_text") else str(r["engine"]))
        s.bullets.extend(r.get("reasons", []))
        changes = r.get("changes") or []
        if changes:
            s.tables.append(Table(f"Top changes, by prefill tokens saved ({r.get('metric', 'upper bound')})",
                                  ["#", "change", "tokens saved", "points"],
                                  [[str(k), c["change"], T.tokens(c["tokens_saved"]), f"+{c['points']:.1f}"]
                                   for k, c in enumerate(changes, 1)]))
        return s

    def _gpu_section(self) -> Section:
        import base64

        from kvsim.report.gpu import gpu_charts, gpu_fragment, load_validation

        result = load_validation(self.opts.gpu_results)
        images: dict[str, bytes] = {}
        for name, fig in gpu_charts(result):
            images[name] = F.png_bytes(fig)
            _close(fig)
        srcs = {f"{k}.png": "data:image/png;base64," + base64.b64encode(v).decode() for k, v in images.items()}
        return Section("gpu", "GPU validation (kvsim gpu-validate)", fragment=gpu_fragment(result, srcs),
                       fragment_images=images,
                       paragraphs=[f"From {Path(self.opts.gpu_results).name}: the simulator's block tables drove a "
                                   "real paged prefill; reuse and full prefill must agree within the tolerance."])

    def _notes_section(self) -> Section:
        s = Section("notes", "Definitions and settings")
        s.bullets.extend(T.definitions(self.names))
        s.tables.append(T.settings_table(self.trace, self.an, self.chosen_sim, self.chosen_source, self.opts,
                                         self.caps, self.kv_bytes))
        for note in self.an.get("notes", []):
            self.notes.append(note)
        return s

    def _key_numbers(self) -> tuple[list[KeyNumber], dict[str, Any]]:
        from kvsim.drive.metrics import summarize

        summaries = {p: summarize(self.runs[p], self.trace, self.opts.calibration) for p in self.names}
        numbers = {
            "upper_bound_token": self.an["bound"]["token"], "upper_bound_radix": self.an["bound"]["radix"],
            "upper_bound_apc_block16": self.an["bound"]["block16"],
            "capacity_tokens": dict(self.caps), "capacity_source": self.chosen_source,
            "hit_rate": {p: summaries[p]["token_hit_rate"] for p in self.names},
            "cached_tokens": {p: summaries[p]["cached_tokens"] for p in self.names},
            "prompt_tokens": {p: summaries[p]["prompt_tokens"] for p in self.names},
            "capacity_for_target": dict(self.target_caps), "target_share": self.opts.target_share,
            "target_capacity": self._target(), "target_from": self.yardstick[0],
            "target_yardstick": None if self.yardstick[0] is not None else self._yardstick_name(),
            "optimal_hit_rate": {p: self.optimal[p].at(self.caps[p]).hit_rate for p in self.optimal},
            "near_optimal_capacity": dict(getattr(self, "near", {})), "near_optimal_share": NEAR_OPTIMAL,
            "warmup": self.opts.warmup.as_dict(len(self.trace)) if self.opts.warmup.active else None,
            "gpu_seconds_saved": ({p: summaries[p]["prefill_gpu_seconds_saved"] for p in self.names}
                                  if self.opts.calibration is not None else None),
            "kv_bytes_per_token": self.kv_bytes,
            "recommendation": (self.an.get("recommendation") or {}).get("engine"),
            "concurrent": getattr(self, "concurrent", None),
            "offload": getattr(self, "tiers", None),
        }
        return T.key_numbers(numbers, summaries, self.an, self.chosen_sim, self.opts), numbers


def _cap(value: Any) -> float:
    return math.inf if value is None else float(value)


def _near_optimal(caps: np.ndarray, rates: np.ndarray, optimal: np.ndarray, share: float = NEAR_OPTIMAL) -> float | None:
    """The smallest of ``caps`` (ascending) from which an engine stays at >= ``share`` of the
    optimum at the same capacity (a capacity where the optimum hits nothing counts as reached)."""
    ok = (rates >= share * optimal - 1e-12) | (optimal <= 0)
    if len(ok) == 0 or not ok[-1]:
        return None
    bad = np.flatnonzero(~ok)
    return float(caps[bad[-1] + 1] if len(bad) else caps[0])


def _hit_rate(result: Any, trace: Trace) -> float:
    from kvsim.drive.metrics import counted

    ok = ~result.rejected & counted(result)
    p = int(trace.prompt_lengths[ok].sum())
    return int(result.cached_tokens[ok].sum()) / p if p else 0.0


def _fractions(result: Any, trace: Trace) -> np.ndarray:
    from kvsim.drive.metrics import counted

    ok = ~result.rejected & (trace.prompt_lengths > 0) & counted(result)
    return result.cached_tokens[ok] / trace.prompt_lengths[ok]


def _close(fig: Any) -> None:
    import matplotlib.pyplot as plt

    plt.close(fig)
