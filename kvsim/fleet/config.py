"""What a fleet is: N replicas of one engine behind one router (``--replicas``, ``--router``,
``--router-option``), checked where it is built, and a log's requests as the router sees them.

Each replica is the engine today's options configure (capacity, block or page size,
scheduler limits: all per replica). The router's block size is the engine's own KV unit
(vLLM's block, SGLang's page), as Dynamo and llm-d take it from the engine they front.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvsim.engines.base import Workload
from kvsim.errors import ConfigError
from kvsim.fleet.base import RouteRequest, Router
from kvsim.fleet.routers import ROUTERS, make_router

DEFAULT_ROUTER = "round_robin"


@dataclass(frozen=True)
class FleetSpec:
    """``replicas`` engines behind ``router`` (its ``options`` as ``KEY=VALUE`` strings)."""

    replicas: int
    router: str = DEFAULT_ROUTER
    options: tuple[tuple[str, str], ...] = ()
    seed: int = 0
    router_given: bool = True          # False: --router was not given (the default router)

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, (int, np.integer)):
            raise ConfigError(f"--replicas must be a whole number (got {self.replicas!r})")
        if self.replicas < 1:
            raise ConfigError(f"--replicas must be at least 1 (got {self.replicas})")
        if self.router not in ROUTERS:
            raise ConfigError(f"unknown --router {self.router!r}; choose one of {', '.join(ROUTERS)}")
        self.make_router(16)            # an option of another router fails here, before any log is read

    @property
    def option_dict(self) -> dict[str, str]:
        return dict(self.options)

    @property
    def router_class(self) -> type[Router]:
        return ROUTERS[self.router]

    def make_router(self, block_size: int) -> Router:
        """A fresh router over the replicas, with the engine's KV unit as its block size."""
        return make_router(self.router, self.replicas, self.option_dict, block_size=block_size, seed=self.seed)

    def describe(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in self.options)
        default = "" if self.router_given else " (the default router; --router to choose)"
        return f"{self.replicas} replica{'s' if self.replicas != 1 else ''} behind {self.router}" + \
            (f" ({opts})" if opts else "") + default

    def as_dict(self) -> dict[str, Any]:
        return {"replicas": self.replicas, "router": self.router, "router_options": self.option_dict,
                "router_settings": _settings(self.make_router(16)), "seed": self.seed}


def _settings(router: Router) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(router.settings)


def parse_router_options(pairs: Sequence[str] | None) -> tuple[tuple[str, str], ...]:
    """``--router-option KEY=VALUE`` pairs (repeatable); a pair without ``=`` is a ConfigError."""
    out: list[tuple[str, str]] = []
    for pair in pairs or ():
        key, eq, value = str(pair).partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--router-option takes KEY=VALUE, got {pair!r}")
        out.append((key.strip(), value.strip()))
    return tuple(out)


def fleet_from_cli(replicas: int | None, router: str | None, router_options: Sequence[str] | None,
                   seed: int = 0) -> FleetSpec | None:
    """The fleet the options ask for, or None without ``--replicas``."""
    options = parse_router_options(router_options)
    if replicas is None:
        if router is not None:
            raise ConfigError("--router needs --replicas N (the replicas behind it)")
        if options:
            raise ConfigError("--router-option needs --replicas N and --router NAME")
        return None
    return FleetSpec(replicas, router or DEFAULT_ROUTER, options, seed, router_given=router is not None)


# -- the log as the router sees it -------------------------------------------------------------
def has_sessions(trace) -> bool:
    """Does any request carry a session id?"""
    from kvsim.io.trace.columns import NONE

    return bool(len(trace)) and bool((np.asarray(trace.session) != NONE).any())


def log_seconds(trace) -> np.ndarray:
    """Each request's logged arrival, seconds after the first; zeros when some request has none."""
    at = np.asarray(trace.arrival, np.float64)
    if not len(at) or not np.isfinite(at).all():
        return np.zeros(len(at))
    return at - at.min()


class RouteRequests:
    """The log's requests as :class:`RouteRequest` objects, made when asked for (no text)."""

    def __init__(self, trace) -> None:
        self.trace = trace
        tokens = trace.require_tokens("a fleet")
        self.tokens, self.offsets = tokens, trace.offsets
        self.n = len(trace)
        self.session = trace.names("session")
        self.lora = trace.names("lora")
        self.salt = [s or None for s in trace.names("cache_salt")]

    def __len__(self) -> int:
        return self.n

    def request(self, i: int, now: float) -> RouteRequest:
        """Request ``i``, reaching the router at ``now`` (seconds); its id is its index (a log's
        own ids may repeat, and Dynamo books requests by id)."""
        toks = self.tokens[self.offsets[i]:self.offsets[i + 1]]
        return RouteRequest(i, str(i), toks, now, self.session[i], self.lora[i], self.salt[i])


def router_block_size(spec, options) -> int:
    """The engine's KV unit (``spec.unit``: vLLM's block size, SGLang's page size), the router's block."""
    return int(getattr(options, spec.unit))


def checked_router(fleet: FleetSpec, spec, options, trace) -> Router:
    """A fresh router for ``spec``'s engine, after checking the log and the engine can feed it."""
    router = fleet.make_router(router_block_size(spec, options))
    router.check_log(has_sessions(trace))
    if router.needs_events:
        spec.kv_events()            # an engine without KV events: a clear error
    return router


# -- a replica's share of the log ---------------------------------------------------------------
def _gather(values: np.ndarray, offsets: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows ``idx`` of a ragged array (``values`` cut at ``offsets``), and their offsets."""
    starts, lengths = offsets[idx], offsets[idx + 1] - offsets[idx]
    out_off = np.zeros(len(idx) + 1, np.int64)
    np.cumsum(lengths, out=out_off[1:])
    total = int(out_off[-1])
    if len(idx) and total >= 64 * len(idx):     # long rows: one slice copy each beats an index array
        return np.concatenate([values[a:a + n] for a, n in zip(starts.tolist(), lengths.tolist())]), out_off
    at = np.arange(total, dtype=np.int64) + np.repeat(starts - out_off[:-1], lengths)
    return values[at], out_off


def sub_workload(work: Workload, idx: np.ndarray) -> Workload:
    """The requests ``idx`` of ``work``, in that order (a replica's share; output ids as logged or
    synthesized for the whole log, so still unique)."""
    prompt, prompt_off = _gather(work.prompt_tokens, work.prompt_offsets, idx)
    out, out_off = _gather(work.output_tokens, work.output_offsets, idx)
    pick = idx.tolist()
    return Workload(prompt, prompt_off, out, out_off, [work.lora[i] for i in pick], [work.cache_salt[i] for i in pick],
                    work.prompt_logprobs[idx], work.logprob_start_len[idx], [work.request_ids[i] for i in pick])


def replica_replay(policy: str, trace, work, idx: np.ndarray, options):
    """The sequential replay of the requests ``idx`` of ``trace`` (``work``: its workload), in that
    order: the trace itself when that is all of it, else its share (the readable model for a
    small share, as :func:`kvsim.drive.sequential.replay` picks it)."""
    from kvsim.drive.sequential import SMALL_REPLAY_TOKENS, replay, replay_workload

    if len(idx) == len(trace) and bool((idx == np.arange(len(trace))).all()):
        return replay(policy, trace, options)
    small = int(trace.prompt_lengths[idx].sum() + trace.output_lengths[idx].sum()) <= SMALL_REPLAY_TOKENS
    return replay_workload(policy, sub_workload(work, idx), options, "reference" if small else "fast",
                           reported_as="fast")
