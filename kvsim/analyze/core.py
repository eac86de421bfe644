"""``analyze(trace, options)``: every statistic of ``kvsim analyze`` in one report."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from kvsim.analyze.divergence import divergence_histogram, volatile_content
from kvsim.analyze.heuristic import seed_heuristic
from kvsim.analyze.isolation import isolation_costs
from kvsim.analyze.options import AnalyzeOptions
from kvsim.analyze.prefixes import system_prompts, top_shared_prefixes, tree_summary
from kvsim.analyze.recommend import recommend
from kvsim.analyze.reuse import PrefixIndex, build_prefix_index, namespace_roots, output_extensions
from kvsim.analyze.reuse_distance import reuse_distances
from kvsim.analyze.sessions import session_continuity
from kvsim.analyze.shape import workload_shape
from kvsim.analyze.upper_bound import hit_tokens, native_hash_bound, upper_bounds
from kvsim.io.trace.columns import Trace
from kvsim.outputs import to_jsonable

PROGRESS_MIN_TOKENS = 20_000_000  # show a progress bar above this many prompt tokens
SECTIONS = ("shape", "bound", "upper_bound", "hash_native", "prefixes", "divergence", "sessions", "isolation",
            "reuse_distance", "scheduling", "heuristic", "recommendation")


@dataclass
class AnalysisReport:
    """The result of :func:`analyze`; ``to_dict()`` is exactly what ``--json`` writes."""

    shape: dict[str, Any]
    bound: dict[str, Any] | None = None            # headline: token level, radix, APC block 16
    upper_bound: dict[str, Any] | None = None      # token level and the block-size table
    hash_native: dict[str, Any] | None = None      # hash-id traces at their own block size
    prefixes: dict[str, Any] | None = None
    divergence: dict[str, Any] | None = None
    sessions: dict[str, Any] | None = None
    isolation: dict[str, Any] | None = None
    reuse_distance: list[dict[str, Any]] | None = None
    scheduling: dict[str, Any] | None = None
    heuristic: dict[str, Any] | None = None
    recommendation: dict[str, Any] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in SECTIONS}
        out["settings"] = self.settings
        out["notes"] = self.notes
        return to_jsonable(out)


def bound_summary(reuse: np.ndarray, lengths: np.ndarray) -> dict[str, Any]:
    """Headline numbers: token level (prefix seen before), radix (token level, last token
    recomputed) and APC at block 16 (full blocks, last token recomputed)."""
    total = int(lengths.sum())
    out: dict[str, Any] = {"prompt_tokens": total}
    for name, block, recompute in (("token", 1, False), ("radix", 1, True), ("block16", 16, True)):
        hits = int(hit_tokens(reuse, lengths, block, recompute).sum())
        out[f"{name}_tokens"] = hits
        out[name] = hits / total if total else 0.0
    return out


def analyze(trace: Trace, options: AnalyzeOptions | None = None) -> AnalysisReport:
    """Analyze a trace: the order-free upper bounds of prefix reuse and the diagnostics."""
    opts = options or AnalyzeOptions()
    report = AnalysisReport(shape=workload_shape(trace), settings=_settings(opts))
    if not trace.has_tokens:
        report.notes.append("this trace holds only lengths and arrival times (no prompt tokens or hash ids): "
                            "prefix statistics need prompts, token ids or hash ids")
        return report
    tokens = trace.tokens
    lengths = trace.prompt_lengths
    ext_tok, ext_off = output_extensions(trace)
    is_hash = trace.meta.hash_block_size is not None
    decode = _decoder(trace, report.notes)
    with _progress(opts.progress and trace.num_prompt_tokens >= PROGRESS_MIN_TOKENS) as task:

        def index(salt: bool = True, lora: bool = True, toks: np.ndarray = tokens, ext: bool = True,
                  label: str = "prefix scan") -> PrefixIndex:
            return build_prefix_index(toks, trace.offsets, namespace_roots(trace, salt, lora),
                                      ext_tok if ext else None, ext_off if ext else None,
                                      progress=task(label, trace.num_prompt_tokens))

        main = index()
        tick = task("statistics", 8) or (lambda n: None)
        reuse = main.reuse
        # with a warm-up window, earlier requests still count as history but only the
        # measured ones are counted (cnt)
        cnt = _counter(len(trace), opts.warmup, report)
        report.bound = bound_summary(cnt(reuse), cnt(lengths))
        report.upper_bound = upper_bounds(cnt(reuse), cnt(lengths), opts.block_sizes)
        report.upper_bound["distinct_prefix_tokens"] = int(cnt(lengths).sum() - cnt(reuse).sum())
        if trace.output_known.any():
            report.upper_bound["prompts_only"] = bound_summary(
                cnt(index(ext=False, label="prompts only").reuse), cnt(lengths))
        if is_hash:
            report.hash_native = native_hash_bound(reuse, lengths, int(trace.meta.hash_block_size),
                                                   tail_has_id="kvcache-tester" not in trace.meta.formats)
        report.prefixes = {
            "top": top_shared_prefixes(main, trace, tokens, opts.top, decode if opts.show_text else None),
            "system_prompts": system_prompts(trace, tokens),
            "tree": tree_summary(main),
        }
        tick(1)
        report.divergence = {"histogram": divergence_histogram(cnt(reuse), cnt(lengths))}
        if is_hash:
            report.divergence["volatile"] = None
            report.notes.append("volatile-content detection is skipped for hash-id traces: their ids are "
                                "prefix-chained, so two prompts never run together again after they differ")
        else:
            def rebound(moved: np.ndarray) -> dict[str, Any]:
                return bound_summary(cnt(index(toks=moved, label="moved content").reuse), cnt(lengths))

            report.divergence["volatile"] = volatile_content(main, trace, tokens, opts, rebound, report.bound,
                                                             decode if opts.show_text else None)
        tick(2)
        report.sessions = session_continuity(trace, tokens, opts)
        report.isolation = isolation_costs(
            trace, lambda salt, lora: bound_summary(cnt(index(salt, lora, label="isolation").reuse), cnt(lengths)),
            report.bound)
        tick(1)
        kv_bytes = _kv_bytes(opts.model)
        from kvsim.warmup import as_fraction

        report.reuse_distance = reuse_distances(trace, main.block, trace.meta.hash_block_size,
                                                as_fraction(len(trace), opts.warmup), kv_bytes)
        if kv_bytes is not None:
            report.settings["kv_bytes_per_token"] = kv_bytes
        tick(2)
        report.scheduling = burst_reuse(trace, main, opts.burst_seconds)
        report.heuristic = seed_heuristic(tokens, trace.offsets, opts.heuristic_chars, decode)
        report.recommendation = recommend(report.to_dict())
        tick(2)
    return report


def burst_reuse(trace: Trace, index: PrefixIndex, window_s: float) -> dict[str, Any]:
    """Share of reused tokens whose first owner arrived less than ``window_s`` earlier.

    The first owner is the earliest request with that prefix, so such reuse exists only if
    the two are scheduled together (or the earlier one finishes its prefill in time)."""
    src = index.source
    has = src >= 0
    t = trace.arrival
    if not has.any() or np.isnan(t[has]).any() or np.isnan(t[src[has]]).any():
        return {"known": False, "window_s": window_s}
    dt = t[has] - t[src[has]]
    r = index.reuse[has]
    close = dt < window_s
    total = int(r.sum())
    return {"known": True, "window_s": window_s, "burst_reuse_tokens": int(r[close].sum()),
            "burst_reuse_share": float(r[close].sum() / total) if total else 0.0,
            "burst_requests": int(close.sum())}


def _counter(n: int, warmup: Any, report: AnalysisReport) -> Callable[[np.ndarray], np.ndarray]:
    """Selects the counted requests of a per-request array (all without a warm-up window)."""
    from kvsim.warmup import measured_mask, parse_warmup

    w = parse_warmup(warmup)
    if not w.active:
        return lambda a: a
    mask = measured_mask(n, w)
    report.settings["warmup"] = w.as_dict(n)
    report.notes.append(f"warm-up: {w.describe(n)} in the bounds, the divergence histogram, the isolation "
                        "costs and the capacity for a share of the bound; the other sections cover the whole log")
    return lambda a: a[mask]


def _settings(opts: AnalyzeOptions) -> dict[str, Any]:
    return {"block_sizes": list(opts.block_sizes), "top": opts.top, "show_text": opts.show_text,
            "model": opts.model, "index_block": 16, "max_skip": opts.max_skip, "window": opts.window,
            "min_run": opts.min_run, "burst_seconds": opts.burst_seconds}


def _kv_bytes(model: str | None) -> int | None:
    if model is None:
        return None
    from kvsim.models import get_model

    return int(get_model(model).kv_bytes_per_token())


def _decoder(trace: Trace, notes: list[str]) -> Callable[[np.ndarray], str] | None:
    """Token ids -> text with the trace's own tokenizer (None for hash-id traces)."""
    name = trace.meta.tokenizer
    if not name or trace.meta.hash_block_size is not None:
        return None
    try:
        from kvsim.io.tokenize.templates import get_template
        from kvsim.io.tokenize.tokenizers import get_tokenizer

        specials: tuple[str, ...] = ()
        if trace.meta.chat_template:
            specials = tuple(get_template(trace.meta.chat_template).special_tokens)
        tok = get_tokenizer(name, specials)
    except Exception as e:  # a decoder is a convenience; the numbers do not need it
        notes.append(f"cannot decode tokens with {name!r} ({e.__class__.__name__}): text shown as token ids")
        return None

    def decode(ids: np.ndarray) -> str:
        try:
            return tok.decode([int(x) for x in ids])
        except Exception:
            return " ".join(str(int(x)) for x in ids)

    return decode


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[str, int], Callable[[int], None] | None]]:
    """A factory of progress callbacks (one bar per pass), or of None when disabled."""
    if not enabled:
        yield lambda label, total: None
        return
    from kvsim.progress import bars

    with bars("percent") as shown:
        def task(label: str, total: int) -> Callable[[int], None]:
            update, done = shown.task(f"analyze: {label}", total), [0]

            def advance(n: int) -> None:
                done[0] += n
                update(done[0])
            return advance

        yield task
