"""(f) Mixture: several scenarios served by one deployment, arriving in bursts.

Each component is generated at its share of the mean rate, then its times are warped
through a bursty rate envelope (quiet periods and bursts at ``--burstiness`` times the
quiet rate), so the merged stream is Poisson with a rate that varies over time. A
conversation's later turns keep their original spacing after its first turn.
"""
from __future__ import annotations

from dataclasses import replace

from kvsim.errors import ConfigError
from kvsim.workloads.arrivals import BurstEnvelope
from kvsim.workloads.record import ChatRequest, round_time
from kvsim.workloads.registry import DEFAULT_MIX, Params, get_scenario, resolve
from kvsim.workloads.rng import Rng

# Options passed through to the components that take them.
_PASS_THROUGH = ("turns", "tenants", "adapters", "system_tokens", "doc_tokens", "popular_last")


def parse_mix(spec: str) -> dict[str, float]:
    """``"code_review=0.3,rag=0.7"`` -> weights by scenario (need not sum to 1)."""
    weights: dict[str, float] = {}
    for part in (s.strip() for s in spec.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep:
            raise ConfigError(f"--mix: expected scenario=weight, got {part!r}")
        if name == "mixture":
            raise ConfigError("--mix: a mixture cannot contain itself")
        get_scenario(name)
        try:
            weight = float(value)
        except ValueError:
            raise ConfigError(f"--mix: weight of {name} is not a number: {value!r}") from None
        if weight < 0:
            raise ConfigError(f"--mix: weight of {name} is negative")
        weights[name] = weights.get(name, 0.0) + weight
    if sum(weights.values()) <= 0:
        raise ConfigError("--mix: no scenario with a positive weight")
    return {k: w for k, w in weights.items() if w > 0}


def split_counts(total: int, weights: dict[str, float]) -> dict[str, int]:
    """``total`` split by weight (largest remainder, ties in mix order)."""
    norm = sum(weights.values())
    exact = {k: total * w / norm for k, w in weights.items()}
    counts = {k: int(v) for k, v in exact.items()}
    by_remainder = sorted(weights, key=lambda k: -(exact[k] - counts[k]))
    for k in by_remainder[: total - sum(counts.values())]:
        counts[k] += 1
    return counts


def _component_params(name: str, p: Params, count: int, share: float) -> dict:
    scenario = get_scenario(name)
    opts: dict = {"rate": p.rate * share, "model": p.model}
    if "requests" in scenario.defaults:
        opts["requests"] = count
    for key in _PASS_THROUGH:
        value = getattr(p, key)
        if key in scenario.defaults and value is not None and (key != "popular_last" or value):
            opts[key] = value
    return opts


def build(p: Params, rng: Rng) -> list[ChatRequest]:
    assert p.requests is not None and p.rate is not None and p.burstiness is not None
    weights = parse_mix(p.mix or DEFAULT_MIX)
    counts = split_counts(p.requests, weights)
    norm = sum(weights.values())
    merged: list[tuple[float, int, int, ChatRequest]] = []
    envelope = BurstEnvelope.make(rng.fork("envelope"), p.rate, 2.0 * p.requests / p.rate,
                                  burstiness=p.burstiness)
    for order, (name, count) in enumerate(counts.items()):
        if count == 0:
            continue
        cp = resolve(name, seed=p.seed, **_component_params(name, p, count, weights[name] / norm))
        if "requests" not in get_scenario(name).defaults:  # conversations: cap by requests
            cp = replace(cp, max_requests=count)
        requests = get_scenario(name).build(cp, rng.fork(name))
        first_seen: dict[str, tuple[float, float]] = {}
        for i, r in enumerate(requests):
            if r.session_id is None:
                new_t = envelope.warp(r.timestamp)
            elif r.session_id not in first_seen:
                new_t = envelope.warp(r.timestamp)
                first_seen[r.session_id] = (r.timestamp, new_t)
            else:  # a later turn keeps its distance from the conversation's first turn
                old_first, new_first = first_seen[r.session_id]
                new_t = new_first + (r.timestamp - old_first)
            merged.append((round_time(new_t), order, i, r.with_(timestamp=round_time(new_t))))
    merged.sort(key=lambda item: item[:3])
    return [item[3] for item in merged]
