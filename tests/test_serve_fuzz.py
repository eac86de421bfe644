"""Fuzzing the readers serve adds: any request body is either a valid request or an
ApiError with a 4xx status (never another exception), and any proxy-record line is either
read or an InputError naming the file and line."""
from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.errors import InputError
from kvsim.serve.errors import ApiError
from kvsim.serve.protocol import parse_request

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20)
message = st.fixed_dictionaries({}, optional={"role": json_values | st.sampled_from(["user", "system", "assistant"]),
                                              "content": json_values | st.text(max_size=30)})
chat_body = st.fixed_dictionaries({}, optional={
    "model": json_values, "messages": st.lists(message, max_size=3) | json_values,
    "max_tokens": json_values, "n": json_values, "stream": json_values, "stream_options": json_values,
    "cache_salt": json_values | st.text(max_size=200), "temperature": json_values, "top_p": json_values,
    "prompt_logprobs": json_values, "top_logprobs": json_values, "logprobs": json_values})


_SERVICE = []


def _service():
    if not _SERVICE:
        from kvsim.serve.config import ServeConfig
        from kvsim.serve.service import CacheService

        _SERVICE.append(CacheService(ServeConfig(max_model_len=4096)))
    return _SERVICE[0]


@settings(max_examples=100, deadline=None)
@given(body=chat_body | json_values, kind=st.sampled_from(["chat", "completion"]))
def test_any_body_is_a_request_or_a_4xx(body, kind):
    """Validation, model resolution, rendering and tokenizing: a 4xx or a prepared request."""
    try:
        prep = _service().prepare(kind, parse_request(kind, json.dumps(body).encode()))
    except ApiError as e:
        assert 400 <= e.status < 500 and e.message
        return
    assert prep.prompt_ids and 1 <= prep.max_tokens <= 4096


@settings(max_examples=100, deadline=None)
@given(raw=st.binary(max_size=200))
def test_any_bytes_are_a_request_or_a_4xx(raw):
    try:
        parse_request("chat", raw)
    except ApiError as e:
        assert e.status == 400


@settings(max_examples=80, deadline=None)
@given(lines=st.lists(json_values | st.fixed_dictionaries({
    "kvsim": st.fixed_dictionaries({}, optional={"cached_tokens": json_values, "prompt_tokens": json_values}),
    "upstream": st.fixed_dictionaries({}, optional={"status": json_values, "cached_tokens": json_values,
                                                    "error": json_values, "latency_ms": json_values})}),
    min_size=1, max_size=4))
def test_any_proxy_record_is_read_or_a_located_error(tmp_path_factory, lines):
    from kvsim.report.agreement import load_agreement

    path = tmp_path_factory.getbasetemp() / "fuzz_record.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    try:
        ag = load_agreement(path)
    except InputError as e:
        assert str(path) in str(e)
        return
    s = ag.summary()
    assert s["requests"] == len(ag.rows) and s["compared"] <= s["requests"]
