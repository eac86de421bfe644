"""Bad requests get the status and OpenAI error object vLLM's server gives them, and the
server keeps serving; nothing but served requests reaches the record."""
from __future__ import annotations

import json

import httpx
import pytest

from serve_helpers import read_record, start_kvsim

KEY = "sk-test-key"
GOOD = {"model": "kvsim", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve_errors")
    srv = start_kvsim(tmp, "--api-key", KEY, "--max-body-bytes", "65536", "--max-model-len", "2048",
                      "--record", str(tmp / "record.jsonl"), "--lora-modules", "ad=/tmp/ad",
                      "--served-model-name", "kvsim")  # strict names (404), as vLLM
    srv.record = tmp / "record.jsonl"
    srv.http = httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    yield srv
    srv.http.close()
    assert srv.stop() == 0
    assert "Traceback" not in srv.stderr()


def _post(server, path, body, **kw):
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
    return server.http.post(path, content=content, headers=headers, **kw)


def _error(resp, status):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert err["code"] == status and isinstance(err["message"], str) and err["message"] and "type" in err
    return err


SERVED = []  # ids of the requests answered 200 so far


def _ok(resp):
    assert resp.status_code == 200, resp.text
    SERVED.append(resp.json()["id"])
    return resp


def _still_serving(server):
    resp = _ok(_post(server, "/v1/chat/completions", GOOD))
    assert resp.json()["usage"]["completion_tokens"] == 3


CHAT_400 = [
    ("malformed JSON", b'{"model": "kvsim", "messages": [', "body"),
    ("not an object", b"[1, 2, 3]", "body"),
    ("messages not a list", {"messages": "hi"}, "body.messages"),
    ("missing messages", {"model": "kvsim"}, "body.messages"),
    ("max_tokens not a number", {**GOOD, "max_tokens": "lots"}, "body.max_tokens"),
    ("message without role", {"messages": [{"content": "x"}]}, "messages"),
    ("message without content", {"messages": [{"role": "user"}]}, "messages"),
    ("empty messages", {"messages": []}, "messages"),
    ("n = 2", {**GOOD, "n": 2}, "n"),
    ("n = 0", {**GOOD, "n": 0}, "n"),
    ("max_tokens = 0", {**GOOD, "max_tokens": 0}, "max_tokens"),
    ("max_completion_tokens over the context", {**GOOD, "max_completion_tokens": 5000}, "max_completion_tokens"),
    ("prompt over the context", {"messages": [{"role": "user", "content": "word " * 3000}]}, "input_tokens"),
    ("stream_options without stream", {**GOOD, "stream_options": {"include_usage": True}}, "stream_options"),
    ("empty cache_salt", {**GOOD, "cache_salt": ""}, "cache_salt"),
    ("cache_salt with a slash", {**GOOD, "cache_salt": "tenant/1"}, "cache_salt"),
    ("temperature 3", {**GOOD, "temperature": 3}, "temperature"),
    ("top_p 0", {**GOOD, "top_p": 0}, "top_p"),
    ("prompt_logprobs while streaming", {**GOOD, "stream": True, "prompt_logprobs": 1}, "prompt_logprobs"),
    ("top_logprobs without logprobs", {**GOOD, "top_logprobs": 2}, "top_logprobs"),
    ("echo", {**GOOD, "echo": True}, "echo"),
    ("a per-request chat template", {**GOOD, "chat_template": "{{ x }}"}, "chat_template"),
]


@pytest.mark.parametrize("what,body,param", CHAT_400, ids=[c[0] for c in CHAT_400])
def test_bad_chat_request_is_400(server, what, body, param):
    err = _error(_post(server, "/v1/chat/completions", body), 400)
    assert err["param"] == param or (err["param"] or "").startswith(param)
    _still_serving(server)


COMPLETION_400 = [
    ("batch of two prompts", {"prompt": ["a", "b"]}, "prompt"),
    ("empty prompt", {"prompt": ""}, "prompt"),
    ("no prompt", {"model": "kvsim"}, "prompt"),
    ("negative token id", {"prompt": [1, -2, 3]}, "body.prompt"),
    ("best_of 2", {"prompt": "x", "best_of": 2}, "best_of"),
]


@pytest.mark.parametrize("what,body,param", COMPLETION_400, ids=[c[0] for c in COMPLETION_400])
def test_bad_completion_request_is_400(server, what, body, param):
    err = _error(_post(server, "/v1/completions", body), 400)
    assert (err["param"] or "").startswith(param)
    _still_serving(server)


def test_unknown_model_and_adapter_are_404(server):
    err = _error(_post(server, "/v1/chat/completions", {**GOOD, "model": "gpt-9"}), 404)
    assert err["type"] == "NotFoundError" and err["param"] == "model" and "gpt-9" in err["message"]
    err = _error(_post(server, "/v1/chat/completions", {**GOOD, "lora_path": "nope"}), 404)
    assert err["type"] == "NotFoundError"
    _ok(_post(server, "/v1/chat/completions", {**GOOD, "model": "ad"}))


def test_huge_bodies_are_413(server):
    big = json.dumps({**GOOD, "messages": [{"role": "user", "content": "x" * 100_000}]}).encode()
    _error(_post(server, "/v1/chat/completions", big), 413)

    def chunks():  # no Content-Length: the bound holds while the body arrives
        for i in range(0, len(big), 8192):
            yield big[i:i + 8192]
    resp = server.http.post("/v1/chat/completions", content=chunks(), headers={"Content-Type": "application/json"})
    _error(resp, 413)
    _still_serving(server)


def test_api_key_on_every_route_but_health(server):
    bare = httpx.Client(base_url=server.url, timeout=30)
    for method, path in [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models"),
                         ("GET", "/metrics"), ("POST", "/reset_prefix_cache")]:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}):
            resp = bare.request(method, path, headers={"Content-Type": "application/json", **headers},
                                content=json.dumps(GOOD))
            err = _error(resp, 401)
            assert KEY not in err["message"]
    assert bare.get("/health").status_code == 200
    assert server.http.get("/metrics").status_code == 200
    bare.close()
    _still_serving(server)


def test_wrong_media_type_method_and_path(server):
    resp = server.http.post("/v1/chat/completions", content=json.dumps(GOOD), headers={"Content-Type": "text/plain"})
    assert "application/json" in _error(resp, 400)["message"]
    _error(server.http.get("/v1/chat/completions"), 405)
    _error(server.http.get("/v1/nothing-here"), 404)
    _still_serving(server)


def test_openai_client_sees_typed_errors(server):
    import openai

    client = server.client(api_key=KEY)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="kvsim", messages=[{"role": "user", "content": "x"}], n=3)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="missing", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong").models.list()
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="kvsim", messages=[{"role": "user", "content": "y" * 70_000}])
    assert info.value.status_code == 413


def test_only_served_requests_are_recorded(server):
    """Run last: the record holds exactly the requests answered 200, once each, in order."""
    lines = read_record(server.record)
    assert [line["request_id"] for line in lines] == SERVED
    assert all(line["kvsim"]["rejected"] is False for line in lines)
