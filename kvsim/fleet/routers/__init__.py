"""The routers by ``--router`` name: one module per router family, one line each here."""
from __future__ import annotations

from collections.abc import Mapping

from kvsim.errors import ConfigError
from kvsim.fleet.base import Router
from kvsim.fleet.routers.dynamo import DynamoRouter
from kvsim.fleet.routers.llmd import LlmdApprox, LlmdPrecise
from kvsim.fleet.routers.production_stack import PrefixAware
from kvsim.fleet.routers.sglang import CacheAware, PrefixHash
from kvsim.fleet.routers.simple import LeastLoad, PowerOfTwo, RandomRouter, RoundRobin, Session

ROUTERS: dict[str, type[Router]] = {
    cls.name: cls
    for cls in (RoundRobin, RandomRouter, LeastLoad, PowerOfTwo, Session, CacheAware, PrefixHash,
                DynamoRouter, LlmdApprox, LlmdPrecise, PrefixAware)
}


def make_router(name: str, num_replicas: int, options: Mapping[str, str] | None = None, *,
                block_size: int = 16, seed: int = 0) -> Router:
    """The router called ``name`` over ``num_replicas`` replicas; ``ConfigError`` for an unknown name or option."""
    cls = ROUTERS.get(name)
    if cls is None:
        raise ConfigError(f"unknown router {name!r}; choose one of {', '.join(ROUTERS)}")
    return cls(num_replicas, options, block_size=block_size, seed=seed)
