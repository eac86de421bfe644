"""What a step-clock replay reports per request."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class StepResult:
    """Per-request outcome of a step replay; -1 marks "never happened" (e.g. rejected).

    ``cached_tokens`` is what the engine reports for the request: vLLM's
    ``num_cached_tokens`` (its first prefill's prefix-cache hit), SGLang's
    ``cached_tokens``. ``first_token_step`` is the step whose output holds the first
    output token, ``finish_step`` the step whose output finishes the request.
    """

    engine: str
    cached_tokens: np.ndarray
    first_token_step: np.ndarray
    finish_step: np.ndarray
    preemptions: np.ndarray
    rejected: np.ndarray
    output_tokens: np.ndarray | None = None         # tokens each request generated
    steps: int = 0                                  # scheduler steps taken (the clock at the end)
    finished: list = field(default_factory=list)    # request indices in the order they finished
    extra: dict = field(default_factory=dict)

    @classmethod
    def empty(cls, engine: str, n: int) -> StepResult:
        return cls(engine, np.full(n, -1, np.int64), np.full(n, -1, np.int64), np.full(n, -1, np.int64),
                   np.zeros(n, np.int64), np.zeros(n, bool), np.zeros(n, np.int64))
