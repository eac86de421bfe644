"""Routers that ignore prefixes: round_robin, random, least_load, power_of_two, session.

Re-stated in ``docs/engines/routers.md §1`` (smg 1.13.0 policies; production-stack's
session router).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvsim.fleet.base import InFlightRouter, ReplicaLoad, RouteRequest, Router, lowest
from kvsim.fleet.options import check
from kvsim.fleet.ring import HashRing


@dataclass(frozen=True)
class NoOptions:
    """This router takes no options."""


class RoundRobin(Router):
    """``w = c mod N; c += 1`` (``docs/engines/routers.md §1``)."""

    name = "round_robin"
    Settings = NoOptions

    def _setup(self) -> None:
        self.counter = 0

    def candidates(self, req: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> frozenset[int]:
        return frozenset({self.counter % self.num_replicas})

    def _dispatched(self, req: RouteRequest, replica: int, now: float) -> None:
        self.counter += 1


class RandomRouter(Router):
    """Uniform over all replicas, from the seeded RNG (``docs/engines/routers.md §1``)."""

    name = "random"
    Settings = NoOptions

    def candidates(self, req: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> frozenset[int]:
        return frozenset(range(self.num_replicas))


class LeastLoad(InFlightRouter):
    """Fewest in-flight requests (counted by the router), lowest index on ties (``docs/engines/routers.md §1``)."""

    name = "least_load"
    Settings = NoOptions
    load_aware = True

    def candidates(self, req: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> frozenset[int]:
        return frozenset({min(lowest(self.in_flight))})


class PowerOfTwo(InFlightRouter):
    """Two distinct random replicas; the one with fewer in flight, the first drawn on equal load.

    ``docs/engines/routers.md §1``.
    """

    name = "power_of_two"
    Settings = NoOptions
    load_aware = True

    def candidates(self, req: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> frozenset[int]:
        if self.num_replicas == 1:
            return frozenset({0})
        # w can win iff some other replica is at least as loaded (drawn second).
        load = self.in_flight
        return frozenset(w for w in range(self.num_replicas)
                         if any(load[u] >= load[w] for u in range(self.num_replicas) if u != w))

    def choose(self, req: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> int:
        if self.num_replicas == 1:
            return 0
        a, b = self.rng.sample(range(self.num_replicas), 2)
        return b if self.in_flight[b] < self.in_flight[a] else a


@dataclass(frozen=True)
class SessionSettings:
    """production-stack's session router: a consistent-hash ring (uhashring, 160 points per node)."""

    vnodes: int = 160

    def __post_init__(self) -> None:
        check(self.vnodes >= 1, "vnodes must be at least 1")


class Session(InFlightRouter):
    """Consistent hash of the session id; a request without one goes to the least busy replica.

    ``docs/engines/routers.md §1``: production-stack hashes ``--session-key`` on a uhashring
    ring; a request without the key goes to the lowest-QPS endpoint, which kvsim reads as
    the fewest in flight (lowest index on ties). A log with no session ids at all is an
    input error (``needs_sessions``).
    """

    name = "session"
    Settings = SessionSettings
    needs_sessions = True

    def _setup(self) -> None:
        super()._setup()
        self.ring = HashRing(self.num_replicas, self.settings.vnodes)

    def candidates(self, req: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> frozenset[int]:
        if req.session is None:
            return frozenset({min(lowest(self.in_flight))})
        return frozenset({self.ring.lookup(req.session.encode())})
