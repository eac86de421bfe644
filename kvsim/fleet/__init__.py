"""Fleets: N replica engines behind a router modelled on the real routers' code (docs/fleet.md).

The routers: ``make_router(name, num_replicas, options, block_size=, seed=)`` builds one; the
interface (``route``, ``prefill_done``, ``finished``, ``kv_event``, ``candidates``) is in
:mod:`kvsim.fleet.base`, the events in :mod:`kvsim.fleet.events`, and each router's rules,
with release, file and line, in ``docs/engines/routers.md``.

The replays: :mod:`kvsim.fleet.config` (``FleetSpec``: what ``--replicas`` / ``--router`` /
``--router-option`` ask for; the log as the router sees it; a replica's share),
:mod:`kvsim.fleet.sequential` (``--replay sequential``), :mod:`kvsim.fleet.clock` and
:mod:`kvsim.fleet.concurrent` (``--replay steps|timed``: per-replica timelines on one
discrete-event loop), :mod:`kvsim.fleet.bounds` (the fleet and routed bounds),
:mod:`kvsim.fleet.summary` (the ``fleet`` summary), :mod:`kvsim.fleet.sweep` (``kvsim sweep
--replicas``).
"""
from __future__ import annotations

from kvsim.fleet.base import IDLE, ReplicaLoad, RouteRequest, Router
from kvsim.fleet.events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from kvsim.fleet.routers import ROUTERS, make_router

__all__ = ["IDLE", "ROUTERS", "AllBlocksCleared", "BlockRemoved", "BlockStored", "KvEvent",
           "ReplicaLoad", "RouteRequest", "Router", "make_router"]
