"""Isolation and adapters: the upper bound with salts / LoRA namespaces honoured vs ignored."""
from __future__ import annotations

import pytest

from kvsim.analyze import analyze
from kvsim.io.trace.columns import Trace

SYSTEM = list(range(1000, 1064))  # 64 tokens, four full blocks


def prompts(n: int) -> list[list[int]]:
    return [SYSTEM + [50_000 + 10 * i + k for k in range(8)] for i in range(n)]


def test_salt_isolation_cost():
    """Two tenants x 3 requests: isolated, each tenant computes the system prompt once."""
    trace = Trace.from_prompts(prompts(6), cache_salts=["t1", "t1", "t1", "t2", "t2", "t2"])
    iso = analyze(trace).isolation
    assert iso["honoured"]["token_tokens"] == 4 * 64
    assert iso["salts_ignored"]["token_tokens"] == 5 * 64
    assert iso["salts_ignored"]["token_cost_tokens"] == 64
    assert iso["salts_ignored"]["token_cost_points"] == pytest.approx(100 * 64 / (6 * 72))
    assert iso["salts_ignored"]["block16_cost_tokens"] == 64
    assert "adapters_ignored" not in iso


def test_adapter_duplication():
    """Three adapters on one base prompt: the base prompt is computed once per adapter."""
    trace = Trace.from_prompts(prompts(6), loras=["a", "b", "c", "a", "b", "c"])
    iso = analyze(trace).isolation
    assert iso["adapters_ignored"]["token_cost_tokens"] == 2 * 64
    assert "salts_ignored" not in iso


def test_both():
    trace = Trace.from_prompts(prompts(4), cache_salts=["x", "y", "x", "y"], loras=["a", "a", "b", "b"])
    iso = analyze(trace).isolation
    assert iso["honoured"]["token_tokens"] == 0
    assert iso["salts_ignored"]["token_tokens"] == 2 * 64
    assert iso["adapters_ignored"]["token_tokens"] == 2 * 64
    assert iso["both_ignored"]["token_tokens"] == 3 * 64


def test_no_section_without_namespaces():
    assert analyze(Trace.from_prompts(prompts(3))).isolation is None
