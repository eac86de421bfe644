"""vLLM production-stack's ``prefixaware`` router (``docs/engines/routers.md §5``).

``src/vllm_router/prefix/hashtrie.py`` at a6c01db0: the request text in 128-character
chunks (the last one shorter), each chunk a trie edge; every node keeps the set of
endpoints ever routed through it, and the trie never evicts. Routing walks the chunks
while some endpoint of the node is still in the running set, then picks at random among
that set (all endpoints when nothing matched); the request is inserted for its endpoint.
kvsim's logs hold tokens: one token stands for one character.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvsim.fleet.base import InFlightRouter, ReplicaLoad, RouteRequest, lowest
from kvsim.fleet.options import check


@dataclass(frozen=True)
class PrefixAwareSettings:
    """production-stack defaults (``docs/engines/routers.md §5``)."""

    chunk_size: int = 128
    prefix_min_match_length: int = 0

    def __post_init__(self) -> None:
        check(self.chunk_size >= 1, "chunk_size must be at least 1")
        check(self.prefix_min_match_length >= 0, "prefix_min_match_length must be non-negative")


class _Node:
    __slots__ = ("children", "endpoints")

    def __init__(self) -> None:
        self.children: dict[bytes, _Node] = {}
        self.endpoints: set[int] = set()


class PrefixAware(InFlightRouter):
    """The chunk trie; the fallback below ``prefix_min_match_length`` takes the least busy endpoint."""

    name = "prefixaware"
    Settings = PrefixAwareSettings

    def _setup(self) -> None:
        super()._setup()
        self.root = _Node()

    def _chunks(self, req: RouteRequest) -> list[bytes]:
        raw = req.tokens.astype("<i8").tobytes()
        step = 8 * self.settings.chunk_size
        return [raw[i:i + step] for i in range(0, len(raw), step)]

    def match(self, req: RouteRequest) -> tuple[int, frozenset[int]]:
        """(matched characters, the endpoints at the deepest matched chunk)."""
        node, length = self.root, 0
        selected = frozenset(range(self.num_replicas))
        for chunk in self._chunks(req):
            child = node.children.get(chunk)
            if child is None:
                break
            both = selected & child.endpoints
            if not both:
                break
            node, selected = child, frozenset(both)
            length += self.settings.chunk_size
        return length, selected

    def candidates(self, req: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> frozenset[int]:
        length, selected = self.match(req)
        if length < self.settings.prefix_min_match_length:     # 0 < 0 never: off by default
            return frozenset({min(lowest(self.in_flight))})
        return selected

    def _dispatched(self, req: RouteRequest, replica: int, now: float) -> None:
        node = self.root
        node.endpoints.add(replica)
        for chunk in self._chunks(req):
            node = node.children.setdefault(chunk, _Node())
            node.endpoints.add(replica)
