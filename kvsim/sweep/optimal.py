"""The offline optimum: the best hit rate any cache of a given size could reach on a log.

"Any cache" means any eviction schedule, knowing the future, under the rules the engines
obey (``docs/optimal.md`` states them and proves the algorithm exact):

- ``apc`` — vLLM APC's rules: whole ``block_size`` blocks of prompt + output, the last
  prompt token always recomputed (``floor((L-1)/B)`` blocks may hit), namespaces by
  LoRA / ``cache_salt``, and a request holds all ``ceil((L+M-1)/B)`` of its blocks while it
  runs (``vllm_apc.md §2.2, §3.5``); a request too big for the cache is rejected.
- ``radix`` — SGLang's: whole pages (tokens at page size 1), ``floor_page(L-1)`` may hit,
  ``floor_page(L+k-1)`` tokens are written, the prefill holds one extra page, generation is
  clipped to the pool and admission follows ``PrefillAdder`` (``radix.md`` §2.1, §3.3,
  radix.md §5.5, §7.2).
- ``block`` — kvcache-lab's storage model: the log's blocks (the partial last block
  weighted by its real length, or dropped), no recompute cap, no footprint: the cache
  stores up to C blocks and may bypass any block (``traces/README.md §4``).

The optimum is computed per capacity by :func:`kvsim.sweep.optimal_pass.optimal_pass` on
the log's :class:`~kvsim.sweep.prefix_trie.PrefixTrie`. It is exact when every unit weighs
the same (the engine models, and ``block`` with ``tail="drop"``); with partial blocks
weighted by length it is bracketed: ``hit_tokens`` is reached by a real schedule and
``upper_tokens`` is a proven bound (the gap is reported).
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvsim.errors import ConfigError
from kvsim.io.trace.columns import Trace
from kvsim.sweep.optimal_pass import optimal_pass
from kvsim.sweep.prefix_trie import PrefixTrie

TAILS = ("weighted", "drop")
#: a capacity in units large enough for every request at once
_UNLIMITED = 1 << 60


@dataclass
class Rules:
    """What every request does in a cache of ``K`` units (one capacity)."""

    admitted: np.ndarray      # bool: runs (else it is rejected and touches nothing)
    chain: np.ndarray         # int64: tokens of its chain that it leaves cached
    read_units: np.ndarray    # int64: leading full units its lookup may hit
    demand: np.ndarray        # int64: units it holds while it runs (resident models)
    counted: np.ndarray | None = None  # bool: runs and is counted (default: admitted); SGLang runs a
                                       # refused logprob request as a placeholder but reports it rejected

    def __post_init__(self) -> None:
        if self.counted is None:
            self.counted = self.admitted


@dataclass
class OptimalPoint:
    """The optimum at one capacity."""

    capacity_tokens: float
    units: int
    hit_tokens: int           # reached by a real eviction schedule
    upper_tokens: int         # no schedule does better (== hit_tokens when exact)
    measured_tokens: int      # the denominator: prompt tokens of measured, admitted requests
    admitted: int
    seconds: float

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.measured_tokens if self.measured_tokens else 0.0

    @property
    def upper_rate(self) -> float:
        return self.upper_tokens / self.measured_tokens if self.measured_tokens else 0.0


@dataclass
class OptimalModel:
    """The optimum of one policy setting, evaluated at any capacity (cached per unit count)."""

    policy: str
    settings: dict[str, Any]
    unit_tokens: int
    resident: bool
    trie: PrefixTrie
    measured: np.ndarray
    prompt_tokens: np.ndarray          # denominator weight per request
    partial_at: np.ndarray
    partial_w: np.ndarray
    build_seconds: float
    _rules: Any = field(repr=False, default=None)
    _points: dict[int, OptimalPoint] = field(default_factory=dict, repr=False)

    @property
    def exact(self) -> bool:
        """True when every unit weighs the same, so the greedy packing is optimal."""
        return not bool((self.partial_w > 0).any())

    @property
    def exactness(self) -> str:
        if self.exact:
            return "exact optimum (docs/optimal.md)"
        return "within [hit_rate, upper_rate]: partial blocks weigh less than full ones (docs/optimal.md)"

    def units_of(self, capacity_tokens: float | None) -> int:
        """Usable tokens -> whole units (None or inf = unlimited)."""
        if capacity_tokens is None or math.isinf(float(capacity_tokens)):
            return _UNLIMITED
        if float(capacity_tokens) < 0:
            raise ConfigError(f"capacity must be >= 0 tokens, got {capacity_tokens!r}")
        return int(float(capacity_tokens)) // self.unit_tokens

    def at(self, capacity_tokens: float | None) -> OptimalPoint:
        """The optimum with ``capacity_tokens`` usable KV tokens."""
        K = self.units_of(capacity_tokens)
        if K not in self._points:
            self._points[K] = self._solve(K, math.inf if capacity_tokens is None else float(capacity_tokens))
        return self._points[K]

    def _solve(self, K: int, capacity_tokens: float) -> OptimalPoint:
        t0 = time.perf_counter()
        rules: Rules = self._rules(K)
        cut = rules.admitted & (rules.chain < self.trie.W)
        if cut.any():  # chains cut shorter at this capacity (radix: generation clipped to the pool)
            self.trie.split_at(np.flatnonzero(cut), rules.chain[cut])
        self.trie.ensure_paths()
        measured = self.measured & rules.counted
        out = np.zeros(len(measured), np.int64)
        hits, upper = optimal_pass(self.trie.path_off, self.trie.path_nodes, self.trie.d0, self.trie.d1,
                                   self.trie.num_nodes, rules.admitted, rules.chain, rules.read_units,
                                   rules.demand, np.where(rules.admitted, self.partial_at, -1), self.partial_w,
                                   measured, self.unit_tokens, K, self.resident, out)
        if upper > hits and K < _UNLIMITED:
            # the unlimited cache keeps every interval, so its packing is exact: a bound too
            upper = min(upper, self.at(None).hit_tokens)
        return OptimalPoint(capacity_tokens, K, int(hits), int(upper), int(self.prompt_tokens[measured].sum()),
                            int(rules.counted.sum()), time.perf_counter() - t0)

    def hit_rate(self, capacities: Sequence[float | None] | np.ndarray) -> np.ndarray:
        """The optimal token hit rate at each capacity (tokens; None/inf = unlimited)."""
        return np.array([self.at(c).hit_rate for c in np.atleast_1d(np.asarray(capacities, dtype=object))])

    def upper_rate(self, capacities: Sequence[float | None] | np.ndarray) -> np.ndarray:
        return np.array([self.at(c).upper_rate for c in np.atleast_1d(np.asarray(capacities, dtype=object))])

    def grid(self, points: int = 48, lo_tokens: float | None = None,
             hi_tokens: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``points`` log-spaced capacities (tokens) and the optimal hit rate at each."""
        lo = max(float(self.unit_tokens), lo_tokens or self.unit_tokens)
        hi = max(lo, hi_tokens or float(self.saturation_tokens))
        units = np.unique(np.floor(np.geomspace(lo, hi, max(2, int(points))) / self.unit_tokens))
        xs = units * self.unit_tokens
        return xs, self.hit_rate(xs)

    @property
    def saturation_tokens(self) -> int:
        """A capacity past which nothing changes: every chain and every footprint fits."""
        return int(self.trie.W.sum()) + self.unit_tokens * (int(self._rules(_UNLIMITED).demand.max(initial=0)) + 1)


# -- the rules of each policy ------------------------------------------------------------------

def namespace_codes(trace: Trace) -> np.ndarray:
    """One code per (LoRA, cache_salt) pair: the engines' namespaces (an empty salt is none)."""
    pairs = np.stack([trace.lora.astype(np.int64), trace.cache_salt.astype(np.int64)], axis=1)
    _, codes = np.unique(pairs, axis=0, return_inverse=True)
    return codes.reshape(-1).astype(np.int64)


def warmup_mask(n: int, warmup: float | int | None) -> np.ndarray:
    """Requests whose hits count: all but the first ``warmup`` (a fraction in [0, 1) or a count)."""
    from kvsim.warmup import measured_mask

    return measured_mask(n, warmup)


def _outputs(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    from kvsim.drive.requests import output_token_arrays

    return output_token_arrays(trace)


def apc_optimal(trace: Trace, block_size: int = 16, warmup: float | int | None = 0.0) -> OptimalModel:
    """The optimum under vLLM APC's rules (sequential replay) at block size ``block_size``."""
    t0 = time.perf_counter()
    tokens = trace.require_tokens("an optimal curve")
    B = _positive(block_size, "block size")
    out, out_off = _outputs(trace)
    L = trace.prompt_lengths.astype(np.int64)
    M = np.diff(out_off)                                   # >= 1: an engine samples at least one token
    read = ~trace.prompt_logprobs.astype(bool)
    from kvsim.engines.vllm import rules as apc_rules

    chain = np.where(L > 0, apc_rules.kept_blocks(L, M, B) * B, 0)   # full blocks, the last token never computed
    peak = np.where(L > 0, apc_rules.peak_blocks(L, M, B), 0)
    read_units = np.where(read & (L > 0), apc_rules.lookup_cap_blocks(L, B), 0)

    def rules(K: int) -> Rules:
        admitted = (L > 0) & (peak <= K)
        return Rules(admitted, chain, read_units, peak)

    trie = PrefixTrie.build(tokens, trace.offsets, out, out_off, chain, namespace_codes(trace))
    n = len(trace)
    return OptimalModel("apc", {"block_size": B}, B, True, trie, warmup_mask(n, warmup), L,
                        np.full(n, -1, np.int64), np.zeros(n, np.int64), time.perf_counter() - t0, rules)


def radix_optimal(trace: Trace, page_size: int = 1, warmup: float | int | None = 0.0, overlap: bool = True,
                  finish: str = "length", max_new_tokens: int | None = None,
                  chunked_prefill_size: int = 4096) -> OptimalModel:
    """The optimum under SGLang radix rules (sequential replay) at page size ``page_size``."""
    from kvsim.engines.sglang import rules as radix_rules

    t0 = time.perf_counter()
    tokens = trace.require_tokens("an optimal curve")
    p = _positive(page_size, "page size")
    if 0 < chunked_prefill_size < p:
        raise ConfigError(f"no optimal bound with a chunked prefill size ({chunked_prefill_size}) below the page "
                          f"size ({p}): SGLang then rejects requests by their cached prefix")
    out, out_off = _outputs(trace)
    L = trace.prompt_lengths.astype(np.int64)
    wanted = np.diff(out_off)
    stop = finish == "stop"
    want = np.full(len(L), radix_rules.UNCAPPED_MAX_NEW if max_new_tokens is None else int(max_new_tokens),
                   np.int64) if stop else wanted
    start = trace.logprob_start_len.astype(np.int64)
    # the len-1 rule, a logprob request at most its start (§2.1)
    read_units = radix_rules.max_prefix_lens(L, start) // p
    # a start past the prompt is refused, and the request runs as the prompt [0] with one
    # sampled token (``logprob_aborts``): it takes room and writes that chain, counted nowhere
    aborted = start > L
    tok_a, off_a, run_L = tokens, trace.offsets, L
    if aborted.any():
        tok_a, off_a, out, out_off = _placeholders(tokens, trace.offsets, out, out_off, aborted)
        run_L = np.where(aborted, 1, L)
        read_units = np.where(aborted, 0, read_units)

    def rules(K: int) -> Rules:
        T = K * p
        if K >= _UNLIMITED:
            max_new = want
            fits = np.ones(len(L), bool)
        else:
            # Scheduler.init_req_max_new_tokens: generation clipped to the empty pool (radix.md §7.2)
            max_new = radix_rules.max_new_tokens_for_memory_all(L, want, T, p)
            fits = radix_rules.admits_all(run_L, max_new, p, T)
        k = np.where(aborted, 1, np.minimum(wanted, np.maximum(max_new, 1)))
        extra = (overlap & (stop | aborted)) & (k < max_new)
        committed = run_L + k - 1 + extra                  # KV computed by the time it finishes (§3.3)
        chain = radix_rules.floor_page(committed, p)
        prefill = radix_rules.prefill_pages(run_L, p)        # the extend allocator keeps a page spare (§5.5)
        demand = np.maximum(prefill, radix_rules.ceil_page(committed, p) // p)
        return Rules(fits, chain, read_units, demand, fits & ~aborted)

    base = rules(_UNLIMITED)
    trie = PrefixTrie.build(tok_a, off_a, out, out_off, base.chain, namespace_codes(trace))
    n = len(trace)
    settings = {"page_size": p, "overlap": bool(overlap), "finish": finish}
    return OptimalModel("radix", settings, p, True, trie, warmup_mask(n, warmup), L, np.full(n, -1, np.int64),
                        np.zeros(n, np.int64), time.perf_counter() - t0, rules)


def _placeholders(tokens, offsets, out, out_off, aborted):
    """Token streams where each ``aborted`` request's prompt is [0] and its output its first
    output token, as SGLang runs a request it refused (the others unchanged)."""
    L = np.diff(offsets)
    M = np.diff(out_off)
    new_L = np.where(aborted, 1, L)
    new_M = np.where(aborted, 1, M)
    keep_a = np.repeat(~aborted, L)
    keep_b = np.repeat(~aborted, M) | (np.arange(len(out)) == np.repeat(out_off[:-1], M))
    off_a = np.zeros(len(L) + 1, np.int64)
    off_a[1:] = np.cumsum(new_L)
    off_b = np.zeros(len(L) + 1, np.int64)
    off_b[1:] = np.cumsum(new_M)
    tok_a = np.zeros(int(off_a[-1]), np.asarray(tokens).dtype)
    # gather the kept prompts in order, then drop in the placeholder token 0
    slots = np.repeat(~aborted, new_L)
    tok_a[slots] = np.asarray(tokens)[keep_a]
    return tok_a, off_a, np.asarray(out)[keep_b], off_b


def block_optimal(trace: Trace, block_size: int | None = None, warmup: float | int | None = 0.0,
                  tail: str = "weighted") -> OptimalModel:
    """The optimum of kvcache-lab's storage model over the log's blocks.

    ``tail="weighted"``: the partial last block is a block of its real length (Mooncake
    hash ids); ``"drop"``: it is not a block and not counted (kv-cache-tester's
    ``floor(in/64)`` ids). Hits need no recompute and take no room while a request runs.
    """
    t0 = time.perf_counter()
    tokens = trace.require_tokens("an optimal curve")
    B = _positive(block_size or trace.meta.hash_block_size or 512, "block size")
    if tail not in TAILS:
        raise ConfigError(f"tail must be one of {', '.join(TAILS)}, got {tail!r}")
    L = trace.prompt_lengths.astype(np.int64)
    n = len(L)
    full = L // B
    rest = L - full * B
    if tail == "weighted":
        chain = np.where(rest > 0, L + 1, L)               # + END: a partial block is equal only where both end
        partial_at = np.where(rest > 0, L, -1)
        partial_w = np.where(rest > 0, rest, 0)
        weight = L
    else:
        chain = full * B
        partial_at = np.full(n, -1, np.int64)
        partial_w = np.zeros(n, np.int64)
        weight = full * B
    none = np.zeros(0, np.int64)
    rules_all = Rules(np.ones(n, bool), chain, full, np.zeros(n, np.int64))
    trie = PrefixTrie.build(tokens, trace.offsets, none, np.zeros(n + 1, np.int64), chain, namespace_codes(trace))
    return OptimalModel("block", {"block_size": B, "tail": tail}, B, False, trie, warmup_mask(n, warmup), weight,
                        partial_at, partial_w, time.perf_counter() - t0, lambda K: rules_all)


def optimal_model(trace: Trace, policy: str, block_size: int = 16, page_size: int = 1,
                  warmup: float | int | None = 0.0, **options: Any) -> OptimalModel:
    """The optimum of ``policy``: an engine with an optimum (its spec's ``optimal`` kind) or 'block'."""
    if policy == "block":
        return block_optimal(trace, block_size, warmup, **options)
    from kvsim.engines import registry

    kind = registry.engine(policy).optimal if policy in registry.names() else None
    if kind == "chained_blocks":
        return apc_optimal(trace, block_size, warmup)
    if kind == "token_tree":
        return radix_optimal(trace, page_size, warmup, **options)
    known = [s.name for s in registry.engines() if s.optimal] + ["block"]
    raise ConfigError(f"no optimal curve for policy {policy!r}; choose from {', '.join(known)}")


def _positive(value: Any, what: str) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{what} must be a positive integer, got {value!r}") from None
    if v < 1 or v != value:
        raise ConfigError(f"{what} must be a positive integer, got {value!r}")
    return v
