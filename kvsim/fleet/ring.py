"""A consistent-hash ring over replicas, as session and prefix-hash routers keep one.

The real rings place worker URLs (production-stack: uhashring; smg: its own ring with
virtual nodes); kvsim has no URLs, so replica ``k`` is placed as ``"replica-k"``. Which
replica a key lands on therefore differs from a real deployment's; what is kept is the
shape: a key always lands on the same replica, keys spread evenly, and a walk goes round
the ring (``docs/engines/routers.md §2.6``).
"""
from __future__ import annotations

import bisect
import hashlib


def stable_hash(data: bytes) -> int:
    """A 64-bit hash that is the same in every process (unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class HashRing:
    """``vnodes`` points per replica on a 64-bit ring; a key belongs to the next point clockwise."""

    def __init__(self, num_replicas: int, vnodes: int = 160) -> None:
        points = sorted((stable_hash(f"replica-{k}#{v}".encode()), k)
                        for k in range(num_replicas) for v in range(vnodes))
        self._keys = [p for p, _ in points]
        self._owners = [k for _, k in points]
        self.num_replicas = num_replicas

    def walk(self, key: bytes) -> list[int]:
        """The distinct replicas in ring order from ``key``'s point: the owner first."""
        start = bisect.bisect(self._keys, stable_hash(key)) % len(self._keys)
        seen: list[int] = []
        for i in range(len(self._keys)):
            k = self._owners[(start + i) % len(self._keys)]
            if k not in seen:
                seen.append(k)
                if len(seen) == self.num_replicas:
                    break
        return seen

    def lookup(self, key: bytes) -> int:
        """The replica owning ``key``."""
        return self.walk(key)[0]
