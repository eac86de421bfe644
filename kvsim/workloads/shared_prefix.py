"""SGLang's generated-shared-prefix workload (``bench_serving --dataset-name generated-shared-prefix``).

SGLang's benchmark (``python/sglang/bench_serving.py``, ``sample_generated_shared_prefix_requests``)
draws ``num_groups`` system prompts of ``system_prompt_len`` random tokens and, per group,
``prompts_per_group`` questions of ``question_len`` random tokens; each request is its
group's system prompt followed by one question and asks for ``output_len`` tokens; the
requests are shuffled. Its defaults: 64 groups of 16, 2,048 + 128 tokens, 256 out. The
cache-aware router was measured on it (SGLang v0.4, 8 workers; docs/fleet.md).

Here the tokens are drawn directly as ids (SGLang decodes random ids to text and the
server re-tokenizes it), arrivals are a Poisson stream at ``rate`` requests per second (None:
all at once, SGLang's default ``--request-rate inf``), and each request's ``arrival_step``
is its arrival in steps of ``step_seconds``, for ``kvsim simulate --replay steps``.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

#: SGLang's defaults (bench_serving --gsp-*)
DEFAULTS = {"groups": 64, "prompts_per_group": 16, "system_prompt_len": 2048, "question_len": 128,
            "output_len": 256}
VOCAB = 32_000      # ids drawn from [0, VOCAB)


def generated_shared_prefix(groups: int = 64, prompts_per_group: int = 16, system_prompt_len: int = 2048,
                            question_len: int = 128, output_len: int = 256, rate: float | None = None,
                            step_seconds: float = 0.05, seed: int = 0) -> list[dict]:
    """The requests as token-log rows (``prompt_token_ids``, ``output_length``, ``timestamp``,
    ``arrival_step``, ``request_id``), in arrival order."""
    for name, value in (("groups", groups), ("prompts_per_group", prompts_per_group),
                        ("system_prompt_len", system_prompt_len), ("question_len", question_len),
                        ("output_len", output_len)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1 (got {value})")
    rng = np.random.default_rng(seed)
    systems = rng.integers(0, VOCAB, (groups, system_prompt_len))
    questions = rng.integers(0, VOCAB, (groups * prompts_per_group, question_len))
    pairs = [(g, g * prompts_per_group + k) for g in range(groups) for k in range(prompts_per_group)]
    order = rng.permutation(len(pairs))          # bench_serving shuffles the requests
    n = len(pairs)
    times = np.zeros(n) if rate is None else np.cumsum(rng.exponential(1.0 / rate, n)) - 1.0 / rate
    times = np.maximum(times, 0.0)
    rows = []
    for k, j in enumerate(order):
        g, q = pairs[j]
        rows.append({"request_id": f"gsp-{g}-{q}",
                     "prompt_token_ids": np.concatenate([systems[g], questions[q]]).tolist(),
                     "output_length": int(output_len), "timestamp": round(float(times[k]), 6),
                     "arrival_step": int(times[k] // step_seconds)})
    return rows


def trace(**options):
    """The workload as a :class:`~kvsim.io.trace.columns.Trace` (options as :func:`generated_shared_prefix`)."""
    from kvsim.io.trace.columns import Trace

    rows = generated_shared_prefix(**options)
    return Trace.from_prompts([r["prompt_token_ids"] for r in rows], [r["output_length"] for r in rows],
                              arrival=[r["timestamp"] for r in rows], request_ids=[r["request_id"] for r in rows],
                              arrival_step=[r["arrival_step"] for r in rows])


def write(path: str | Path, **options) -> int:
    """Write the workload as a token log (one JSON line per request); returns the request count."""
    rows = generated_shared_prefix(**options)
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return len(rows)
