"""Sequential replay of a trace through SGLang RadixAttention (``--policy radix``).

One request at a time, as an SGLang 0.5.23 server serves requests sent one after the
other: the scheduler's full call sequence for a lone request (see
:mod:`kvsim.cache.radix.reference`), so hits and evictions equal SGLang's request for
request (``tests/test_radix_oracle.py``). ``engine="fast"`` (default) runs
:mod:`kvsim.cache.radix.fast`; ``engine="reference"`` the readable model, which gives
identical results, slowly.

Radix-only options live in ``SimOptions.extra`` (see :mod:`kvsim.cache.radix.settings`).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from kvsim.cache.radix.reference import namespace
from kvsim.cache.radix.settings import RadixSettings
from kvsim.cache.radix.stats import tree_report
from kvsim.errors import ConfigError
from kvsim.io.trace import Trace
from kvsim.replay.options import SimOptions
from kvsim.replay.requests import output_token_arrays
from kvsim.replay.result import ReplayResult

ENGINES = ("fast", "reference")


def logprob_capped(trace: Trace) -> np.ndarray:
    """Requests whose match a logprob start cuts below ``len - 1`` (§2.1); 0 skips the read."""
    L = trace.prompt_lengths
    start = trace.logprob_start_len
    return (start >= 0) & (start < np.maximum(L - 1, 0))


def replay_radix(trace: Trace, options: SimOptions, progress: Callable[[int, int], Any] | None = None,
                 engine: str = "fast") -> ReplayResult:
    """Replay ``trace`` one request at a time through SGLang's radix cache.

    ``progress(done, total)`` is called now and then with the requests replayed so far.
    """
    return replay_radix_detailed(trace, options, progress, engine)[0]


def replay_radix_detailed(trace: Trace, options: SimOptions, progress: Callable[[int, int], Any] | None = None,
                          engine: str = "fast") -> tuple[ReplayResult, Any]:
    """:func:`replay_radix`, plus the tree at the end (``nodes()``, ``paths()``, ``root``)."""
    if engine not in ENGINES:
        raise ConfigError(f"unknown radix engine {engine!r}; choose one of {', '.join(ENGINES)}")
    settings = RadixSettings.from_options(options)
    tokens = trace.require_tokens("the radix simulation")
    out, out_off = output_token_arrays(trace)
    n = len(trace)
    ns = [namespace(trace.name_of("lora", int(a)), trace.name_of("cache_salt", int(b)))
          for a, b in zip(trace.lora, trace.cache_salt)]
    cols = {k: np.zeros(n, np.int64) for k in ("cached", "ev_tokens", "ev_leaves", "max_new", "extend")}
    rejected = np.zeros(n, bool)
    starts = trace.logprob_start_len
    t0 = time.perf_counter()
    if engine == "fast":
        from kvsim.cache.radix.fast import FastRadixEngine

        eng = FastRadixEngine(settings)
        serve = lambda i, fill, L, M: eng.serve(fill, L, M, ns[i], int(starts[i]))  # noqa: E731
        tree_of = lambda: eng  # noqa: E731
    else:
        from kvsim.cache.base import Request
        from kvsim.cache.radix.reference import RadixCacheModel

        eng = RadixCacheModel(settings)

        def serve(i, fill, L, M):
            req = Request(trace.request_id(i), fill[:L], fill[L:],
                          lora=trace.name_of("lora", int(trace.lora[i])),
                          cache_salt=trace.name_of("cache_salt", int(trace.cache_salt[i])),
                          logprob_start_len=int(starts[i]))
            return eng.serve(req)
        tree_of = lambda: eng.tree  # noqa: E731
    offsets = trace.offsets
    step = max(1, min(1024, n // 100 or 1))
    done = 0
    for i in range(n):
        a, b = int(offsets[i]), int(offsets[i + 1])
        fill = np.concatenate([tokens[a:b].astype(np.int64), out[out_off[i]:out_off[i + 1]]])
        o = serve(i, fill, b - a, int(out_off[i + 1] - out_off[i]))
        cols["cached"][i] = o.cached_tokens
        rejected[i] = o.rejected
        cols["ev_tokens"][i] = o.evicted_tokens
        cols["ev_leaves"][i] = o.evicted_leaves
        cols["max_new"][i] = o.max_new
        cols["extend"][i] = o.extend_tokens
        if progress is not None and i + 1 - done >= step:
            progress(i + 1, n)
            done = i + 1
    if progress is not None and n > done:
        progress(n, n)
    elapsed = time.perf_counter() - t0
    peak = eng.peak_used
    ok = ~rejected
    # a request refused for its logprob start still prefills its placeholder: all rows
    hit = int(cols["cached"].sum())
    new = int(cols["extend"].sum())
    prompt = int(trace.prompt_lengths[ok].sum())
    wanted = np.maximum(trace.output_lengths, 1)
    extra = {
        "engine": engine,
        "page_size": settings.page_size,
        "eviction_policy": settings.eviction_policy,
        "max_total_tokens": settings.capacity,
        **{k: v for k, v in asdict(settings).items() if k not in ("page_size", "capacity", "eviction_policy")},
        # the log line's "#cached-token" / "#new-token" summed over prefill batches, and
        # the cumulative hit rate they give (sglang:realtime_tokens_total cache/compute)
        "sglang_cached_token_sum": hit,
        "sglang_new_token_sum": new,
        "sglang_logged_hit_rate": hit / (hit + new) if hit + new else 0.0,
        "sglang_prompt_hit_rate": hit / prompt if prompt else 0.0,
        "clipped_requests": int((ok & (cols["max_new"] < wanted)).sum()),
        "tree": tree_report(tree_of()),
    }
    config = {"page_size": settings.page_size, "max_total_tokens": settings.capacity,
              "eviction_policy": settings.eviction_policy, "radix_tree": settings.tree,
              "overlap": settings.overlap, "chunked_prefill_size": settings.chunked_prefill_size,
              "finish": settings.finish}
    return ReplayResult(
        policy="radix", config=config, cached_tokens=cols["cached"], rejected=rejected,
        read_cache=~logprob_capped(trace), evictions=cols["ev_leaves"], evicted_tokens=cols["ev_tokens"],
        capacity_tokens=settings.capacity, peak_used_tokens=int(peak), elapsed_s=elapsed, extra=extra), tree_of()
