"""The warm-up window: the first part of a log fills the cache but is left out of every count.

``--warmup 0.5`` (or ``50%``) leaves out the first half of the requests, as kvcache-lab does;
``--warmup 1000`` the first 1,000. Counts are by request index in log order, rejected
requests included, so every policy and capacity measures the same requests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvsim.errors import ConfigError


@dataclass(frozen=True)
class Warmup:
    """A fraction of the requests (``fraction``) or a number of them (``count``)."""

    fraction: float = 0.0
    count: int | None = None

    def requests(self, n: int) -> int:
        """How many of ``n`` requests only warm the cache."""
        if self.count is not None:
            if self.count >= n and n > 0:
                raise ConfigError(f"--warmup {self.count} leaves none of the {n} requests to measure")
            return min(self.count, n)
        return int(math.floor(n * self.fraction))

    @property
    def active(self) -> bool:
        return bool(self.count) or self.fraction > 0

    def describe(self, n: int) -> str:
        """'the first 6,015 of 12,031 requests (50%) only warm the cache'."""
        k = self.requests(n)
        share = f" ({k / n:.0%})" if n else ""
        return f"the first {k:,} of {n:,} requests{share} only warm the cache and are left out of every count"

    def as_dict(self, n: int) -> dict:
        return {"fraction": self.fraction if self.count is None else None, "count": self.count,
                "warmup_requests": self.requests(n)}


NONE = Warmup()


def parse_warmup(value: "str | float | int | Warmup | None") -> Warmup:
    """'0.5', '50%' (fractions in [0, 1)) or '1000' (a request count) -> :class:`Warmup`."""
    if value is None:
        return NONE
    if isinstance(value, Warmup):
        return value
    text = str(value).strip()
    where = f"--warmup: {text!r} is not a fraction in [0, 1) (0.5, 50%) or a number of requests (1000)"
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            raise ConfigError(where) from None
        if not 0 <= pct < 100:
            raise ConfigError(where)
        return Warmup(fraction=pct / 100)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(where)
        return Warmup(count=int(value)) if value >= 1 else NONE
    try:
        x = float(text)
    except ValueError:
        raise ConfigError(where) from None
    if math.isnan(x) or x < 0:
        raise ConfigError(where)
    if x < 1:
        return Warmup(fraction=x)
    if not x.is_integer() or "." in text or "e" in text.lower():
        raise ConfigError(where)
    return Warmup(count=int(x))


def measured_mask(n: int, warmup: "str | float | int | Warmup | None" = None) -> np.ndarray:
    """bool (n,): the requests whose hits count (all after the warm-up window)."""
    mask = np.ones(n, bool)
    mask[: parse_warmup(warmup).requests(n)] = False
    return mask


def apply_warmup(runs: dict, n: int, warmup: "str | float | int | Warmup | None") -> Warmup:
    """Mark each ReplayResult in ``runs`` so its figures leave the warm-up window out."""
    w = parse_warmup(warmup)
    if w.active:
        mask = measured_mask(n, w)
        for result in runs.values():
            result.measured = mask
    return w


def as_fraction(n: int, warmup: "str | float | int | Warmup | None") -> float:
    """The warm-up as the fraction the one-pass curves take: ``floor(n * f)`` = the same count."""
    w = parse_warmup(warmup)
    if w.count is None:
        return w.fraction
    k = w.requests(n)
    return (k + 0.5) / n if k else 0.0
