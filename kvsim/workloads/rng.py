"""A seeded random source whose output never depends on the Python version.

Python only promises that ``random.Random(seed).random()`` stays the same across
releases; ``choice``, ``randint``, ``gauss`` and friends may change. So every draw
here is built from ``random()`` alone, and named sub-streams (``fork``) are seeded
from a SHA-256 of their label, so that one part of a workload (say the system
prompt) does not change when another (say the number of requests) does.
"""
from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


class Rng:
    """Deterministic random draws, reproducible from ``key`` on any Python 3."""

    def __init__(self, key: int | str) -> None:
        self.key = str(key)
        digest = hashlib.sha256(self.key.encode()).digest()
        self._random = random.Random(int.from_bytes(digest[:8], "big"))

    def fork(self, label: str) -> Rng:
        """An independent stream named ``label`` (same label, same stream)."""
        return Rng(f"{self.key}/{label}")

    def random(self) -> float:
        """Uniform in [0, 1)."""
        return self._random.random()

    def below(self, n: int) -> int:
        """Uniform integer in [0, n)."""
        if n <= 0:
            raise ValueError("n must be positive")
        return min(int(self.random() * n), n - 1)

    def between(self, lo: int, hi: int) -> int:
        """Uniform integer in [lo, hi] (both ends included)."""
        return lo + self.below(hi - lo + 1)

    def uniform(self, lo: float, hi: float) -> float:
        return lo + (hi - lo) * self.random()

    def chance(self, p: float) -> bool:
        return self.random() < p

    def choice(self, items: Sequence[T]) -> T:
        return items[self.below(len(items))]

    def weighted(self, items: Sequence[T], weights: Sequence[float]) -> T:
        """One of ``items`` with probability proportional to ``weights``."""
        total = float(sum(weights))
        x = self.random() * total
        acc = 0.0
        for item, w in zip(items, weights):
            acc += w
            if x < acc:
                return item
        return items[-1]

    def sample(self, items: Sequence[T], k: int) -> list[T]:
        """``k`` distinct items in random order (partial Fisher-Yates)."""
        pool = list(items)
        k = min(k, len(pool))
        for i in range(k):
            j = i + self.below(len(pool) - i)
            pool[i], pool[j] = pool[j], pool[i]
        return pool[:k]

    def shuffle(self, items: list[T]) -> None:
        for i in range(len(items) - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]

    def expo(self, rate: float) -> float:
        """Exponential with the given rate (mean ``1/rate``)."""
        return -math.log(1.0 - self.random()) / rate

    def normal(self) -> float:
        """Standard normal (Box-Muller)."""
        u1 = 1.0 - self.random()
        u2 = self.random()
        return math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)

    def lognormal_int(self, median: float, sigma: float, lo: int, hi: int) -> int:
        """A log-normal integer with the given median, clipped to [lo, hi]."""
        value = median * math.exp(sigma * self.normal())
        return max(lo, min(hi, round(value)))

    def hex(self, digits: int) -> str:
        return "".join("0123456789abcdef"[self.below(16)] for _ in range(digits))


def zipf_weights(n: int, s: float = 1.0) -> list[float]:
    """Popularity weights 1/rank^s for ranks 1..n (a few items are asked for most)."""
    return [1.0 / (rank ** s) for rank in range(1, n + 1)]
