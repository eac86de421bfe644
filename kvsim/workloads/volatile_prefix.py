"""(g) Volatile prefix: the code-review workload, but the app writes "Today is <time>.
Request ID: <id>." at the very start of the system prompt, so no two requests share more
than the chat template's header — the mistake the analyzer must point out."""
from __future__ import annotations

from kvsim.workloads import code_review
from kvsim.workloads.params import Params
from kvsim.workloads.record import ChatRequest
from kvsim.workloads.registry import Scenario
from kvsim.workloads.rng import Rng


def build(p: Params, rng: Rng) -> list[ChatRequest]:
    return code_review.build(p, rng, volatile=True, prefix="vol")


SCENARIO = Scenario(
    name="volatile_prefix",
    summary="code_review with a timestamp + request id opening the prompt",
    build=build,
    defaults={"requests": 200, "rate": 2.0, "system_tokens": 3000},
)
