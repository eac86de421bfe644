"""The KV events a replica engine emits, as vLLM publishes them (what Dynamo and llm-d consume).

``block_hashes`` are the engine's own opaque keys; routers that need content compute their
own keys from ``token_ids`` (full blocks only, ``block_size`` tokens each) and keep a map
from the engine's keys to theirs so that ``BlockRemoved`` applies
(``docs/engines/routers.md §3.1``, ``docs/engines/routers.md §4.3``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

import numpy as np

Medium = Literal["GPU", "CPU"]


@dataclass(frozen=True)
class BlockStored:
    """Blocks stored on a replica: a chain continuing ``parent_block_hash`` (None: from the root)."""

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: np.ndarray          # len(block_hashes) * block_size tokens
    block_size: int
    lora_name: str | None = None
    cache_salt: str | None = None
    medium: Medium = "GPU"


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks the replica evicted from ``medium``."""

    block_hashes: tuple[int, ...]
    medium: Medium = "GPU"


@dataclass(frozen=True)
class AllBlocksCleared:
    """The replica dropped its whole cache."""


KvEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]


def from_engine(event: tuple) -> KvEvent:
    """An engine's plain event tuple (``kvsim.engines.*.events``) as a :data:`KvEvent`."""
    kind = event[0]
    if kind == "stored":
        _, hashes, parent, tokens, block_size, lora, salt = event
        return BlockStored(tuple(hashes), parent, tokens, block_size, lora, salt)
    if kind == "removed":
        return BlockRemoved(tuple(event[1]))
    if kind == "cleared":
        return AllBlocksCleared()
    raise ValueError(f"unknown KV event {kind!r}")
