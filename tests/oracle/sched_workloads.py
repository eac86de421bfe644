"""Seeded concurrent workloads for the scheduler differential tests.

Requests share a few system prompts, continue multi-turn sessions (the next prompt is
the previous prompt + its reply + a new turn), repeat earlier prompts, and arrive on a
step clock in bursts (many requests at the same step) separated by gaps, so the engines
batch, chunk, queue, preempt and retract.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SchedMix:
    """Knobs of a random concurrent workload."""

    n: int = 300
    vocab: int = 200
    system_prompts: int = 3
    system_len: tuple[int, int] = (16, 120)
    user_len: tuple[int, int] = (1, 80)
    output_len: tuple[int, int] = (1, 30)
    p_session: float = 0.35
    p_repeat: float = 0.08
    burst: tuple[int, int] = (1, 8)        # requests per arrival step
    gap: float = 3.0                       # mean steps between bursts
    priorities: int = 1                    # distinct priority values (vLLM priority policy)
    p_synth: float = 0.0                   # reply unknown: distinct negative ids, as kvsim synthesizes
    p_namespace: float = 0.0               # a new conversation gets a LoRA adapter and/or a cache salt
    p_logprob: float = 0.0                 # asks for prompt logprobs (vLLM) / from a random start (SGLang)


@dataclass
class SchedWorkload:
    prompts: list[np.ndarray] = field(default_factory=list)
    outputs: list[np.ndarray] = field(default_factory=list)
    arrival: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    priority: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    loras: list = field(default_factory=list)
    salts: list = field(default_factory=list)
    prompt_logprobs: np.ndarray | None = None   # bool (n,): vLLM skips reading the cache
    logprob_starts: np.ndarray | None = None    # int (n,): SGLang logprob_start_len, -1 none

    @property
    def n(self) -> int:
        return len(self.prompts)

    def peak_tokens(self) -> np.ndarray:
        """Prompt + output - 1: the KV a request holds at its last step."""
        return np.array([len(p) + max(len(o), 1) - 1 for p, o in zip(self.prompts, self.outputs)])


def random_workload(seed: int, mix: SchedMix | None = None) -> SchedWorkload:
    """A reproducible workload drawn from ``mix``."""
    m = mix or SchedMix()
    rng = np.random.default_rng(seed)
    tokens = lambda k: rng.integers(0, m.vocab, k).astype(np.int64)  # noqa: E731
    systems = [tokens(int(rng.integers(*m.system_len))) for _ in range(m.system_prompts)]
    sessions: list[np.ndarray] = []
    session_ns: list[tuple] = []
    synth = 0
    w = SchedWorkload()
    for _ in range(m.n):
        r = rng.random()
        if r < m.p_session and sessions:
            k = int(rng.integers(len(sessions)))
            prompt = np.concatenate([sessions[k], tokens(int(rng.integers(*m.user_len)))])
            ns = session_ns[k]
        elif r < m.p_session + m.p_repeat and w.prompts:
            j = int(rng.integers(len(w.prompts)))
            prompt, ns, k = w.prompts[j].copy(), (w.loras[j], w.salts[j]), None
        else:
            prompt = np.concatenate([systems[int(rng.integers(len(systems)))],
                                     tokens(int(rng.integers(*m.user_len)))])
            ns = (None, None)
            if m.p_namespace and rng.random() < m.p_namespace:
                ns = (f"adapter-{rng.integers(2)}" if rng.random() < 0.5 else None,
                      f"tenant-{rng.integers(2)}" if rng.random() < 0.5 else None)
            k = len(sessions)
            sessions.append(prompt)
            session_ns.append(ns)
            if len(sessions) > 10:
                sessions.pop(0)
                session_ns.pop(0)
                k -= 1
        out = tokens(int(rng.integers(*m.output_len)))
        if k is not None:
            sessions[k] = np.concatenate([prompt, out])
        if rng.random() < m.p_synth:
            out = -1 - np.arange(synth, synth + len(out), dtype=np.int64)
            synth += len(out)
        w.prompts.append(prompt)
        w.outputs.append(out)
        w.loras.append(ns[0])
        w.salts.append(ns[1])
    arrival, step = [], 0
    while len(arrival) < m.n:
        arrival.extend([step] * int(rng.integers(m.burst[0], m.burst[1] + 1)))
        step += 1 + int(rng.exponential(m.gap))
    w.arrival = np.asarray(arrival[: m.n], np.int64)
    w.priority = rng.integers(0, max(m.priorities, 1), m.n).astype(np.int64)
    if m.p_logprob:      # drawn last: the rest of a seed's workload stays as it was
        asks = rng.random(m.n) < m.p_logprob
        starts = np.array([rng.integers(0, len(p) + 1) for p in w.prompts], np.int64)
        w.prompt_logprobs, w.logprob_starts = asks, np.where(asks, starts, -1)
    return w


STOP_TOKEN = 1_000_003   # the drivers' stop token id (finish "stop")


def with_stop_token(w: SchedWorkload) -> SchedWorkload:
    """Each reply ends with the stop token (SGLang finish "stop": no ignore_eos)."""
    outputs = [np.concatenate([o[:-1], [STOP_TOKEN]]).astype(np.int64) for o in w.outputs]
    return SchedWorkload(w.prompts, outputs, w.arrival, w.priority, w.loras, w.salts, w.prompt_logprobs,
                         w.logprob_starts)
