"""Pieces every benchmark shares: a synthetic multi-turn workload and one-CPU pinning."""
from __future__ import annotations

import os

import numpy as np

from kvsim.io.trace.columns import Trace


def synthetic_chat(seed: int = 0, sessions: int = 1000) -> Trace:
    """Multi-turn chats: 8 shared system prompts, 1-12 turns, replies resent in later turns."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, 100_000, int(rng.integers(300, 2500))) for _ in range(8)]
    turns_left = rng.integers(1, 13, sessions)
    history = [systems[int(rng.integers(8))] for _ in range(sessions)]
    open_ = list(range(sessions))
    prompts, outputs = [], []
    while open_:
        k = int(rng.integers(len(open_)))  # interleave sessions at random
        s = open_[k]
        prompt = np.concatenate([history[s], rng.integers(0, 100_000, int(rng.integers(10, 400)))])
        reply = rng.integers(0, 100_000, int(rng.integers(20, 500)))
        prompts.append(prompt)
        outputs.append(reply)
        history[s] = np.concatenate([prompt, reply])
        turns_left[s] -= 1
        if turns_left[s] == 0:
            open_[k] = open_[-1]
            open_.pop()
    return Trace.from_prompts(prompts, outputs=outputs)


def pin_to_one_cpu() -> int | None:
    """Run this process (and the engine subprocesses it starts) on one CPU; None if unsupported."""
    try:
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        return cpu
    except (AttributeError, OSError):
        return None
