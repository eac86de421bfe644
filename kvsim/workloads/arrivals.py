"""Arrival times: Poisson streams and a bursty rate envelope (a two-state
Markov-modulated Poisson process: quiet periods and bursts at several times the rate)."""
from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass

from kvsim.workloads.rng import Rng


def poisson_stream(rng: Rng, n: int, rate: float, start: float = 0.0) -> Iterator[float]:
    """``n`` arrival times of a Poisson process with ``rate`` per second, each drawn only
    when asked for: what the caller draws between two arrivals keeps its place in ``rng``."""
    t = start
    for _ in range(n):
        t += rng.expo(rate)
        yield t


def poisson_times(rng: Rng, n: int, rate: float, start: float = 0.0) -> list[float]:
    """``n`` arrival times of a Poisson process with ``rate`` per second."""
    return list(poisson_stream(rng, n, rate, start))


@dataclass
class BurstEnvelope:
    """A piecewise-constant arrival rate alternating quiet periods and bursts.

    ``starts[k]`` is the start of segment k, ``rates[k]`` its rate (requests/s) and
    ``cum[k]`` the expected number of arrivals before it. :meth:`warp` maps a time of a
    unit-mean-rate process to real time, turning a homogeneous Poisson stream into one
    whose intensity follows the envelope.
    """

    starts: list[float]
    rates: list[float]
    cum: list[float]
    mean_rate: float

    @classmethod
    def make(cls, rng: Rng, mean_rate: float, duration: float, burstiness: float = 5.0,
             mean_quiet_s: float = 60.0, mean_burst_s: float = 15.0) -> BurstEnvelope:
        """Segments covering at least ``duration`` seconds; bursts run at ``burstiness``
        times the quiet rate, and the expected rate over time is ``mean_rate``."""
        burst_share = mean_burst_s / (mean_burst_s + mean_quiet_s)
        quiet_rate = mean_rate / (burst_share * burstiness + (1.0 - burst_share))
        starts, rates, cum = [0.0], [], [0.0]
        in_burst = False
        while starts[-1] < duration or len(rates) < 2:
            length = rng.expo(1.0 / (mean_burst_s if in_burst else mean_quiet_s))
            rate = quiet_rate * (burstiness if in_burst else 1.0)
            rates.append(rate)
            cum.append(cum[-1] + rate * length)
            starts.append(starts[-1] + length)
            in_burst = not in_burst
        return cls(starts=starts, rates=rates, cum=cum, mean_rate=mean_rate)

    def warp(self, t: float) -> float:
        """Real time at which the envelope has accumulated ``t * mean_rate`` arrivals."""
        target = t * self.mean_rate
        k = bisect.bisect_right(self.cum, target) - 1
        if k >= len(self.rates):  # past the last segment: continue at the mean rate
            return self.starts[-1] + (target - self.cum[-1]) / self.mean_rate
        return self.starts[k] + (target - self.cum[k]) / self.rates[k]
