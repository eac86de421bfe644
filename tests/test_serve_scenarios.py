"""The article's client scenarios, run unchanged but for ``base_url`` against ``kvsim serve``
(a real process, driven by the real ``openai`` package), with both cache models.

Every served ``cached_tokens`` is checked three ways: against what the scenario must show
(growth turn by turn, sharing or isolation), against a first-principles oracle of an
unlimited cache computed from the recorded token ids, and against ``kvsim simulate`` /
``replay("apc"|"radix", ...)`` replaying the record.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from serve_helpers import common_prefix, read_record, start_kvsims, unlimited_cache_oracle

MODEL = "meta-llama/Meta-Llama-3-8B-Instruct"


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    specs = {policy: ["--policy", policy, "--served-model-name", MODEL, "--record", str(tmp / f"{policy}.jsonl"),
                      "--lora-modules", "team_a=/models/lora/team_a", "--lora-modules", "team_b=/models/lora/team_b"]
             for policy in ("apc", "radix")}
    started = start_kvsims(tmp, specs)
    for policy, srv in started.items():
        srv.policy, srv.record = policy, tmp / f"{policy}.jsonl"
    yield started
    for srv in started.values():
        assert srv.stop() == 0, srv.stderr()


@pytest.fixture(params=["apc", "radix"])
def server(request, servers):
    return servers[request.param]


def _by_id(server) -> dict[str, dict]:
    return {line["request_id"]: line for line in read_record(server.record)}


def test_shared_system_prompt(server):
    """Scenario 1: the second review reuses the system prompt (its KV pages), exactly as an
    unlimited cache would."""
    from openai import OpenAI

    client = OpenAI(base_url=server.base_url, api_key="EMPTY")
    SYSTEM_PROMPT = "당신은 코드 리뷰 전문가입니다. " * 50
    responses = []
    for user_code in ["def foo(): pass", "def bar(): return 1"]:
        response = client.chat.completions.create(
            model="meta-llama/Meta-Llama-3-8B-Instruct",
            messages=[
                {"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": f"이 Python 코드를 리뷰해줘: {user_code}"}
            ],
            max_tokens=512
        )
        responses.append(response)
    first, second = responses
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    assert second.usage.completion_tokens == 512 and len(second.choices[0].message.content) > 512
    lines = _by_id(server)
    p1, p2 = lines[first.id]["prompt_token_ids"], lines[second.id]["prompt_token_ids"]
    assert len(p2) == second.usage.prompt_tokens
    shared = min(common_prefix(p1, p2), len(p2) - 1)
    expect = shared // 16 * 16 if server.policy == "apc" else shared
    assert second.usage.prompt_tokens_details.cached_tokens == expect


def test_multi_turn_support_chat_grows(server):
    """Scenario 2: a support chat resends its history; the reused part grows turn by turn and
    covers the previous turn's prompt and reply (re-tokenized to the very same tokens)."""
    from openai import OpenAI

    client = OpenAI(base_url=server.base_url, api_key="EMPTY")
    SYSTEM_PROMPT = """
당신은 TechCorp의 고객 지원 전문가입니다.
[회사 정책 200토큰...]
[제품 정보 300토큰...]
[응대 지침 150토큰...]
""" + "환불은 구매 후 30일 이내에 가능합니다. " * 40  # 총 ~650토큰
    cached, ids = [], []

    def chat(history: list, user_input: str) -> str:
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        messages.extend(history)
        messages.append({"role": "user", "content": user_input})

        response = client.chat.completions.create(
            model="meta-llama/Meta-Llama-3-8B-Instruct",
            messages=messages,
            max_tokens=256
        )
        cached.append(response.usage.prompt_tokens_details.cached_tokens)
        ids.append(response.id)
        return response.choices[0].message.content

    user_messages = ["주문한 노트북이 아직 도착하지 않았어요.", "주문 번호는 A-1042입니다.",
                     "배송지를 바꿀 수 있나요?", "고맙습니다. 환불 규정도 알려 주세요."]
    history = []
    for user_input in user_messages:
        response_text = chat(history, user_input)
        history.extend([
            {"role": "user", "content": user_input},
            {"role": "assistant", "content": response_text}
        ])
    assert all(b > a for a, b in zip(cached, cached[1:])), cached
    lines = _by_id(server)
    for prev_id, cur_id, got in zip(ids, ids[1:], cached[1:]):
        prev, cur = lines[prev_id], lines[cur_id]
        computed = prev["prompt_token_ids"] + prev["output_token_ids"][:-1]
        # the resent history is token for token what the engine computed last turn
        assert common_prefix(cur["prompt_token_ids"], computed) == len(computed)
        expect = len(computed) // 16 * 16 if server.policy == "apc" else len(computed)
        assert got == expect


def test_rag_popular_document_first_beats_last(server):
    """Scenario 3: the popular document placed first is reused by every later query; placed
    last, behind a different document each time, it is not."""
    from openai import OpenAI

    client = OpenAI(base_url=server.base_url, api_key="EMPTY")

    def rag_query(retrieved_docs: list[str], question: str):
        # 검색된 문서를 시스템 메시지 앞쪽에 배치 — 캐시 재사용 극대화
        context = "\n\n".join([f"문서 {i+1}: {doc}" for i, doc in enumerate(retrieved_docs)])

        response = client.chat.completions.create(
            model="meta-llama/Meta-Llama-3-8B-Instruct",
            messages=[
                {"role": "system", "content": f"다음 문서들을 참고하여 질문에 답변해 주세요:\n\n{context}"},
                {"role": "user", "content": question}
            ],
            max_tokens=512
        )
        return response

    def fetch_document(name: str) -> str:  # the user's own function in the article
        return f"{name}: " + " ".join(f"Section {i} explains list comprehensions and generators." for i in range(40))

    popular_doc = fetch_document("python-docs-chapter3")
    questions = ["What is a generator?", "How do list comprehensions work?", "When should I use yield?"]
    first = [rag_query(retrieved_docs=[popular_doc, fetch_document(f"faq-{i}")], question=q)
             for i, q in enumerate(questions)]
    last = [rag_query(retrieved_docs=[fetch_document(f"blog-{i}"), popular_doc], question=q)
            for i, q in enumerate(questions)]
    doc_tokens = 400  # the popular document is ~480 tokens; its reuse must show
    got_first = [r.usage.prompt_tokens_details.cached_tokens for r in first[1:]]
    got_last = [r.usage.prompt_tokens_details.cached_tokens for r in last[1:]]
    assert min(got_first) > doc_tokens
    assert max(got_last) < 64, got_last   # the instruction line only


def test_tenants_with_different_salts_share_nothing(server):
    """Scenario 4 (vLLM cache salting), as an OpenAI request field: the same prompt shares
    nothing across salts and everything reusable within one."""
    from openai import OpenAI

    client = OpenAI(base_url=server.base_url, api_key="EMPTY")

    def serve_tenant_request(tenant_id: str, prompt: str):
        return client.chat.completions.create(
            model="meta-llama/Meta-Llama-3-8B-Instruct",
            messages=[{"role": "user", "content": prompt}], max_tokens=256,
            extra_body={"cache_salt": f"tenant:{tenant_id}"},  # salt 주입으로 첫 블록 해시가 달라짐
        )

    shared_prompt = "공통 시스템 프롬프트... " + "모든 테넌트가 같은 안내문을 씁니다. " * 30
    response_a = serve_tenant_request("tenant_001", shared_prompt)
    response_b = serve_tenant_request("tenant_002", shared_prompt)
    response_a2 = serve_tenant_request("tenant_001", shared_prompt)
    assert response_b.usage.prompt_tokens_details.cached_tokens == 0
    assert response_a2.usage.prompt_tokens_details.cached_tokens > 0
    unsalted = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": shared_prompt}],
                                              max_tokens=4)
    # without a salt only the chat template's header can match other unsalted prompts
    assert unsalted.usage.prompt_tokens_details.cached_tokens < 16
    line = _by_id(server)[response_a.id]
    assert line["cache_salt"] == "tenant:tenant_001"


def test_lora_adapters_by_model_name(server):
    """Multi-LoRA: an adapter is chosen by model name (vLLM) or base:adapter / lora_path
    (SGLang); adapters and the base model never share KV."""
    client = server.client()
    prompt = "팀 공통 작업 지침입니다. " * 40
    ask = lambda model, **kw: client.chat.completions.create(  # noqa: E731
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=8, **kw)
    a1 = ask("team_a")
    b1 = ask("team_b")
    a2 = ask(f"{MODEL}:team_a")              # SGLang's syntax for the same adapter
    b2 = ask(MODEL, extra_body={"lora_path": "team_b"})
    base = ask(MODEL)
    assert a1.model == "team_a" and b1.model == "team_b" and base.model == MODEL
    assert b1.usage.prompt_tokens_details.cached_tokens == 0
    assert a2.usage.prompt_tokens_details.cached_tokens > 0
    assert b2.usage.prompt_tokens_details.cached_tokens > 0
    assert base.usage.prompt_tokens_details.cached_tokens < 16  # the template header at most
    models = {m.id for m in client.models.list().data}
    assert models == {MODEL, "team_a", "team_b"}
    assert _by_id(server)[a2.id]["lora"] == "team_a"


def test_streaming_matches_non_streaming(server):
    """The SSE stream carries the same reply and, in its usage chunk, the same figures as the
    non-streamed answer would at that point of the request stream."""
    client = server.client()
    messages = [{"role": "system", "content": "스트리밍 테스트 안내문입니다. " * 30},
                {"role": "user", "content": "안녕하세요"}]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=40, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    assert text == plain.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert usage.completion_tokens == 40 and usage.prompt_tokens == plain.usage.prompt_tokens
    # the streamed request found the plain one's prompt and reply in the cache
    expect = plain.usage.prompt_tokens - 1 if server.policy == "radix" else (plain.usage.prompt_tokens - 1) // 16 * 16
    assert usage.prompt_tokens_details.cached_tokens == expect
    no_usage = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, stream=True))
    assert all(c.usage is None for c in no_usage)


def test_completions_streaming_and_not(server):
    """/v1/completions: a text prompt (BOS prepended, as the engine's tokenizer does), token-id
    prompts, streaming with usage."""
    client = server.client()
    doc = "Prefix caching keeps the KV of shared prompt prefixes. " * 30
    one = client.completions.create(model=MODEL, prompt=doc + "Question one:", max_tokens=12)
    two = client.completions.create(model=MODEL, prompt=doc + "Question two:", max_tokens=12, stream=True,
                                    stream_options={"include_usage": True})
    chunks = list(two)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert one.usage.completion_tokens == 12 and usage.completion_tokens == 12 and text
    assert usage.prompt_tokens_details.cached_tokens > 0
    ids = _by_id(server)[one.id]["prompt_token_ids"]
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=2)
    assert by_ids.usage.prompt_tokens == len(ids)
    assert by_ids.usage.prompt_tokens_details.cached_tokens > 0
    default = client.completions.create(model=MODEL, prompt="short")
    assert default.usage.completion_tokens == 16  # vLLM's completions default


def test_record_reproduces_served_numbers(server):
    """The record, read back by kvsim, replays to the served cached_tokens request for
    request — through the library's replay, the CLI's simulate, and the oracle."""
    from kvsim import load_trace
    from kvsim.cli import run
    from kvsim.drive.sequential import replay
    from kvsim.engines.options import SimOptions

    lines = read_record(server.record)
    assert len(lines) >= 25
    served = np.array([line["kvsim"]["cached_tokens"] for line in lines])
    assert served.sum() > 0
    assert served.tolist() == unlimited_cache_oracle(lines, server.policy)
    trace = load_trace(server.record)
    assert replay(server.policy, trace, SimOptions()).cached_tokens.tolist() == served.tolist()
    assert replay(server.policy, trace, SimOptions(), implementation="reference").cached_tokens.tolist() == \
        served.tolist()
    out = server.record.parent / "per_request.jsonl"
    assert run(["simulate", str(server.record), "--policy", server.policy, "--per-request", str(out)]) == 0
    simulated = [json.loads(x)["cached_tokens"] for x in out.read_text().splitlines()]
    assert simulated == served.tolist()


def test_record_holds_no_text(server):
    """By default the record keeps token ids and lengths, never the messages or replies."""
    raw = server.record.read_text(encoding="utf-8")
    assert "리뷰" not in raw and "TechCorp" not in raw and '"messages"' not in raw and "reply_text" not in raw
