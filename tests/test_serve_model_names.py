"""Model names: without ``--served-model-name`` the server answers requests for any model name
(as SGLang does) and lists the tokenizer's name; with one it is strict, an unknown name is a
404 (as vLLM). Real server processes, driven by the real ``openai`` client."""
from __future__ import annotations

import openai
import pytest

from serve_helpers import read_record, start_kvsims

MESSAGES = [{"role": "user", "content": "Hello there, which model are you?"}]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve_names")
    specs = {"open": ["--record", str(tmp / "open.jsonl"), "--lora-modules", "team_a=/models/lora/team_a"],
             "strict": ["--served-model-name", "my-model", "--lora-modules", "team_a=/models/lora/team_a"]}
    started = start_kvsims(tmp, specs)
    started["open"].record = tmp / "open.jsonl"
    yield started
    for srv in started.values():
        assert srv.stop() == 0, srv.stderr()


def test_any_model_name_is_answered_without_a_served_model_name(servers):
    client = servers["open"].client()
    assert [m.id for m in client.models.list().data] == ["cl100k_base", "team_a"]
    answers = [client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=3)
               for name in ("gpt-4o-mini", "meta-llama/Meta-Llama-3-8B-Instruct", "cl100k_base")]
    assert [a.model for a in answers] == ["gpt-4o-mini", "meta-llama/Meta-Llama-3-8B-Instruct", "cl100k_base"]
    assert all(a.usage.completion_tokens == 3 for a in answers)
    # the same prompt, whatever the name: one cache, the later requests hit it
    assert answers[0].usage.prompt_tokens_details.cached_tokens == 0
    assert answers[1].usage.prompt_tokens_details.cached_tokens > 0
    done = client.completions.create(model="anything", prompt="Once upon a time", max_tokens=2)
    assert done.model == "anything" and done.usage.completion_tokens == 2
    lines = read_record(servers["open"].record)
    assert [line.get("lora") for line in lines] == [None] * 4


def test_adapters_keep_their_names_without_a_served_model_name(servers):
    client = servers["open"].client()
    a = client.chat.completions.create(model="team_a", messages=MESSAGES, max_tokens=2)
    b = client.chat.completions.create(model="whatever:team_a", messages=MESSAGES, max_tokens=2)  # SGLang's form
    assert a.model == "team_a" and b.model == "team_a"
    lines = read_record(servers["open"].record)
    assert [line.get("lora") for line in lines[-2:]] == ["team_a", "team_a"]


def test_a_served_model_name_makes_names_strict(servers):
    client = servers["strict"].client()
    assert [m.id for m in client.models.list().data] == ["my-model", "team_a"]
    ok = client.chat.completions.create(model="my-model", messages=MESSAGES, max_tokens=2)
    assert ok.model == "my-model"
    assert client.chat.completions.create(model="team_a", messages=MESSAGES, max_tokens=2).model == "team_a"
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o-mini", messages=MESSAGES, max_tokens=2)
    assert err.value.status_code == 404 and "gpt-4o-mini" in str(err.value)
