"""Fuzz the readers: random bytes or random JSON records give a Trace or an InputError, never
another exception."""
from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import kvsim
from kvsim.errors import InputError
from kvsim.io.trace.columns import Trace

FORMATS = ["auto", "chat", "completion", "tokens", "mooncake", "sharegpt", "kvcache-tester", "azure-csv"]
FIELDS = ["messages", "prompt", "prompt_token_ids", "output_token_ids", "hash_ids", "input_length",
          "output_length", "timestamp", "conversations", "requests", "block_size", "role", "content",
          "from", "value", "user", "tenant", "cache_salt", "lora", "lora_name", "lora_request", "session_id",
          "max_tokens", "output_tokens", "response", "output", "usage", "choices", "message",
          "completion_tokens", "prompt_logprobs", "arrival_step", "request_id", "id", "in", "out", "t", "type", "text"]

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                    st.sampled_from(["user", "assistant", "system", "human", "gpt", "subagent",
                                     "2024-01-01T00:00:00Z", "<|eot_id|>", "\ud800"]))
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=5),
                            st.dictionaries(st.sampled_from(FIELDS), inner, max_size=5)),
    max_leaves=25)
records = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6)

small = st.integers(min_value=0, max_value=40)
texts = st.text(max_size=20)
messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool"]),
                                           "content": texts}), min_size=1, max_size=3)
VALID = {
    "chat": st.fixed_dictionaries({"messages": messages}, optional={
        "response": texts, "max_tokens": small, "timestamp": st.floats(0, 1e9), "user": texts,
        "cache_salt": texts, "lora": texts, "session_id": texts, "output_tokens": small, "arrival_step": small}),
    "completion": st.fixed_dictionaries({"prompt": texts.filter(bool)}, optional={"output": texts}),
    "tokens": st.fixed_dictionaries({"prompt_token_ids": st.lists(small, min_size=1, max_size=8)},
                                    optional={"output_token_ids": st.lists(small, max_size=4),
                                              "arrival_step": small}),
    "mooncake": st.integers(1, 2000).flatmap(lambda n: st.fixed_dictionaries({
        "timestamp": small, "input_length": st.just(n), "output_length": small,
        "hash_ids": st.lists(st.integers(0, 5), min_size=-(-n // 512), max_size=-(-n // 512))})),
    "sharegpt": st.fixed_dictionaries({"conversations": st.lists(st.fixed_dictionaries({
        "from": st.sampled_from(["human", "gpt", "system"]), "value": texts}), min_size=1, max_size=4)}),
}


@st.composite
def near_valid(draw):
    """A valid record of some format, maybe with one field replaced by a random value or removed."""
    rec = dict(draw(st.one_of(*VALID.values())))
    action = draw(st.sampled_from(["keep", "keep", "replace", "drop"]))
    key = draw(st.sampled_from(sorted(rec)))
    if action == "replace":
        rec[key] = draw(json_values)
    elif action == "drop":
        del rec[key]
    return rec


def _load(data: bytes, fmt: str, on_error: str, name: str = "fuzz.jsonl"):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / name
        path.write_bytes(data)
        try:
            trace = kvsim.load_trace(path, format=fmt, on_error=on_error, tokenizer="bytes")
        except InputError as e:
            assert str(e).startswith(str(path)), e
            return None
        assert isinstance(trace, Trace)
        assert path.read_bytes() == data  # never written over
        return trace


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(st.binary(max_size=300),
                      st.tuples(st.binary(max_size=300), st.integers(0, 400)).map(
                          lambda t: gzip.compress(t[0])[:t[1]])),  # gzip, maybe cut short
       fmt=st.sampled_from(FORMATS), on_error=st.sampled_from(["fail", "skip"]))
@example(data=b"\r\x00", fmt="azure-csv", on_error="fail")   # a header the csv module rejects
def test_random_bytes(data, fmt, on_error):
    _load(data, fmt, on_error)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(st.one_of(records, json_values), min_size=1, max_size=4),
       fmt=st.sampled_from(FORMATS), on_error=st.sampled_from(["fail", "skip"]))
def test_random_json_records(lines, fmt, on_error):
    """Arbitrary JSON values and records with known keys but random values."""
    data = "".join(json.dumps(x) + "\n" for x in lines).encode("utf-8", "surrogatepass")
    trace = _load(data, fmt, on_error)
    if trace is not None:
        assert len(trace) + trace.meta.skipped_lines >= 0
        assert len(trace.offsets) == len(trace) + 1


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(near_valid(), min_size=1, max_size=5), fmt=st.sampled_from(FORMATS),
       on_error=st.sampled_from(["fail", "skip"]))
def test_near_valid_records(lines, fmt, on_error):
    """Mostly well-formed records (so that many load), with one field broken now and then."""
    data = "".join(json.dumps(x) + "\n" for x in lines).encode("utf-8", "surrogatepass")
    trace = _load(data, fmt, on_error)
    if trace is not None:
        assert trace.output_lengths.min(initial=0) >= 0
        assert trace.num_prompt_tokens == (0 if trace.tokens is None else len(trace.tokens))


@settings(max_examples=60, deadline=None)
@given(doc=st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=6),
       as_array=st.booleans())
def test_random_single_documents(doc, as_array):
    data = json.dumps([doc, doc] if as_array else doc, indent=1).encode("utf-8", "surrogatepass")
    _load(data, "auto", "skip", name="fuzz.json")


@pytest.mark.parametrize("tokenizer", ["cl100k_base", "bytes"])
def test_lone_surrogates_in_text(tmp_path, tokenizer):
    path = tmp_path / "s.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "a\\ud800b"}], "response": "\\udfff"}\n')
    t = kvsim.load_trace(path, tokenizer=tokenizer)
    assert len(t) == 1 and len(t.prompt(0)) > 3
