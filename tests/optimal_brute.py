"""Brute force for the offline optimum: every feasible cache content, after every request.

Written from the model's definition (``docs/optimal.md``), independently of the trie and
the interval packing: a unit is identified by its namespace and its whole token prefix;
between requests the cache holds any set of at most K units; a request hits the longest
run of its readable units, in order, that are all cached; then the cache keeps any subset
of what it had and what the request wrote, subject to the capacity rules:

- resident (the engines): the units kept through request r that r does not write, plus
  r's own footprint ``demand[r]``, fit in K;
- storage (kvcache-lab): at most K units, the request needs no room.

Nothing here assumes the cache is prefix-closed, so the brute force also checks that the
prefix-closure argument of the proof loses nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations

import numpy as np

from kvsim.io.trace.columns import Trace


@dataclass(frozen=True)
class Req:
    admitted: bool
    writes: frozenset          # unit keys the request leaves behind
    readable: tuple            # (key, weight) of its readable units, in chain order
    demand: int                # units it holds while it runs (resident model)
    measured: bool


def _ns(trace: Trace, i: int):
    return (trace.name_of("lora", int(trace.lora[i])), trace.name_of("cache_salt", int(trace.cache_salt[i])))


def _output(trace: Trace, i: int, serial: list) -> list:
    """The output tokens an engine writes: logged ids, else fresh ids that match nothing."""
    k = max(int(trace.output_lengths[i]), 1)
    o = trace.output(i)
    known = [] if o is None else [int(x) for x in o][:k]
    while len(known) < k:
        serial[0] -= 1
        known.append(("fresh", serial[0]))
    return known


def apc_requests(trace: Trace, B: int, K: int, measured: np.ndarray) -> list[Req]:
    """vLLM APC's rules (sequential): full blocks of prompt+output, cap floor((L-1)/B)."""
    serial = [0]
    out = []
    for i in range(len(trace)):
        p = [int(x) for x in trace.prompt(i)]
        seq = p + _output(trace, i, serial)
        L, M = len(p), len(seq) - len(p)
        ns = _ns(trace, i)
        kept = (L + M - 1) // B
        keys = [(ns, tuple(seq[: (j + 1) * B])) for j in range(kept)]
        cap = 0 if trace.prompt_logprobs[i] or L == 0 else (L - 1) // B
        peak = -(-(L + M - 1) // B)
        out.append(Req(L > 0 and peak <= K, frozenset(keys), tuple((k, B) for k in keys[:cap]), peak,
                       bool(measured[i])))
    return out


def radix_requests(trace: Trace, p: int, K: int, measured: np.ndarray) -> list[Req]:
    """SGLang's rules (sequential, finish by length, overlap on): pages, cap floor_p(L-1) (a
    logprob request at most its start), floor_p(L+k-1) written, one spare page at prefill,
    generation clipped to the pool; a logprob start past the prompt runs the prompt [0] with
    one sampled token and is counted nowhere."""
    serial = [0]
    T = K * p
    out = []
    for i in range(len(trace)):
        pr = [int(x) for x in trace.prompt(i)]
        seq = pr + _output(trace, i, serial)
        L, wanted = len(pr), len(seq) - len(pr)
        start = int(trace.logprob_start_len[i])
        ceil_l = -(-L // p) * p
        max_new = max(0, min(wanted, T - ceil_l - p - 1))
        aborted = start > L
        if aborted:
            seq, L, k = [0, seq[L]], 1, 1
            extra = int(k < max_new)
        else:
            k = min(wanted, max(max_new, 1))
            extra = 0
        admitted = L + min(max_new, 4096) + p < T
        committed = L + k - 1 + extra
        keys = [(_ns(trace, i), tuple(seq[: (j + 1) * p])) for j in range(committed // p)]
        cap = 0 if aborted else max(min(L - 1, start) if start >= 0 else L - 1, 0) // p
        demand = max(-(-L // p) + (1 if p > 1 else 0), -(-committed // p))
        out.append(Req(admitted, frozenset(keys), tuple((key, p) for key in keys[:cap]), demand,
                       bool(measured[i]) and not aborted))
    return out


def block_requests(trace: Trace, B: int, measured: np.ndarray, tail: str) -> list[Req]:
    """kvcache-lab's blocks: ceil(L/B) blocks, the partial one weighted by its length (or dropped)."""
    out = []
    for i in range(len(trace)):
        p = [int(x) for x in trace.prompt(i)]
        ns = _ns(trace, i)
        n = len(p) // B if tail == "drop" else -(-len(p) // B)
        units = []
        for j in range(n):
            piece = p[j * B:(j + 1) * B]
            key = (ns, tuple(p[: (j + 1) * B]) + (("end",) if len(piece) < B else ()))
            units.append((key, len(piece)))
        out.append(Req(True, frozenset(k for k, _ in units), tuple(units), 0, bool(measured[i])))
    return out


def brute_force(reqs: list[Req], K: int, resident: bool) -> int:
    """The most measured hit tokens over every feasible cache-content schedule."""
    n = len(reqs)

    @lru_cache(maxsize=None)
    def best(i: int, cache: frozenset) -> int:
        if i == n:
            return 0
        r = reqs[i]
        if not r.admitted:
            return best(i + 1, cache)
        gain = 0
        if r.measured:
            for key, w in r.readable:
                if key not in cache:
                    break
                gain += w
        keep_from = sorted(cache - r.writes, key=repr)    # kept through r without r writing them
        room_through = K - r.demand if resident else K
        written = sorted(r.writes, key=repr)
        top = -math.inf
        for a in range(0, min(len(keep_from), room_through) + 1):
            for kept in combinations(keep_from, a):
                for b in range(0, min(len(written), K - a) + 1):
                    for new in combinations(written, b):
                        top = max(top, best(i + 1, frozenset(kept) | frozenset(new)))
        return gain + int(top)

    return best(0, frozenset())
