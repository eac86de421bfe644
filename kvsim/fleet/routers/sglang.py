"""The SGLang gateway's prefix policies (smg 1.13.0; sglang-router 0.3.2): cache_aware, prefix_hash.

Both count their own in-flight requests per worker (+1 at dispatch, -1 when the response
completes). smg 1.13.0's ``cache_aware`` ranks workers by a different load: the request
count each worker reported at the last load poll (waiting + running, polled every
``load_monitor_interval`` seconds) plus the gateway's dispatches to it since that poll,
never decremented on completion (``docs/engines/routers.md §2.4``, observed on the binary).
``cache_aware`` (``docs/engines/routers.md §2``), for each request:

1. eligible = workers not overloaded (1.13.0: reported waiting >= 8 or KV usage >= 0.8),
   all of them when every worker is (``docs/engines/routers.md §2.4``);
2. 0.3.2: when (max - min in flight) > balance_abs and max > balance_rel * min, the
   least-loaded worker, whatever matches (``docs/engines/routers.md §2.3``);
3. match the tokens in the shared approximate tree: rate = matched / len; above
   ``cache_threshold`` (strictly) a tenant of the matched node (any of them, whatever its
   load: kvsim takes the one that created the node), unless (1.13.0) it spills: its load exceeds the fleet mean by the margin and
   by ``balance_rel`` times the mean;
4. otherwise any least-loaded eligible worker (1.13.0 picks among them at random; 0.3.2
   kept one: kvsim takes the lowest index);
5. insert the tokens for the chosen worker; every ``eviction_interval_secs`` of log time
   the tree is cut back to ``max_tree_size``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvsim.fleet.approx_tree import ApproxTree
from kvsim.fleet.base import InFlightRouter, ReplicaLoad, RouteRequest, lowest
from kvsim.fleet.options import check, choice
from kvsim.fleet.ring import HashRing


@dataclass(frozen=True)
class CacheAwareSettings:
    """``smg launch`` defaults of 1.13.0 (``docs/engines/routers.md §2.5``); ``version=0.3.2`` for the old gate."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_secs: float = 60.0
    max_tree_size: int = 1 << 26
    worker_overload_waiting_requests: int = 8
    worker_overload_token_usage: float = 0.8
    balance_token_usage_threshold: float = 1.0
    overload_token_usage_threshold: float = 1.0
    load_monitor_interval: float = 10.0
    version: str = choice("1.13.0", "0.3.2")

    def __post_init__(self) -> None:
        check(0.0 <= self.cache_threshold <= 1.0, "cache_threshold must be in [0, 1]")
        check(self.balance_rel_threshold >= 1.0, "balance_rel_threshold must be at least 1.0")
        check(self.balance_abs_threshold >= 0, "balance_abs_threshold must be non-negative")
        check(self.eviction_interval_secs >= 0, "eviction_interval_secs must be non-negative")
        check(self.max_tree_size >= 0, "max_tree_size must be non-negative")
        check(self.load_monitor_interval > 0, "load_monitor_interval must be positive")
        check(self.worker_overload_waiting_requests >= 1, "worker_overload_waiting_requests must be at least 1")
        check(0.0 < self.worker_overload_token_usage <= 1.0, "worker_overload_token_usage must be in (0, 1]")


class CacheAware(InFlightRouter):
    """smg's ``cache_aware`` over HTTP, one token standing for one character."""

    name = "cache_aware"
    Settings = CacheAwareSettings
    load_aware = True

    def _setup(self) -> None:
        super()._setup()
        self.tree = ApproxTree(self.num_replicas)
        self.next_eviction: float | None = None
        self.new = self.settings.version == "1.13.0"
        self.everyone = list(range(self.num_replicas))
        self.polled = [0] * self.num_replicas      # request counts reported at the last poll
        self.since = [0] * self.num_replicas       # dispatches since that poll
        self.next_poll: float | None = None

    def _poll_due(self, now: float) -> bool:
        return self.next_poll is None or now >= self.next_poll

    def load(self, loads: Sequence[ReplicaLoad], now: float) -> list[int]:
        """The load cache_aware ranks workers by (docs/engines/routers.md §2.4): 1.13.0 the last
        poll's reported count plus dispatches since; 0.3.2 the gateway's in-flight count."""
        if not self.new:
            return list(self.in_flight)
        if self._poll_due(now):
            return [x.waiting + x.running for x in loads] if loads else [0] * self.num_replicas
        return [p + d for p, d in zip(self.polled, self.since)]

    def _eligible(self, loads: Sequence[ReplicaLoad]) -> list[int]:
        """1.13.0's overload veto (docs/engines/routers.md §2.4 item 2)."""
        if not self.new or not loads:
            return self.everyone
        waiting, usage = self.settings.worker_overload_waiting_requests, self.settings.worker_overload_token_usage
        ok = [w for w, x in enumerate(loads) if x.waiting < waiting and x.kv_usage < usage]
        return ok or self.everyone

    def _usage_triggers(self, loads: Sequence[ReplicaLoad]) -> bool:
        s = self.settings
        if not loads or (s.overload_token_usage_threshold >= 1.0 and s.balance_token_usage_threshold >= 1.0):
            return False
        usage = [x.kv_usage for x in loads]
        return ((s.overload_token_usage_threshold < 1.0 and max(usage) > s.overload_token_usage_threshold)
                or (s.balance_token_usage_threshold < 1.0
                    and max(usage) - min(usage) > s.balance_token_usage_threshold))

    def spills(self, w: int, load: Sequence[int]) -> bool:
        """1.13.0's spill gate on the matched worker (docs/engines/routers.md §2.4 item 1)."""
        s = self.settings
        mean = sum(load) / len(load)
        margin = min(s.balance_abs_threshold, max(4.0, 2.0 * math.sqrt(mean)))
        return load[w] > mean + margin and load[w] > s.balance_rel_threshold * mean

    def _imbalanced_old(self) -> bool:
        """0.3.2's max-min gate (docs/engines/routers.md §2.3)."""
        s, load = self.settings, self.in_flight
        hi, lo = max(load), min(load)
        return hi - lo > s.balance_abs_threshold and hi > lo * s.balance_rel_threshold

    def candidates(self, req: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> frozenset[int]:
        return self._decide(req, loads, now, peek=True)

    def _decide(self, req: RouteRequest, loads: Sequence[ReplicaLoad], now: float, *,
                peek: bool) -> frozenset[int]:
        eligible = self._eligible(loads)
        load = self.load(loads, now)
        if self._usage_triggers(loads) or (not self.new and self._imbalanced_old()):
            return lowest(load, eligible)
        if peek:
            saved = self.tree.epoch
            matched, tenant = self.tree.match(req.tokens)
            self.tree.epoch = saved
        else:
            matched, tenant = self.tree.match(req.tokens)
        n = req.prompt_len
        rate = matched / n if n else 0.0
        if rate <= self.settings.cache_threshold or tenant is None:   # strict ">" (docs/engines/routers.md §2.7, SG2)
            return lowest(load, eligible)
        # any holder of the matched node (not the least loaded one) that does not spill
        ok = [t for t in self.tree.holders(req.tokens)
              if t in eligible and not (self.new and self.spills(t, load))]
        return frozenset(ok) if ok else lowest(load, eligible)

    def choose(self, req: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> int:
        cands = sorted(self._decide(req, loads, now, peek=False))
        if len(cands) == 1:
            return cands[0]
        owner = self.tree.owner(req.tokens)
        if owner in cands:
            return owner
        return self.rng.choice(cands) if self.new else cands[0]

    def dispatch(self, req: RouteRequest, replica: int, now: float,
                 loads: Sequence[ReplicaLoad] = ()) -> None:
        if self.new and self._poll_due(now):        # the load monitor's poll (docs/engines/routers.md §2.4)
            self.polled = [x.waiting + x.running for x in loads] if loads else [0] * self.num_replicas
            self.since = [0] * self.num_replicas
            self.next_poll = now + self.settings.load_monitor_interval
        self.since[replica] += 1
        super().dispatch(req, replica, now, loads)

    def _dispatched(self, req: RouteRequest, replica: int, now: float) -> None:
        s = self.settings
        if s.eviction_interval_secs > 0:
            if self.next_eviction is None:
                self.next_eviction = now + s.eviction_interval_secs
            while now >= self.next_eviction:
                self.tree.evict(s.max_tree_size, shared=self.new)
                self.next_eviction += s.eviction_interval_secs
        self.tree.insert(req.tokens, replica)


@dataclass(frozen=True)
class PrefixHashSettings:
    """smg 1.13.0 ``prefix_hash`` defaults (``docs/engines/routers.md §2.6``)."""

    prefix_token_count: int = 256
    prefix_hash_load_factor: float = 1.25
    prefix_hash_balance_abs_threshold: int = 10

    def __post_init__(self) -> None:
        check(self.prefix_token_count >= 1, "prefix_token_count must be at least 1")
        check(self.prefix_hash_load_factor >= 1.0, "prefix_hash_load_factor must be at least 1.0")


class PrefixHash(InFlightRouter):
    """Consistent hash of the first ``prefix_token_count`` tokens; walk the ring past overloaded workers."""

    name = "prefix_hash"
    Settings = PrefixHashSettings
    load_aware = True

    def _setup(self) -> None:
        super()._setup()
        self.ring = HashRing(self.num_replicas)

    def candidates(self, req: RouteRequest, loads: Sequence[ReplicaLoad], now: float) -> frozenset[int]:
        s, load = self.settings, self.in_flight
        head = req.tokens[:s.prefix_token_count].astype("<i8").tobytes()
        avg = sum(load) / len(load)
        walk = self.ring.walk(repr(req.namespace).encode() + head)
        for w in walk:      # docs/engines/routers.md §2.6: skip a worker over both bounds
            if not (load[w] > avg * s.prefix_hash_load_factor
                    and load[w] - avg > s.prefix_hash_balance_abs_threshold):
                return frozenset({w})
        return frozenset({walk[0]})



