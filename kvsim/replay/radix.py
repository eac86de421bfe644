"""Sequential replay of a trace through SGLang RadixAttention (``--policy radix``).

One request at a time, as an SGLang 0.5.23 server serves requests sent one after the
other: the scheduler's full call sequence for a lone request (see
:mod:`kvsim.cache.radix_cache`), so hits and evictions equal SGLang's request for
request (``tests/test_radix_oracle.py``). ``engine="fast"`` (default) runs
:mod:`kvsim.cache.radix_fast`; ``engine="reference"`` the readable model, which gives
identical results, slowly.

Radix-only options live in ``SimOptions.extra`` (defaults = a default SGLang server):

==========================  =============================================================
``radix_tree``              ``"unified"`` (UnifiedRadixCache, what the server builds) or
                            ``"classic"`` (RadixCache)
``overlap``                 overlap scheduler on (default ``True``;
                            ``--disable-overlap-schedule`` = ``False``)
``chunked_prefill_size``    SGLang's ``--chunked-prefill-size`` (-1 disables); default
                            from ``--gpu`` as SGLang derives it, else 4096
``finish``                  ``"length"`` (default: replies end at their logged length,
                            ``max_tokens`` = that length) or ``"stop"`` (they end with a
                            stop token; with overlap one more decode step runs, §3.3)
``max_new_tokens``          the client's ``max_tokens`` with ``finish="stop"``
                            (default: none, clipped to the pool as SGLang does)
``eviction_amount``         ``"shortfall"`` (0.5.23) or ``"need"`` (before 2026-07, §5.5)
``slru_protected_threshold``, ``tlru_threshold``, ``tlru_next_prompt_estimate``
                            ``--radix-eviction-policy-config`` of slru / tlru
==========================  =============================================================
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

from kvsim.cache.evict_policy import POLICIES, policy_config
from kvsim.cache.radix_cache import DEFAULT_CHUNKED_PREFILL, EVICTION_AMOUNTS, FINISHES, namespace
from kvsim.cache.tree_stats import tree_report
from kvsim.errors import ConfigError
from kvsim.io.trace import Trace
from kvsim.replay.options import SimOptions
from kvsim.replay.requests import output_token_arrays
from kvsim.replay.result import ReplayResult

ENGINES = ("fast", "reference")
TREES = ("unified", "classic")


@dataclass(frozen=True)
class RadixSettings:
    """Resolved settings of one radix replay."""

    page_size: int
    capacity: int | None            # SGLang's max_total_num_tokens; None = unlimited
    eviction_policy: str
    policy_config: dict
    tree: str
    overlap: bool
    chunked_prefill_size: int
    finish: str
    max_new_tokens: int | None
    eviction_amount: str

    def engine_kwargs(self) -> dict[str, Any]:
        return dict(page_size=self.page_size, capacity=self.capacity, eviction_policy=self.eviction_policy,
                    flavor=self.tree, overlap=self.overlap, chunked_prefill_size=self.chunked_prefill_size,
                    policy_config=self.policy_config, finish_mode=self.finish,
                    max_new_tokens=self.max_new_tokens, eviction_amount=self.eviction_amount)


def sglang_chunked_prefill_size(gpu: str | None) -> int:
    """SGLang's default --chunked-prefill-size for a GPU (arg_groups/memory_hook.py)."""
    if not gpu:
        return DEFAULT_CHUNKED_PREFILL
    from kvsim.models import MiB, gpu_memory_bytes

    mib = gpu_memory_bytes(gpu) / MiB
    for limit, size in ((20 * 1024, 2048), (35 * 1024, 4096), (60 * 1024, 4096), (90 * 1024, 8192),
                        (160 * 1024, 8192)):
        if mib < limit:
            return size
    return 16384


def radix_settings(options: SimOptions) -> RadixSettings:
    """Check and resolve the options the radix model uses; bad values give a ConfigError."""
    from kvsim.models import radix_max_total_tokens

    extra = options.extra or {}
    p = int(options.page_size)
    policy = str(options.eviction_policy or "lru").lower()
    if policy not in POLICIES:
        raise ConfigError(f"unknown radix eviction policy {options.eviction_policy!r}; "
                          f"choose from {', '.join(POLICIES)}")
    tree = str(extra.get("radix_tree", "unified"))
    if tree not in TREES:
        raise ConfigError(f"unknown radix tree {tree!r}; choose from {', '.join(TREES)}")
    if policy == "tlru" and tree != "unified":
        raise ConfigError("the tlru eviction policy needs the unified tree (SGLang refuses it otherwise)")
    chunk = extra.get("chunked_prefill_size")
    chunk = sglang_chunked_prefill_size(options.gpu) if chunk is None else int(chunk)
    if chunk == 0 or chunk < -1:
        raise ConfigError(f"chunked prefill size must be positive or -1 (disabled), got {chunk}")
    finish = str(extra.get("finish", "length"))
    if finish not in FINISHES:
        raise ConfigError(f"unknown finish {finish!r}; choose from {', '.join(FINISHES)}")
    amount = str(extra.get("eviction_amount", "shortfall"))
    if amount not in EVICTION_AMOUNTS:
        raise ConfigError(f"unknown eviction amount {amount!r}; choose from {', '.join(EVICTION_AMOUNTS)}")
    cap = extra.get("max_new_tokens")
    if cap is not None and int(cap) < 0:
        raise ConfigError(f"max_new_tokens must be >= 0, got {cap}")
    return RadixSettings(
        page_size=p, capacity=radix_max_total_tokens(options), eviction_policy=policy,
        policy_config=policy_config(policy, extra), tree=tree, overlap=bool(extra.get("overlap", True)),
        chunked_prefill_size=chunk, finish=finish, max_new_tokens=None if cap is None else int(cap),
        eviction_amount=amount)


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
    settings = radix_settings(options)
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
        from kvsim.cache.radix_fast import FastRadixEngine

        eng = FastRadixEngine(**settings.engine_kwargs())
        serve = lambda i, fill, L, M: eng.serve(fill, L, M, ns[i], int(starts[i]))  # noqa: E731
        tree_of = lambda: eng  # noqa: E731
    else:
        from kvsim.cache.base import Request
        from kvsim.cache.radix_cache import RadixCacheModel

        eng = RadixCacheModel(**settings.engine_kwargs())

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
