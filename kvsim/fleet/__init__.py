"""Routers in front of N replica engines, modelled on the real routers' code.

``make_router(name, num_replicas, options, block_size=, seed=)`` builds one; the interface
(``route``, ``prefill_done``, ``finished``, ``kv_event``, ``candidates``) is in
:mod:`kvsim.fleet.base`, the events in :mod:`kvsim.fleet.events`, and each router's rules,
with release, file and line, in ``docs/engines/routers.md``.
"""
from __future__ import annotations

from kvsim.fleet.base import IDLE, ReplicaLoad, RouteRequest, Router
from kvsim.fleet.events import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from kvsim.fleet.routers import ROUTERS, make_router

__all__ = ["IDLE", "ROUTERS", "AllBlocksCleared", "BlockRemoved", "BlockStored", "KvEvent",
           "ReplicaLoad", "RouteRequest", "Router", "make_router"]
