"""SGLang's KV events, as a replica publishes them to a router (``BlockStored`` / ``BlockRemoved``).

SGLang 0.5 (``mem_cache/radix_cache.py``, ``enable_kv_cache_events``) publishes a
``BlockStored`` for every page of a node the tree creates on insert, chained by parent
hash (the first page's parent: the last page of the parent node), and a ``BlockRemoved``
for every page of a leaf it evicts; a split creates no event (the pages stay). kvsim
records the same on its tree (:class:`~kvsim.engines.sglang.tree.RadixTree` or the fast
:class:`~kvsim.engines.sglang.tree.LazyHeapTree`) through a mixin: the node that ``insert``
creates, the pages a split moves to the new upper node, the leaf ``evict`` removes.

One difference, on purpose: SGLang names a page ``hash(tuple(page_tokens))``, so two equal
pages at different places share a name; kvsim gives every stored page its own number, so
a ``BlockRemoved`` names exactly the page that left (routers key pages by their own
content hash of the tokens under the parent, so what they hold is the same).

- :func:`record` turns recording on for a radix cache (or the sequential cache or stepped
  engine holding one) and returns ``drain()``, which hands back the events since the last
  call as plain tuples ``("stored", hashes, parent, token_ids, page_size, lora, cache_salt)``
  and ``("removed", hashes)``;
- :func:`sequential` is the fast sequential cache with events;
- :func:`scheduler_settings` are the scheduler settings unchanged (its tree records).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from kvsim.engines.base import EventReplica
from kvsim.engines.sglang.request import RadixCache
from kvsim.engines.sglang.tree import Node


class _TreeEvents:
    """A tree mixin recording the pages it stores and removes."""

    page_keys: dict[int, list[int]]
    kv_events: list[tuple]
    next_key: int

    def insert(self, tokens, value=None, ns=None, priority: int = 0, inserted_len: int = 0,
               length: int | None = None):
        off, node = super().insert(tokens, value, ns, priority, inserted_len, length)   # type: ignore[misc]
        k_len = len(tokens) if length is None else length
        if off < k_len:          # insert created ``node``, a new leaf
            self._stored(node)
        return off, node

    def _stored(self, leaf: Node) -> None:
        p = self.page_size
        n = len(leaf.key) // p
        keys = list(range(self.next_key, self.next_key + n))
        self.next_key += n
        self.page_keys[leaf.id] = keys
        parent = leaf.parent
        parent_key = None if parent is self.root else self.page_keys[parent.id][-1]
        lora, salt = leaf.ns if leaf.ns is not None else (None, None)
        self.kv_events.append(("stored", tuple(keys), parent_key, np.array(leaf.key, np.int64), p, lora, salt))

    def _split(self, child: Node, m: int) -> Node:
        new = super()._split(child, m)                    # type: ignore[misc]
        keys = self.page_keys.get(child.id)
        if keys is not None:          # the upper node takes the pages of the first m tokens
            cut = m // self.page_size
            self.page_keys[new.id], self.page_keys[child.id] = keys[:cut], keys[cut:]
        return new

    def _remove_leaf(self, x: Node):
        keys = self.page_keys.pop(x.id, None)
        if keys:
            self.kv_events.append(("removed", tuple(keys)))
        return super()._remove_leaf(x)                    # type: ignore[misc]


_CLASSES: dict[type, type] = {}


def _cache_of(obj: Any) -> RadixCache:
    for cache in (obj, getattr(obj, "cache", None)):
        if isinstance(cache, RadixCache):
            return cache
    raise TypeError(f"{type(obj).__name__} holds no SGLang radix cache: it records no KV events")


def record(obj: Any) -> Callable[[], list[tuple]]:
    """Record the KV events of ``obj``'s radix tree from now on (its tree must still be empty);
    returns ``drain()``."""
    cache = _cache_of(obj)
    tree = cache.tree
    if not isinstance(tree, _TreeEvents):
        if tree.root.children:
            raise ValueError("KV events are recorded from an empty tree")
        cls = type(tree)
        if cls not in _CLASSES:
            _CLASSES[cls] = type(f"{cls.__name__}WithEvents", (_TreeEvents, cls), {})
        tree.__class__ = _CLASSES[cls]
        tree.page_keys, tree.kv_events, tree.next_key = {}, [], 1
    events = tree.kv_events

    def drain() -> list[tuple]:
        out = list(events)
        events.clear()
        return out
    return drain


class _EventSequential(EventReplica):
    """One replica of a sequential fleet: the fast sequential cache with its tree recording."""

    def __init__(self, model_class: type, settings) -> None:
        cache = model_class(settings)
        super().__init__(cache, settings, record(cache.cache))


def sequential(spec, settings) -> _EventSequential:
    """A sequential cache of ``spec``'s fast model (``settings``: its radix settings) with events."""
    return _EventSequential(spec.implementation("fast"), settings)


def scheduler_settings(settings):
    """The scheduler's readable tree records events as it is: the settings unchanged."""
    return settings

