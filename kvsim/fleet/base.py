"""The router interface: what a fleet driver tells a router, and what the router answers.

A router stands in front of N replica engines and keeps its own state, apart from the
engines' caches (``docs/engines/routers.md §1``). The fleet driver calls it at four moments
of a request's life:

1. ``route(req, loads, now)`` when the request reaches the router: it returns the replica
   (0..N-1) and does the router's dispatch-time bookkeeping at once (in-flight +1, the
   approximate index insert, Dynamo's booking of prefill tokens and blocks).
2. ``prefill_done(req, replica, now)`` when the replica emits the request's first token
   (Dynamo's ``mark_prefill_complete``).
3. ``finished(req, replica, now)`` when the response is complete (in-flight -1, Dynamo's
   ``free``).
4. ``kv_event(replica, event, now)`` for every block a replica stores or removes, for the
   routers fed by engine events (``needs_events``: Dynamo in events mode, llm-d precise).

``loads`` is what each replica reports when polled (``ReplicaLoad``: waiting and running
requests, KV usage in [0, 1]); routers that count their own in-flight requests (the SGLang
gateway, Dynamo) ignore it. ``candidates(req, loads, now)`` answers, without changing any
state, the set of replicas the real router could pick at that moment: where the real
router breaks a tie at random, kvsim picks from that set with a seeded RNG, and the tests
accept any member.
"""
from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np

from kvsim.errors import ConfigError
from kvsim.fleet.events import KvEvent
from kvsim.fleet.options import parse_settings


class RouteRequest:
    """One request as a router sees it: kvsim logs hold tokens, never raw text."""

    __slots__ = ("index", "request_id", "_tokens", "arrival", "session", "lora", "cache_salt")

    def __init__(self, index: int, request_id: str, tokens: np.ndarray, arrival: float = 0.0,
                 session: str | None = None, lora: str | None = None, cache_salt: str | None = None):
        self.index = index
        self.request_id = request_id
        self._tokens = tokens     # the log's prompt token ids: made int64 when first read
        self.arrival = arrival    # seconds of log time
        self.session = session
        self.lora = lora
        self.cache_salt = cache_salt

    @property
    def tokens(self) -> np.ndarray:
        """The prompt's token ids, int64."""
        t = self._tokens
        if t.dtype != np.int64:
            t = self._tokens = t.astype(np.int64)
        return t

    @property
    def prompt_len(self) -> int:
        """How many tokens the prompt has (without reading them)."""
        return len(self._tokens)

    @property
    def namespace(self) -> tuple[str | None, str | None]:
        """The cache namespace a prefix lives in (LoRA adapter, cache salt)."""
        return (self.lora, self.cache_salt)

    def __repr__(self) -> str:
        return f"RouteRequest(index={self.index}, request_id={self.request_id!r}, {self.prompt_len} tokens)"


class ReplicaLoad(NamedTuple):
    """What a replica engine reports when a router polls its load."""

    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0         # share of the replica's KV blocks in use, [0, 1]


IDLE = ReplicaLoad(0, 0, 0.0)


class Router(ABC):
    """A routing policy over ``num_replicas`` replicas, with the real router's own state.

    Subclasses set ``name``, ``Settings`` (a frozen dataclass whose fields are the router's
    options, named as the real router names them, with its release's defaults) and
    implement ``candidates`` and ``_dispatched``.
    """

    name: ClassVar[str]
    Settings: ClassVar[type]
    needs_events: ClassVar[bool] = False    # fed by engine KV events
    load_aware: ClassVar[bool] = False      # its choice depends on load
    needs_sessions: ClassVar[bool] = False  # a log without session ids cannot be routed

    def __init__(self, num_replicas: int, options: Mapping[str, str] | None = None, *,
                 block_size: int = 16, seed: int = 0) -> None:
        if num_replicas < 1:
            raise ConfigError(f"--replicas must be at least 1 (got {num_replicas})")
        if block_size < 1:
            raise ConfigError(f"block size must be at least 1 (got {block_size})")
        self.num_replicas = num_replicas
        self.block_size = block_size
        self.settings: Any = parse_settings(self.name, self.Settings, options or {})
        self.rng = random.Random(seed)
        self._setup()

    def _setup(self) -> None:
        """Build the router's state once ``settings`` are known (none by default)."""

    @abstractmethod
    def candidates(self, req: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> frozenset[int]:
        """The replicas the real router could pick for ``req`` now (query only: no state change)."""

    def choose(self, req: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> int:
        """kvsim's pick among the candidates: seeded uniform choice, as the real random ties."""
        cands = sorted(self.candidates(req, loads, now))
        return cands[0] if len(cands) == 1 else self.rng.choice(cands)

    def route(self, req: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> int:
        """Choose a replica for ``req`` and do the router's dispatch-time bookkeeping."""
        replica = self.choose(req, loads, now)
        self.dispatch(req, replica, now, loads)
        return replica

    def dispatch(self, req: RouteRequest, replica: int, now: float,
                 loads: Sequence[ReplicaLoad] = ()) -> None:
        """The bookkeeping of sending ``req`` to ``replica`` (``route`` calls it; tests call it
        to make kvsim's state follow a real router's choice)."""
        self._dispatched(req, replica, now)

    def _dispatched(self, req: RouteRequest, replica: int, now: float) -> None:
        """The router's bookkeeping once ``req`` is sent to ``replica`` (none by default)."""

    def prefill_done(self, req: RouteRequest, replica: int, now: float) -> None:
        """``req``'s first token was produced on ``replica``."""

    def finished(self, req: RouteRequest, replica: int, now: float) -> None:
        """``req``'s response on ``replica`` is complete."""

    def kv_event(self, replica: int, event: KvEvent, now: float) -> None:
        """``replica`` stored or removed blocks (used by routers with ``needs_events``)."""

    @classmethod
    def option_names(cls) -> list[str]:
        """The router's option names, as ``--router-option`` takes them."""
        return list(cls.Settings.__dataclass_fields__)

    def check_log(self, has_sessions: bool) -> None:
        """Raise ``ConfigError`` when the log cannot be routed by this router (no session ids)."""
        if self.needs_sessions and not has_sessions:
            raise ConfigError(f"router {self.name} needs session ids, and the log has none "
                              "(give the log a session field, or choose another --router)")


class InFlightRouter(Router):
    """A router that counts its own in-flight requests per replica (+1 at dispatch, -1 at completion)."""

    def _setup(self) -> None:
        self.in_flight = [0] * self.num_replicas

    def dispatch(self, req: RouteRequest, replica: int, now: float,
                 loads: Sequence[ReplicaLoad] = ()) -> None:
        super().dispatch(req, replica, now, loads)
        self.in_flight[replica] += 1

    def finished(self, req: RouteRequest, replica: int, now: float) -> None:
        self.in_flight[replica] -= 1


def lowest(values: Sequence[float], among: Sequence[int] | None = None) -> frozenset[int]:
    """The indices (of ``among``, default all) holding the smallest value."""
    idx = range(len(values)) if among is None else among
    best = min(values[i] for i in idx)
    return frozenset(i for i in idx if values[i] == best)
