"""Replay the connector calls the real vLLM scheduler made through kvsim's connector.

``offload_vllm_driver.py`` (with ``record``) logs every call the real ``Scheduler`` made
to its ``OffloadingConnectorScheduler`` (request state at the call, block hashes numbered
as ints) and what it answered. :func:`replay_calls` makes the same calls on kvsim's
:class:`~kvsim.tiers.vllm_connector.OffloadConnector` and returns the first disagreement
(None when every answer matches): each lookup's ``(external, load_async)``, and each
step's load and store jobs (job id and keys) and the chunks its stores evicted, in order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvsim.tiers.vllm_connector import OffloadConnector, OffloadSettings


@dataclass(eq=False)
class CallRequest:
    """A request as the recorded call saw it (the attributes the connector reads)."""

    request_id: str
    block_hashes: list[int] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    skip_reading_prefix_cache: bool = False
    _num_tokens: int = 0
    _finished: bool = False

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    @property
    def is_finished(self) -> bool:
        return self._finished

    def update(self, state: dict[str, Any]) -> CallRequest:
        # block_hashes is extended in place: the connector reads the live list
        self.block_hashes[len(self.block_hashes):] = state["hashes"][len(self.block_hashes):]
        self.num_prompt_tokens = state["num_prompt_tokens"]
        self.num_computed_tokens = state["num_computed_tokens"]
        self.skip_reading_prefix_cache = state["skip"]
        self._num_tokens = state["num_tokens"]
        self._finished = state["finished"]
        return self


def settings_of(job: dict[str, Any], num_chunks: int) -> OffloadSettings:
    """kvsim's settings for a driver job (capacity as the real spec derived it)."""
    return OffloadSettings(num_chunks=num_chunks, gpu_block_size=int(job["block_size"]),
                           block_size=job.get("offload_block_size"),
                           eviction_policy=job.get("eviction_policy", "lru"),
                           store_threshold=int(job.get("store_threshold", 0)))


def replay_calls(calls: list[list[Any]], connector: OffloadConnector) -> str | None:
    """Drive ``connector`` with the recorded calls; the first answer that differs, or None."""
    reqs: dict[str, CallRequest] = {}
    evicted: list = []
    prepare_store = connector.manager.prepare_store

    def recorded_prepare_store(keys, ctx):
        plan = prepare_store(keys, ctx)
        if plan is not None:
            evicted.extend(plan.evicted)
        return plan
    connector.manager.prepare_store = recorded_prepare_store  # type: ignore[method-assign]

    def req(state: dict[str, Any]) -> CallRequest:
        return reqs.setdefault(state["rid"], CallRequest(state["rid"])).update(state)

    for n, call in enumerate(calls):
        kind = call[0]
        if kind == "new":
            connector.on_new_request(req(call[1]))
        elif kind == "match":
            _, state, local, want = call
            got = list(connector.get_num_new_matched_tokens(req(state), local))
            if got != want:
                return f"call {n}: match {state['rid']} local={local}: kvsim {got}, vLLM {want}"
        elif kind == "alloc":
            connector.update_state_after_alloc(req(call[1]), call[2])
        elif kind == "meta":
            _, states, scheduled, finished, finished_states, preempted, loads, stores, want_evicted = call
            evicted.clear()
            for s in states:
                req(s)
            for rid in finished:
                if finished_states.get(rid):
                    req(finished_states[rid])
            meta = connector.build_connector_meta(scheduled, finished, preempted)
            got_loads = {str(j): sorted(k) for j, k in meta.load_jobs.items()}
            got_stores = {str(j): sorted(k) for j, k in meta.store_jobs.items()}
            if got_loads != loads or got_stores != stores or evicted != want_evicted:
                return (f"call {n}: step jobs differ: kvsim loads {got_loads} stores {got_stores} "
                        f"evicted {evicted}, vLLM loads {loads} stores {stores} evicted {want_evicted}")
        elif kind == "output":
            connector.update_connector_output(call[1])
        elif kind == "finished":
            connector.request_finished(req(call[1]))
        else:
            raise ValueError(f"unknown call {kind!r}")
    return None
