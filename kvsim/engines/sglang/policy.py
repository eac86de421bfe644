"""SGLang 0.5.23's waiting-queue order: ``SchedulePolicy.calc_priority``.

Section numbers (§) refer to ``docs/engines/sglang-scheduler.md``.

Re-states ``sglang/srt/managers/schedule_policy.py`` for the default tree (whose
``supports_fast_match_prefix`` is false): the queue is a list sorted in place, every sort
stable with respect to its current order.

- ``fcfs``: no sort, no match.
- ``lpm``: match every waiting request's full sequence (stamping and splitting the real
  tree), sort by longest match; requests whose match is short but share a prefix with an
  earlier waiting request are deprioritized (in-batch prefix caching, §3.2). Above 128
  waiting requests it behaves as ``fcfs`` for the round.
- ``dfs-weight``: the same matches, then a depth-first walk of the tree visiting heavier
  subtrees first and emitting a node's requests after its children (§3.3).
- ``lof``: longest ``max_new_tokens`` first. ``random``: ``random.shuffle``.

Cache-agnostic rounds (fcfs, lof, random, lpm above 128) refresh the recency of the
first 128 waiting prompts every 32nd round, head last, when the eviction policy is LRU
(§3.4).
"""
from __future__ import annotations

import random

from kvsim.engines.sglang.tree import RadixTree
from kvsim.errors import ConfigError

POLICIES = ("fcfs", "lpm", "dfs-weight", "lof", "random")
CACHE_AWARE = ("lpm", "dfs-weight")
WAITING_QUEUE_PREFIX_MATCH_MAX = 128
WAITING_PREFIX_REFRESH_INTERVAL = 32
IN_BATCH_CHECK_THRESHOLD = 32          # IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD
IN_BATCH_DEPRIORITIZE_THRESHOLD = 32   # IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD


class SchedulePolicy:
    """Orders the waiting queue before each prefill round."""

    def __init__(self, policy: str, cache, seed: int = 0) -> None:
        if policy not in POLICIES:
            raise ConfigError(f"unknown --schedule-policy {policy!r}; choose from {', '.join(POLICIES)}")
        self.policy = policy
        self.cache = cache
        self.refresh_calls = 0
        self.rng = random.Random(seed)   # the server seeds Python's RNG with --random-seed

    def active_policy(self, queue: list) -> str:
        if self.policy == "lpm" and len(queue) > WAITING_QUEUE_PREFIX_MATCH_MAX:
            return "fcfs"       # matching that many is too slow: first come, first served
        return self.policy

    def calc_priority(self, queue: list) -> None:
        policy = self.active_policy(queue)
        if policy in CACHE_AWARE:
            deprioritized = self._compute_prefix_matches(queue)
            if policy == "lpm":
                queue.sort(key=lambda r: float("inf") if r in deprioritized else -r.num_matched_prefix_tokens)
            else:
                queue[:] = self._dfs_weight_order(queue)
            return
        if policy == "lof":
            queue.sort(key=lambda r: -r.max_new)
        elif policy == "random":
            self.rng.shuffle(queue)
        self._touch_waiting_prefixes(queue)

    def _touch_waiting_prefixes(self, queue: list) -> None:
        """Keep waiting prompts recent in LRU so they are not evicted before they run (§3.4)."""
        if not queue or self.cache.eviction_policy != "lru":
            return
        refresh = self.refresh_calls % WAITING_PREFIX_REFRESH_INTERVAL == 0
        self.refresh_calls += 1
        if refresh:
            for r in reversed(queue[:WAITING_QUEUE_PREFIX_MATCH_MAX]):
                self.cache.touch(r.kv, r.seq_len)

    def _compute_prefix_matches(self, queue: list) -> set:
        """Full-sequence matches against the tree; in-batch duplicates found on a scratch tree."""
        scratch = RadixTree(1, "lru", "classic")
        deprioritized = set()
        for r in queue:
            self.cache.match(r.kv, r.seq_len)
            # the full match, reported up to what the request may use (a logprob start caps it)
            r.num_matched_prefix_tokens = min(r.kv.prefix_len, r.max_prefix_len())
            if r.kv.prefix_len <= IN_BATCH_CHECK_THRESHOLD:
                tokens = r.kv.fill(r.seq_len)
                shared, _ = scratch.match_prefix(tokens, r.kv.ns)
                if shared >= IN_BATCH_DEPRIORITIZE_THRESHOLD:
                    deprioritized.add(r)
                else:
                    scratch.insert(tokens, tokens, r.kv.ns)
        return deprioritized

    def _dfs_weight_order(self, queue: list) -> list:
        """Post-order walk, heavier subtrees first; ties keep the children's order (§3.3)."""
        by_node: dict = {}
        for r in queue:
            by_node.setdefault(r.kv.last_node, []).append(r)
        weight = {node: len(rs) for node, rs in by_node.items()}
        root = self.cache.tree.root
        stack = [(root, False)]
        while stack:                  # subtree weights, children before parents
            node, visited = stack.pop()
            if visited:
                weight[node] = weight.get(node, 0) + sum(weight.get(c, 0) for c in node.children.values())
            else:
                stack.append((node, True))
                stack.extend((c, False) for c in node.children.values())
        order: list = []
        stack = [(root, False)]
        while stack:
            node, visited = stack.pop()
            if visited:
                order.extend(by_node.get(node, ()))
                continue
            children = sorted(node.children.values(), key=lambda c: -weight.get(c, 0))
            stack.append((node, True))
            stack.extend((c, False) for c in reversed(children))
        return order
