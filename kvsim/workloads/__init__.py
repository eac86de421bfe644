"""Deterministic synthetic workloads for ``kvsim generate``.

One module per scenario (``code_review``, which also builds ``volatile_prefix``,
``support_chat``, ``rag``, ``multi_tenant``, ``multi_lora``, ``mixture``), a registry of
them with their options, shared text and arrival helpers, and a writer for chat-log
(format 1) and pre-tokenized (format 3) JSONL::

    from kvsim.workloads import generate, write_requests
    requests = generate("support_chat", seed=0, sessions=10, turns=4)
    write_requests(requests, "chat.jsonl")
"""
from __future__ import annotations

from kvsim.workloads.record import ChatRequest
from kvsim.workloads.registry import (
           Scenario,
           generate,
           get_scenario,
           resolve,
           scenarios,
)
from kvsim.workloads.writer import WriteSummary, write_requests

__all__ = ["ChatRequest", "Scenario", "WriteSummary", "generate", "get_scenario", "resolve",
           "scenarios", "write_requests"]
