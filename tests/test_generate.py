"""kvsim generate: determinism and the structure each scenario promises."""
from __future__ import annotations

import itertools
import math
import os
from collections import defaultdict

import numpy as np
import pytest

from kvsim.errors import ConfigError
from kvsim.workloads import generate, resolve, scenarios
from kvsim.workloads.arrivals import BurstEnvelope, poisson_times
from kvsim.workloads.mixture import parse_mix, split_counts
from kvsim.workloads.multi_lora import adapter_names
from kvsim.workloads.rag import INSTRUCTION, POPULAR_TITLE
from kvsim.workloads.rng import Rng

# Small sizes keep every test fast.
SMALL = {
    "code_review": {"requests": 40, "system_tokens": 400},
    "support_chat": {"sessions": 6, "turns": 4},
    "rag": {"requests": 40, "doc_tokens": 80},
    "multi_tenant": {"requests": 60, "tenants": 4, "system_tokens": 200},
    "multi_lora": {"requests": 60, "adapters": 3, "system_tokens": 120},
    "volatile_prefix": {"requests": 30, "system_tokens": 300},
    "mixture": {"requests": 120, "system_tokens": 200, "doc_tokens": 80, "turns": 3},
}


def lines(name: str, seed: int = 0, **extra) -> list[dict]:
    return [r.to_json() for r in generate(name, seed=seed, **{**SMALL[name], **extra})]


def system(rec: dict) -> str:
    assert rec["messages"][0]["role"] == "system"
    return rec["messages"][0]["content"]


def by_session(recs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in recs:
        if "session_id" in r:
            out[r["session_id"]].append(r)
    return out


def test_every_scenario_has_small_sizes_here():
    """The table above covers every registered scenario (so the loops below test all)."""
    assert set(SMALL) == set(scenarios())


@pytest.mark.parametrize("name", list(SMALL))
def test_same_seed_same_requests_other_seed_differs(name):
    """Generation is a pure function of scenario, seed and options."""
    first, again, other = lines(name, 0), lines(name, 0), lines(name, 1)
    assert first == again
    assert first != other


@pytest.mark.parametrize("name", list(SMALL))
def test_common_invariants(name):
    """Arrival times never go back, ids are unique, replies fit max_tokens."""
    recs = lines(name)
    times = [r["timestamp"] for r in recs]
    assert times == sorted(times) and times[0] >= 0
    assert len({r["request_id"] for r in recs}) == len(recs)
    for r in recs:
        assert r["messages"][-1]["role"] == "user"
        assert r["response"] and 0 < r["output_length"] <= r["max_tokens"]
        assert r["model"] == "meta-llama/Meta-Llama-3-8B-Instruct"


def test_requests_option_gives_exact_count():
    for name in ("code_review", "rag", "multi_tenant", "multi_lora", "volatile_prefix", "mixture"):
        assert len(generate(name, **{**SMALL[name], "requests": 37})) == 37


def test_system_prompt_does_not_depend_on_request_count():
    """Named random streams: more requests do not change the shared prompt."""
    a = lines("code_review", requests=5)
    b = lines("code_review", requests=50)
    assert system(a[0]) == system(b[0])


# -- (a) code review ------------------------------------------------------------------
def test_code_review_shares_one_system_prompt_and_varies_the_snippet():
    recs = lines("code_review", requests=80)
    assert len({system(r) for r in recs}) == 1
    originals = [r for r in recs if len(r["messages"]) == 2]
    assert len({r["messages"][1]["content"] for r in originals}) == len(originals)
    assert all("```" in r["messages"][1]["content"] for r in originals)


def test_code_review_follow_up_resends_the_review():
    recs = lines("code_review", requests=120)
    follow_ups = [r for r in recs if len(r["messages"]) == 4]
    assert follow_ups, "some reviews get a follow-up question"
    sessions = by_session(recs)
    for f in follow_ups:
        first, second = sessions[f["session_id"]]
        assert second is f and first["timestamp"] < f["timestamp"]
        assert f["messages"][:2] == first["messages"]
        assert f["messages"][2] == {"role": "assistant", "content": first["response"]}


@pytest.mark.parametrize("name", ["code_review", "multi_tenant", "multi_lora", "volatile_prefix"])
@pytest.mark.parametrize("tokens", [600, 2500])
def test_system_tokens_flag_sets_prompt_size_in_cl100k_tokens(name, tokens):
    from kvsim.io.tokenize.tokenizers import get_tokenizer

    prompt = system(lines(name, requests=2, system_tokens=tokens)[0])
    assert abs(len(get_tokenizer("cl100k_base").encode(prompt)) - tokens) <= 0.1 * tokens


def test_doc_tokens_flag_sets_document_size():
    from kvsim.io.tokenize.tokenizers import get_tokenizer

    tok = get_tokenizer("cl100k_base")
    for tokens in (100, 400):
        body = system(lines("rag", requests=1, doc_tokens=tokens)[0]).split("\n\nDocument 1: ")[1]
        doc = body.split("\n\nDocument 2: ")[0].split("\n", 1)[1]
        assert abs(len(tok.encode(doc)) - tokens) <= 0.15 * tokens


# -- (b) support chat -----------------------------------------------------------------
def test_support_turn_resends_previous_turn_and_its_reply():
    """Turn t+1 = turn t's messages + turn t's response (verbatim) + a new user message."""
    recs = lines("support_chat", sessions=8, turns=5)
    sessions = by_session(recs)
    assert len(sessions) == 8
    for turns in sessions.values():
        assert 3 <= len(turns) <= 7  # 5 turns on average: between ceil(5/2) and 5 + 5//2
        for prev, nxt in itertools.pairwise(turns):
            assert nxt["timestamp"] > prev["timestamp"]
            assert nxt["messages"][:-2] == prev["messages"]
            assert nxt["messages"][-2] == {"role": "assistant", "content": prev["response"]}
            assert nxt["messages"][-1]["role"] == "user"
    assert len({system(r) for r in recs}) == 1


def test_support_sessions_interleave_in_time():
    recs = lines("support_chat", sessions=8, turns=5)
    order = [r["session_id"] for r in recs]
    changes = sum(a != b for a, b in itertools.pairwise(order))
    assert changes > len(by_session(recs))  # not one session after another


def test_support_system_prompt_is_about_650_cl100k_tokens():
    from kvsim.io.tokenize.tokenizers import get_tokenizer

    tok = get_tokenizer("cl100k_base")
    sizes = [len(tok.encode(system(lines("support_chat", seed=s)[0]))) for s in range(5)]
    assert all(610 <= n <= 690 for n in sizes), sizes


# -- (c) RAG ----------------------------------------------------------------------------
def _docs(rec: dict) -> list[str]:
    body = system(rec)[len(INSTRUCTION):]
    return [part.split("\n", 1)[0].split(": ", 1)[1] for part in body.split("\n\nDocument ")[1:]]


def test_rag_popular_document_first_and_others_vary():
    recs = lines("rag")
    for r in recs:
        assert system(r).startswith(f"{INSTRUCTION}\n\nDocument 1: {POPULAR_TITLE}\n")
        assert 2 <= len(_docs(r)) <= 4 and POPULAR_TITLE not in _docs(r)[1:]
    assert len({tuple(_docs(r)) for r in recs}) > len(recs) // 3


def test_rag_popular_last_only_moves_the_popular_document():
    first, last = lines("rag"), lines("rag", popular_last=True)
    for a, b in zip(first, last):
        assert _docs(b)[-1] == POPULAR_TITLE
        assert _docs(b) == _docs(a)[1:] + _docs(a)[:1]
        assert a["messages"][1:] == b["messages"][1:]


def test_rag_ordering_effect_on_shared_prefix():
    """Popular-first shares the whole popular document; popular-last little beyond the
    instruction (documents differ from their first characters on)."""
    def shared(recs):
        texts = [system(r) for r in recs]
        return min(len(os.path.commonprefix([texts[0], t])) for t in texts[1:])

    popular_len = len(system(lines("rag")[0]).split("\n\nDocument 2: ")[0])
    assert shared(lines("rag")) >= popular_len
    assert shared(lines("rag", popular_last=True)) < len(INSTRUCTION) + 40


# -- (d) multi-tenant -----------------------------------------------------------------
def test_multi_tenant_one_salt_per_tenant_shared_system_prompt():
    recs = lines("multi_tenant", requests=200, tenants=5)
    salts = defaultdict(set)
    for r in recs:
        salts[r["tenant"]].add(r["cache_salt"])
    assert sorted(salts) == [f"tenant_{i:03d}" for i in range(1, 6)]
    assert all(len(s) == 1 for s in salts.values())
    assert len({next(iter(s)) for s in salts.values()}) == 5
    assert len({system(r) for r in recs}) == 1


def test_multi_tenant_same_question_from_different_tenants():
    """Identical prompts recur across tenants: isolation has a cost to measure."""
    recs = lines("multi_tenant", requests=200)
    tenants_by_prompt = defaultdict(set)
    for r in recs:
        tenants_by_prompt[r["messages"][1]["content"]].add(r["tenant"])
    assert any(len(t) > 1 for t in tenants_by_prompt.values())


# -- (e) multi-LoRA -------------------------------------------------------------------
def test_multi_lora_teams_use_own_adapters_on_same_base_prompts():
    recs = lines("multi_lora", requests=200, adapters=4)
    assert {r["lora"] for r in recs} == set(adapter_names(4))
    assert adapter_names(2) == ["team_a_lora", "team_b_lora"]
    adapters_by_system = defaultdict(set)
    adapters_by_prompt = defaultdict(set)
    for r in recs:
        adapters_by_system[system(r)].add(r["lora"])
        adapters_by_prompt[(system(r), r["messages"][1]["content"])].add(r["lora"])
    assert len(adapters_by_system) == 3  # three base task prompts
    assert all(len(a) >= 2 for a in adapters_by_system.values())
    assert any(len(a) > 1 for a in adapters_by_prompt.values())
    assert all("cache_salt" not in r for r in recs)


# -- (g) volatile prefix --------------------------------------------------------------
def test_volatile_prefix_opens_every_prompt_with_time_and_id():
    recs = lines("volatile_prefix")
    prompts = [system(r) for r in recs]
    assert all(p.startswith("Today is 2026-11-30 ") and "Request ID: " in p.split("\n")[0]
               for p in prompts)
    assert len(set(prompts)) == len(prompts)
    assert len({p.split("\n", 1)[1] for p in prompts}) == 1  # the rest is shared


# -- (f) mixture and arrivals ---------------------------------------------------------
def test_mixture_contains_every_component_and_keeps_conversations_intact():
    recs = lines("mixture")
    kinds = {r["request_id"].split("-")[0] for r in recs}
    assert kinds == {"cr", "chat", "rag", "mt", "lora"}
    for sid, turns in by_session(recs).items():
        if sid.startswith("chat"):
            for prev, nxt in itertools.pairwise(turns):
                assert nxt["messages"][:-2] == prev["messages"]


def _dispersion(times: list[float], window: float = 10.0) -> float:
    counts = np.histogram(times, bins=np.arange(0.0, max(times) + window, window))[0]
    return float(counts.var() / counts.mean())


def test_mixture_arrivals_come_in_bursts():
    """Counts per 10 s window vary far more than a Poisson stream's (variance = mean)."""
    for seed in range(3):
        times = [r["timestamp"] for r in lines("mixture", seed=seed, requests=400)]
        assert times == sorted(times)
        assert _dispersion(times) > 2.0
    poisson = poisson_times(Rng(0), 2000, 1.0)
    assert _dispersion(poisson) < 1.5


def test_burst_envelope_warp_maps_expected_counts_to_segment_starts():
    env = BurstEnvelope.make(Rng(3), mean_rate=2.0, duration=600.0, burstiness=5.0)
    assert env.starts[-1] >= 600.0
    assert sorted({round(r / min(env.rates), 6) for r in env.rates}) == [1.0, 5.0]
    for k in range(len(env.rates)):
        assert math.isclose(env.warp(env.cum[k] / env.mean_rate), env.starts[k], abs_tol=1e-9)
    ts = [env.warp(x / 10) for x in range(5000)]
    assert ts == sorted(ts)


def test_mix_parsing_and_split():
    assert parse_mix("rag=1, code_review=3") == {"rag": 1.0, "code_review": 3.0}
    assert split_counts(10, {"a": 1, "b": 1, "c": 1}) == {"a": 4, "b": 3, "c": 3}
    assert sum(split_counts(501, parse_mix("rag=0.2,support_chat=0.5,multi_lora=0.3")).values()) == 501
    for bad in ("rag", "rag=x", "nope=1", "mixture=1", "rag=0", "rag=-1"):
        with pytest.raises(ConfigError):
            parse_mix(bad)


def test_mixture_mix_option_selects_components():
    recs = lines("mixture", mix="rag=1,multi_lora=1", requests=40)
    assert {r["request_id"].split("-")[0] for r in recs} == {"rag", "lora"}


# -- options ----------------------------------------------------------------------------
def test_options_that_do_not_apply_are_refused():
    with pytest.raises(ConfigError, match="--tenants does not apply to scenario rag"):
        resolve("rag", tenants=3)
    with pytest.raises(ConfigError, match="--popular-last"):
        resolve("code_review", popular_last=True)
    with pytest.raises(ConfigError, match="unknown scenario"):
        resolve("nope")


@pytest.mark.parametrize("opts", [{"requests": 0}, {"rate": 0.0}, {"system_tokens": 10}])
def test_bad_values_are_refused(opts):
    with pytest.raises(ConfigError):
        resolve("code_review", **opts)
