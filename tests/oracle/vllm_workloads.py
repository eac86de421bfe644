"""Seeded random workloads that exercise every APC rule (used by the differential tests).

Each workload mixes: a few shared system prompts; multi-turn sessions whose next prompt is
the previous prompt + its (logged) reply + a new user turn; exact repeats; block-aligned
and sub-block prompts; cache salts and LoRA adapters (per session, so sessions still share
within their namespace); prompt-logprob requests; outputs known token by token or only by
length.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvsim.io.trace.columns import Trace


@dataclass
class Mix:
    """Knobs of a random workload."""

    n: int = 1000
    block_size: int = 16
    vocab: int = 3000
    system_prompts: int = 4
    system_len: tuple[int, int] = (20, 200)
    user_len: tuple[int, int] = (1, 120)
    output_len: tuple[int, int] = (1, 40)
    p_session: float = 0.45        # continue an open session
    p_repeat: float = 0.08         # repeat an earlier prompt exactly
    p_aligned: float = 0.15        # trim the prompt to a multiple of the block size
    p_short: float = 0.07          # a prompt shorter than one block
    p_salt: float = 0.2
    salts: int = 3
    p_lora: float = 0.2
    loras: int = 2
    p_plp: float = 0.06
    p_logged: float = 0.7          # output token ids known (sessions always log theirs)


def random_trace(seed: int, mix: Mix | None = None) -> Trace:
    """A reproducible trace drawn from ``mix``."""
    m = mix or Mix()
    rng = np.random.default_rng(seed)
    B = m.block_size

    def tokens(k: int) -> list[int]:
        return rng.integers(0, m.vocab, k).tolist()

    systems = [tokens(int(rng.integers(*m.system_len))) for _ in range(m.system_prompts)]
    sessions: list[dict] = []
    prompts, outputs, out_lens, salts, loras, plps = [], [], [], [], [], []
    for _ in range(m.n):
        salt = f"tenant-{rng.integers(m.salts)}" if rng.random() < m.p_salt else None
        lora = f"adapter-{rng.integers(m.loras)}" if rng.random() < m.p_lora else None
        session = None
        r = rng.random()
        if r < m.p_session and sessions:
            session = sessions[int(rng.integers(len(sessions)))]
            prompt = session["history"] + tokens(int(rng.integers(*m.user_len)))
            salt, lora = session["salt"], session["lora"]
        elif r < m.p_session + m.p_repeat and prompts:
            k = int(rng.integers(len(prompts)))
            prompt, salt, lora = list(prompts[k]), salts[k], loras[k]
        elif rng.random() < m.p_short:
            base = systems[int(rng.integers(len(systems)))] if rng.random() < 0.5 else tokens(B)
            prompt = base[: int(rng.integers(1, B))] if B > 1 else base[:1]
        else:
            prompt = systems[int(rng.integers(len(systems)))] + tokens(int(rng.integers(*m.user_len)))
            if rng.random() < 0.3:
                session = {"salt": salt, "lora": lora}
                sessions.append(session)
                if len(sessions) > 12:
                    sessions.pop(0)
        if rng.random() < m.p_aligned and len(prompt) >= B:
            prompt = prompt[: len(prompt) // B * B]
        n_out = int(rng.integers(*m.output_len))
        logged = session is not None or rng.random() < m.p_logged
        out = tokens(n_out) if logged else None
        if session is not None:
            session["history"] = prompt + out
        prompts.append(prompt)
        outputs.append(out)
        out_lens.append(n_out)
        salts.append(salt)
        loras.append(lora)
        plps.append(bool(rng.random() < m.p_plp))
    return Trace.from_prompts(prompts, output_lengths=out_lens, outputs=outputs, cache_salts=salts,
                              loras=loras, prompt_logprobs=plps)
