"""``/metrics``: Prometheus text under the engines' own metric names, so dashboards built
for vLLM (``--policy apc``) or SGLang (``--policy radix``) work unchanged.

Names, label names and help texts follow vLLM 0.33 ``v1/metrics/loggers.py`` (labels
``model_name``, ``engine``) and SGLang 0.5.23 ``srt/observability/metrics_collector.py``
(scheduler labels ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``,
``moe_ep_rank``; request labels ``model_name``, ``engine_type``, ``is_streaming``). Values
come from the cache model; gauges describe it between requests (an idle engine).
``kvsim:*`` series add what only kvsim knows: time spent in the cache model and, in proxy
mode, how predictions compared with the server's answers.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401  (re-exported for the app)

from kvsim.engines.serving import EngineState, Served

#: vLLM's series under its engine labels alone, in registration order:
#: attribute -> (kind, name, help)
_VLLM_SERIES = {
    "v_running": (Gauge, "vllm:num_requests_running", "Number of requests in model execution batches."),
    "v_waiting": (Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed."),
    "v_usage": (Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
    "v_queries": (Counter, "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."),
    "v_hits": (Counter, "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."),
    "v_preempt": (Counter, "vllm:num_preemptions", "Cumulative number of preemption from the engine."),
    "v_prompt": (Counter, "vllm:prompt_tokens", "Number of prefill tokens processed."),
    "v_cached": (Counter, "vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external)."),
    "v_gen": (Counter, "vllm:generation_tokens", "Number of generation tokens processed."),
}
#: SGLang's scheduler gauges, in registration order: attribute -> (name, help)
_SGLANG_GAUGES = {
    "s_running": ("sglang:num_running_reqs", "The number of running requests."),
    "s_queue": ("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
    "s_hit_rate": ("sglang:cache_hit_rate", "The prefix cache hit rate."),
    "s_usage": ("sglang:token_usage", "The token usage."),
    "s_used": ("sglang:num_used_tokens", "The number of used tokens."),
    "s_available": ("sglang:kv_available_tokens", "Number of free token slots in the KV cache pool."),
    "s_evictable": ("sglang:kv_evictable_tokens",
                    "Number of evictable (radix-cached) token slots in the KV cache pool."),
    "s_kv_used": ("sglang:kv_used_tokens", "Number of actively used token slots in the KV cache pool."),
}

#: the vLLM metrics kvsim serve exports (tests check each against vLLM's source)
VLLM_NAMES = (*(name for _, name, _ in _VLLM_SERIES.values()), "vllm:request_success",
              "vllm:request_prompt_tokens", "vllm:request_generation_tokens")
#: the SGLang metrics kvsim serve exports
SGLANG_NAMES = (*(name for name, _ in _SGLANG_GAUGES.values()), "sglang:realtime_tokens_total",
                "sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:cached_tokens_total",
                "sglang:num_requests_total")


def _buckets_1_2_5(limit: int) -> list[float]:
    """vLLM ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to ``limit``."""
    out, exp = [], 0
    while True:
        for m in (1, 2, 5):
            v = m * 10 ** exp
            if v > limit:
                return out
            out.append(float(v))
        exp += 1


class ServeMetrics:
    """The server's registry; ``observe`` after each request, ``render`` for ``/metrics``."""

    def __init__(self, family: str, model_name: str, max_model_len: int) -> None:
        self.vllm = family == "vllm"     # vLLM's metric names, else SGLang's
        r = self.registry = CollectorRegistry(auto_describe=True)
        self._running = 0
        if self.vllm:
            self._init_vllm(r, model_name, max_model_len)
        else:
            self._init_sglang(r, model_name)
        self.model_seconds = Counter("kvsim:cache_model_cpu_seconds", "CPU seconds spent in the cache model.",
                                     registry=r)
        self.held = Gauge("kvsim:held_tokens", "KV tokens the cache model holds (in use or cached).", registry=r)
        self.rejected = Counter("kvsim:rejected_requests", "Requests that cannot fit even an empty cache.",
                                registry=r)
        self.resets = Counter("kvsim:prefix_cache_resets", "Successful prefix cache resets.", registry=r)
        self.proxy = Counter("kvsim:proxy_comparisons", "Proxied requests by how kvsim's predicted "
                             "cached_tokens compared with the server's.", ["result"], registry=r)
        self.proxy_diff = Counter("kvsim:proxy_cached_tokens_abs_diff", "Sum of |predicted - served| "
                                  "cached_tokens over proxied requests.", registry=r)
        self.upstream_errors = Counter("kvsim:upstream_errors", "Proxied requests the server answered with an "
                                       "error or not at all.", ["status"], registry=r)
        self.unmodelled = Counter("kvsim:proxy_unmodelled_requests", "Proxied requests kvsim could not read "
                                  "(forwarded, not modelled, not recorded).", registry=r)

    # -- vLLM ----------------------------------------------------------------------------
    def _init_vllm(self, r: CollectorRegistry, model: str, max_model_len: int) -> None:
        labels = ["model_name", "engine"]
        values = (model, "0")

        def histogram(name, doc):
            return Histogram(name, doc, labels, buckets=_buckets_1_2_5(max_model_len), registry=r).labels(*values)

        for attribute, (kind, name, doc) in _VLLM_SERIES.items():
            setattr(self, attribute, kind(name, doc, labels, registry=r).labels(*values))
        self.v_success = Counter("vllm:request_success", "Count of successfully processed requests.",
                                 labels + ["finished_reason"], registry=r)
        self.v_success_values = values
        self.v_req_prompt = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.")
        self.v_req_gen = histogram("vllm:request_generation_tokens", "Number of generation tokens processed.")
        self._queries_seen = self._hits_seen = 0

    # -- SGLang --------------------------------------------------------------------------
    def _init_sglang(self, r: CollectorRegistry, model: str) -> None:
        sched = {"model_name": model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
                 "moe_ep_rank": "0"}
        self.s_tok_labels = {"model_name": model, "engine_type": "unified"}

        for attribute, (name, doc) in _SGLANG_GAUGES.items():
            setattr(self, attribute, Gauge(name, doc, list(sched), multiprocess_mode="mostrecent",
                                           registry=r).labels(**sched))
        realtime = Counter("sglang:realtime_tokens_total", "Total number of tokens processed (updated on each "
                           "log interval). mode: prefill_compute, prefill_cache, decode.", list(sched) + ["mode"],
                           registry=r)
        self.s_realtime = {m: realtime.labels(**sched, mode=m) for m in ("prefill_compute", "prefill_cache", "decode")}
        stream = list(self.s_tok_labels) + ["is_streaming"]
        self.s_prompt = Counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", stream,
                                registry=r)
        self.s_gen = Counter("sglang:generation_tokens_total", "Number of generation tokens processed.", stream,
                             registry=r)
        self.s_cached = Counter("sglang:cached_tokens_total", "Number of cached prompt tokens by source "
                                "(device/host/storage).", list(self.s_tok_labels) + ["cache_source"], registry=r)
        self.s_requests = Counter("sglang:num_requests_total", "Number of requests processed.", stream, registry=r)

    # -- updates -------------------------------------------------------------------------
    def request_started(self) -> None:
        self._running += 1
        self._set_running()

    def request_finished(self) -> None:
        self._running -= 1
        self._set_running()

    def _set_running(self) -> None:
        (self.v_running if self.vllm else self.s_running).set(self._running)

    def observe(self, served: Served, prompt_tokens: int, stream: bool, finish_reason: str,
                state: EngineState, model_seconds: float) -> None:
        """Count one request the cache model served."""
        self.model_seconds.inc(model_seconds)
        if served.rejected:
            self.rejected.inc()
        elif self.vllm:
            self.v_prompt.inc(prompt_tokens)
            self.v_cached.inc(served.cached_tokens)
            self.v_gen.inc(served.generated)
            if finish_reason != "error":  # a failed upstream request is no success
                self.v_success.labels(*self.v_success_values, finish_reason).inc()
            self.v_req_prompt.observe(prompt_tokens)
            self.v_req_gen.observe(served.generated)
        else:
            labels = {**self.s_tok_labels, "is_streaming": "true" if stream else "false"}
            self.s_prompt.labels(**labels).inc(prompt_tokens)
            self.s_gen.labels(**labels).inc(served.generated)
            if served.cached_tokens:
                self.s_cached.labels(**self.s_tok_labels, cache_source="device").inc(served.cached_tokens)
            self.s_requests.labels(**labels).inc()
            self.s_realtime["prefill_cache"].inc(served.cached_tokens)
            self.s_realtime["prefill_compute"].inc(served.computed_tokens)
            self.s_realtime["decode"].inc(max(served.generated - 1, 0))
            total = served.cached_tokens + served.computed_tokens
            self.s_hit_rate.set(served.cached_tokens / total if total else 0.0)
        self.engine_state(state)

    def engine_state(self, state: EngineState) -> None:
        self.held.set(state.held_tokens)
        if self.vllm:
            self.v_queries.inc(state.prefix_queries - self._queries_seen)
            self.v_hits.inc(state.prefix_hits - self._hits_seen)
            self._queries_seen, self._hits_seen = state.prefix_queries, state.prefix_hits
            self.v_usage.set(state.usage)
        else:
            self.s_usage.set(round(state.usage, 2))
            cap = state.capacity_tokens
            used = 0 if cap is None else cap - state.available_tokens - state.evictable_tokens
            self.s_used.set(used)
            self.s_kv_used.set(used)
            if state.available_tokens is not None:
                self.s_available.set(state.available_tokens)
            self.s_evictable.set(state.evictable_tokens or 0)

    def engine_reset(self, state: EngineState) -> None:
        """After a reset the engine's own counters may start again from zero."""
        self.resets.inc()
        if self.vllm:
            self._queries_seen = min(self._queries_seen, state.prefix_queries)
            self._hits_seen = min(self._hits_seen, state.prefix_hits)
        self.engine_state(state)

    def compared(self, predicted: int | None, served: int | None) -> None:
        if predicted is None or served is None:
            self.proxy.labels("unreported").inc()
            return
        self.proxy.labels("exact" if predicted == served else "differ").inc()
        self.proxy_diff.inc(abs(predicted - served))

    def render(self) -> bytes:
        return generate_latest(self.registry)
