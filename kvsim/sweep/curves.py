"""Hit rate vs capacity for every capacity at once, from one pass over the trace.

Three models share the stack pass of :mod:`kvsim.sweep.stack`:

- ``apc``: vLLM APC (sequential replay). Units are B-token blocks; a request leaves its
  ``floor((L+M-1)/B)`` full blocks cached, holds one more partial block while it runs,
  hits at most ``floor((L-1)/B)`` blocks, and is rejected where ``ceil((L+M-1)/B)`` blocks
  exceed the usable ones (``docs/engines/apc.md §2.2, §3.5, §4.1``). Exact — the same hits as the
  replay — at every capacity that rejects no request, unless a block written twice (the
  last block of a block-aligned prompt, a prompt-logprob request) is re-used while both
  copies survive (see ``stack.py``).
- ``radix``: SGLang radix with LRU eviction, on page-sized units (16-token granules at
  page size 1). An approximation: the tree evicts whole leaves, so it can free more than
  it needs; the error against exact replays is reported with every sweep. (No curve for
  LFU: in 0.5.23 a node's hit count grows with every insert through it, so LFU orders
  leaves differently from LRU.)
- ``block-lru``: the "theoretical" model of hash-id studies (Mooncake FAST'25 Fig. 9): LRU
  over the trace's blocks, partial last block included and token-weighted, hits
  prefix-contiguous with no recompute cap, no transient footprint. Exact.
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvsim.engines.sglang.spec import CURVE_EVICTION as LRU_LIKE  # radix eviction policies with a curve
from kvsim.errors import ConfigError
from kvsim.io.trace.columns import Trace
from kvsim.sweep.stack import NEVER, stack_pass

#: tokens per unit of the radix model at page size 1
RADIX_GRANULE = 16


@dataclass
class CurveModel:
    """Hit rate as a step function of capacity, from one stack pass.

    Capacities are counted in units of ``unit_tokens`` tokens (APC blocks, radix pages):
    hit tokens at U units are the events with threshold <= U; the denominator is the
    prompt tokens of the requests admitted at that capacity (thresholds in tokens).
    """

    policy: str
    settings: dict[str, Any]
    unit_tokens: int
    hit_thr: np.ndarray          # sorted thresholds (units)
    hit_cum: np.ndarray          # cumulative hit tokens up to each threshold
    den_thr: np.ndarray          # sorted admission thresholds (tokens)
    den_cum: np.ndarray          # cumulative prompt tokens
    exactness: str               # where the model is exact
    elapsed_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def saturation_units(self) -> int:
        """Past this many units the curve is flat (every hit and every request counted)."""
        last = [int(self.hit_thr[-1])] if len(self.hit_thr) else []
        if len(self.den_thr):
            last.append(-(-int(self.den_thr[-1]) // self.unit_tokens))
        return max(last + [1])

    def hits_at_units(self, units: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(hit tokens, admitted prompt tokens) at each capacity in units (inf = unlimited)."""
        u = np.asarray(units, np.float64)
        return self._at(u, u * self.unit_tokens)

    def _at(self, units: np.ndarray, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _cum_at(self.hit_thr, self.hit_cum, units), _cum_at(self.den_thr, self.den_cum, tokens)

    def hit_rate_at_units(self, units: Sequence[float] | np.ndarray) -> np.ndarray:
        hits, den = self.hits_at_units(units)
        return np.divide(hits, den, out=np.zeros(len(hits)), where=den > 0)

    def units_of(self, capacity_tokens: Sequence[float | None] | np.ndarray) -> np.ndarray:
        """Usable tokens -> whole units (None or inf = unlimited)."""
        vals = np.array([math.inf if c is None else float(c) for c in np.atleast_1d(capacity_tokens)])
        return np.floor(vals / self.unit_tokens)

    def hit_rate(self, capacity_tokens: Sequence[float | None] | np.ndarray) -> np.ndarray:
        """Token hit rate at usable KV capacities in tokens."""
        units = self.units_of(capacity_tokens)
        tokens = np.array([math.inf if c is None else float(c) for c in np.atleast_1d(capacity_tokens)])
        hits, den = self._at(units, tokens)
        return np.divide(hits, den, out=np.zeros(len(hits)), where=den > 0)

    def grid(self, points: int = 64, lo_tokens: float | None = None,
             hi_tokens: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """A smooth curve: ``points`` log-spaced capacities (tokens) and their hit rates."""
        lo = max(1.0, (lo_tokens or self.unit_tokens) / self.unit_tokens)
        hi = max(lo, (hi_tokens or self.saturation_units * self.unit_tokens) / self.unit_tokens)
        units = np.unique(np.floor(np.geomspace(lo, hi, max(2, int(points)))))
        return units * self.unit_tokens, self.hit_rate_at_units(units)


def capacity_for_share(model: CurveModel, share: float) -> float | None:
    """Smallest capacity (tokens) from which ``model``'s curve stays at >= ``share`` of its
    unlimited-cache hit rate; None when nothing is ever reused.

    The one definition of "the KV needed for X% of the upper bound": ``kvsim analyze`` and
    ``kvsim report`` both read it off the same APC curve.
    """
    full = float(model.hit_rate_at_units([math.inf])[0])
    if full <= 0:
        return None
    units = np.unique(np.concatenate([model.hit_thr, -(-model.den_thr // model.unit_tokens), [1]]))
    units = units[units >= 1].astype(np.float64)
    below = np.flatnonzero(model.hit_rate_at_units(units) < share * full - 1e-12)
    if len(below) == 0:
        return float(units[0] * model.unit_tokens)
    if below[-1] + 1 >= len(units):
        return None
    return float(units[below[-1] + 1] * model.unit_tokens)


def _cum_at(thr: np.ndarray, cum: np.ndarray, units: np.ndarray) -> np.ndarray:
    if len(cum) == 0:
        return np.zeros(len(units))
    idx = np.searchsorted(thr, units, side="right") - 1
    return np.where(idx >= 0, cum[np.maximum(idx, 0)], 0).astype(np.float64)


def _finish(policy: str, settings: dict[str, Any], unit_tokens: int, inputs: dict[str, Any],
            prompt: np.ndarray, measured: np.ndarray, exactness: str, t0: float,
            dedup: bool = False) -> CurveModel:
    """Run the stack pass and build the step functions.

    ``inputs["foot"]`` (units) gates a request's hits; ``inputs["admit"]`` (tokens, default
    ``foot * unit_tokens``) is the smallest capacity that admits it, for the denominator.
    """
    cap = inputs["cap"]
    m = int(cap[measured].sum()) if len(cap) else 0
    out_thr = np.empty(max(m, 1), np.int64)
    out_w = np.empty(max(m, 1), np.int64)
    ne = stack_pass(inputs["keys"], inputs["key_off"], cap, inputs["phi"], inputs["foot"],
                    measured, int(inputs["unit_w"]), inputs["last_w"], bool(inputs.get("ghost_phi", False)),
                    bool(inputs.get("forward", False)), bool(dedup), out_thr, out_w)
    hit_thr, hit_cum = _step_function(out_thr[:ne], out_w[:ne])
    foot = inputs["foot"]
    admit = inputs.get("admit")
    if admit is None:
        admit = np.where(foot < NEVER, foot * unit_tokens, NEVER)
    ok = measured & (admit < NEVER)
    den_thr, den_cum = _step_function(admit[ok], prompt[ok])
    return CurveModel(policy, settings, unit_tokens, hit_thr, hit_cum, den_thr, den_cum, exactness,
                      time.perf_counter() - t0)


def _step_function(thr: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct thresholds (sorted) and the cumulative weight up to each."""
    if len(thr) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    top = int(thr.max())
    if top <= 4 * len(thr) + (1 << 20):  # a histogram is cheaper than a sort
        hist = np.bincount(thr, weights=w, minlength=top + 1)
        at = np.flatnonzero(np.bincount(thr, minlength=top + 1))
        return at.astype(np.int64), np.cumsum(hist)[at].round().astype(np.int64)
    order = np.argsort(thr, kind="stable")
    thr, cum = thr[order], np.cumsum(w[order])
    last = np.r_[thr[1:] != thr[:-1], True]
    return thr[last].astype(np.int64), cum[last].astype(np.int64)


def measured_mask(n: int, warmup: float = 0.0) -> np.ndarray:
    """Requests whose hits count: all, or all after the first ``warmup`` fraction."""
    if not 0.0 <= warmup < 1.0:
        raise ConfigError(f"warm-up must be a fraction in [0, 1), got {warmup!r}")
    mask = np.ones(n, bool)
    mask[: int(math.floor(n * warmup))] = False
    return mask


# -- the three models -----------------------------------------------------------------------

def _chained_units(trace: Trace, unit: int, hash_algo: str, engine_version: str | None):
    """APC's own block keys (prompt + outputs, namespaces) at block size ``unit``."""
    from kvsim.engines.vllm.sequential import APCFast
    from kvsim.engines.vllm.settings import APCSettings
    from kvsim.drive.requests import workload

    settings = APCSettings(block_size=unit, hash_algo=hash_algo, engine_version=engine_version)
    return settings, APCFast(settings).workload(workload(trace))


def _sequence_inputs(work, unit: int, read: np.ndarray) -> dict[str, Any]:
    from kvsim.engines.vllm import rules

    L, M = work.prompt_len, work.output_len
    kept = work.key_off[1:] - work.key_off[:-1]            # rules.kept_blocks, 0 when L == 0
    peak = np.where(L > 0, rules.peak_blocks(L, M, unit), 0)
    return {
        "keys": work.keys, "key_off": work.key_off,
        "cap": np.where(read & (L > 0), rules.lookup_cap_blocks(L, unit), 0).astype(np.int64),
        "phi": (peak - kept).astype(np.int64),
        "foot": np.where(L > 0, peak, NEVER).astype(np.int64),
        "unit_w": unit, "last_w": np.full(len(L), unit, np.int64),
    }


def apc_curve(trace: Trace, block_size: int = 16, engine_version: str | None = None,
              warmup: float = 0.0, policy: str = "apc") -> CurveModel:
    """The APC hit-rate curve (token hit rate over admitted requests, as ``summarize``): the
    ``chained_blocks`` kind, of engines with vLLM's block rules and LRU free order."""
    t0 = time.perf_counter()
    trace.require_tokens("a hit-rate curve")
    settings, work = _chained_units(trace, int(block_size), "fast", engine_version)
    inputs = _sequence_inputs(work, int(block_size), work.read)
    inputs["ghost_phi"] = not settings.profile.free_unhashed_to_head
    exactness = ("exact at capacities >= the largest request footprint "
                 f"({int(inputs['foot'][inputs['foot'] < NEVER].max(initial=0)) * block_size:,} tokens) "
                 "barring re-used duplicate blocks")
    model = _finish(policy, {"block_size": int(block_size), "engine_version": settings.profile.version},
                    int(block_size), inputs, work.prompt_len, measured_mask(len(trace), warmup), exactness, t0)
    model.extra["min_exact_tokens"] = int(inputs["foot"][inputs["foot"] < NEVER].max(initial=0)) * int(block_size)
    return model


def radix_curve(trace: Trace, page_size: int = 1, eviction_policy: str = "lru", granule: int | None = None,
                warmup: float = 0.0, policy: str = "radix") -> CurveModel:
    """The radix hit-rate curve (LRU-like eviction only), on page-sized units: the
    ``token_tree`` kind, of engines with SGLang's tree rules.

    A request of L prompt tokens generating k keeps ``floor_page(L + k - 1)`` tokens in the
    tree, hits at most ``floor_page(L - 1)`` (a logprob request at most its
    ``logprob_start_len``; ``docs/engines/radix.md §2.1, §3.3``), holds one
    extra free page while its prefill allocates (page > 1, radix §5.5), and is admitted when
    the pool holds ``ceil_page(L) + page + 1`` tokens. At page size 1 the units are
    ``granule``-token blocks, so each hit is rounded down to a multiple of the granule.
    """
    if eviction_policy.lower() not in LRU_LIKE:
        raise ConfigError(f"no one-pass curve for radix eviction policy {eviction_policy!r} "
                          f"(only {', '.join(LRU_LIKE)})")
    t0 = time.perf_counter()
    trace.require_tokens("a hit-rate curve")
    p = int(page_size)
    unit = p if p > 1 else int(granule or RADIX_GRANULE)
    _, work = _chained_units(trace, unit, "fast", None)
    from kvsim.engines.sglang import rules

    inputs = _sequence_inputs(work, unit, np.ones(len(trace), bool))
    L = work.prompt_len
    inputs["cap"] = np.where(L > 0, rules.max_prefix_lens(L, trace.logprob_start_len) // unit, 0)
    kept = work.key_off[1:] - work.key_off[:-1]
    peak = kept + inputs["phi"]
    if p > 1:   # the prefill's pages plus the extra page the allocator demands (radix §5.5)
        peak = np.maximum(peak, rules.prefill_pages(L, p))
    inputs["phi"] = np.where(L > 0, peak - kept, 0)
    admit = rules.admission_need(L, p)
    inputs["admit"] = np.where(L > 0, admit, NEVER)
    inputs["foot"] = np.where(L > 0, -(-admit // unit), NEVER)
    exactness = ("approximate: whole-leaf eviction is not modelled"
                 + (f"; hits rounded down to {unit}-token granules" if p == 1 else ""))
    return _finish(policy, {"page_size": p, "eviction_policy": eviction_policy.lower(), "granule": unit},
                   unit, inputs, L, measured_mask(len(trace), warmup), exactness, t0, dedup=True)


def block_lru_curve(trace: Trace, block_size: int | None = None, warmup: float = 0.0,
                    order: str = "tail-first") -> CurveModel:
    """LRU over the trace's blocks (partial last block included, token-weighted).

    ``order="tail-first"`` evicts a sequence's tail before its prefix (the leaf-first LRU of
    a prefix trie); ``"forward"`` is plain block LRU touching a request's blocks in order.
    """
    if order not in ("tail-first", "forward"):
        raise ConfigError(f"order must be 'tail-first' or 'forward', got {order!r}")
    t0 = time.perf_counter()
    tokens = trace.require_tokens("a hit-rate curve")
    B = int(block_size or trace.meta.hash_block_size or 512)
    from kvsim.sweep.chains import prompt_block_keys

    ns = _namespace_keys(trace)
    keys, key_off, last_len = prompt_block_keys(tokens, trace.offsets, B, ns)
    nb = np.diff(key_off)
    inputs = {"keys": keys, "key_off": key_off, "cap": nb.astype(np.int64),
              "phi": np.zeros(len(trace), np.int64), "foot": np.zeros(len(trace), np.int64),
              "unit_w": B, "last_w": last_len, "forward": order == "forward"}
    exactness = "exact"
    return _finish("block-lru", {"block_size": B, "order": order, "warmup": warmup}, B, inputs,
                   trace.prompt_lengths, measured_mask(len(trace), warmup), exactness, t0)


def _namespace_keys(trace: Trace) -> np.ndarray:
    from kvsim.engines.vllm.hashing import namespace_key

    out = np.zeros(len(trace), np.uint64)
    for i in np.flatnonzero((trace.cache_salt >= 0) | (trace.lora >= 0)):
        salt = trace.name_of("cache_salt", int(trace.cache_salt[i])) or ""
        lora = trace.name_of("lora", int(trace.lora[i])) or ""
        out[i] = namespace_key("ns", salt, lora)
    return out


def curve_model(trace: Trace, policy: str, block_size: int = 16, page_size: int = 1,
                eviction_policy: str = "lru", engine_version: str | None = None, warmup: float = 0.0,
                granule: int | None = None) -> CurveModel:
    """The one-pass model of ``policy``: an engine with a curve (its spec's ``curve`` kind) or
    'block-lru'."""
    if policy == "block-lru":
        return block_lru_curve(trace, block_size, warmup)
    from kvsim.engines import registry

    kind = registry.engine(policy).curve if policy in registry.names() else None
    if kind == "chained_blocks":
        return apc_curve(trace, block_size, engine_version, warmup, policy)
    if kind == "token_tree":
        return radix_curve(trace, page_size, eviction_policy, granule, warmup, policy)
    raise ConfigError(f"no one-pass curve for policy {policy!r}; choose from {', '.join(curve_policies())}")


def curve_policies() -> list[str]:
    """The policies with a one-pass curve."""
    from kvsim.engines import registry

    return [s.name for s in registry.engines() if s.curve] + ["block-lru"]


def curve(trace: Trace, policy: str = "apc", capacities: Sequence[float] | None = None, points: int = 64,
          **settings: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(capacities, hit_rates)``: token hit rate at usable capacities in tokens.

    Without ``capacities``, ``points`` log-spaced capacities from one unit to where the curve
    saturates. ``settings`` go to :func:`curve_model` (block_size, page_size, ...).
    """
    model = curve_model(trace, policy, **settings)
    if capacities is None:
        return model.grid(points)
    caps = np.asarray([math.inf if c is None else float(c) for c in capacities], np.float64)
    return caps, model.hit_rate(caps)
