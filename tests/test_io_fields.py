"""The shortcuts of the chat fast path (plain records, plain JSON) give what the full paths give."""
from __future__ import annotations

import dataclasses
import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.io.fields import _PLAIN_KEYS, BadRecord, _all_fields, _plain_fields, common_fields
from kvsim.io.source import plain_json, plain_json_bytes

values = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
    st.sampled_from([0, 1, 2**31 - 1, 2**31, -1, 12.0, 0.5, 1e308 * 10, -0.0]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(["", "2024-01-01T00:00:00Z", "17.5"]), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.sampled_from(["choices", "usage", "lora_name"]), st.none(), max_size=2))
keys = st.sampled_from(sorted(_PLAIN_KEYS | {"tenant", "user", "usage", "id", "output_tokens", "echo"}))
records = st.dictionaries(keys, values, max_size=8)


def outcome(fn, rec):
    try:
        f = fn(rec)
    except BadRecord as e:
        return "error", str(e)
    if f is None:
        return None
    d = dataclasses.asdict(f)
    d["arrival"] = "nan" if math.isnan(d["arrival"]) else d["arrival"]
    d["output_ids"] = None if d["output_ids"] is None else d["output_ids"].tolist()
    return "fields", d


@settings(max_examples=2000, deadline=None)
@given(records)
def test_the_shortcut_agrees_with_the_full_checks(rec):
    full = outcome(_all_fields, rec)
    plain = outcome(_plain_fields, rec) if rec.keys() <= _PLAIN_KEYS else None
    if plain is not None:
        assert plain == full
    assert outcome(common_fields, rec) == full


def test_the_common_chat_record_takes_the_shortcut():
    rec = {"messages": 0, "model": "m", "timestamp": 17.5, "session_id": "s1", "request_id": "r1",
           "max_tokens": 256, "output_length": 135, "response": "Hello."}
    f = _plain_fields(rec)
    assert f is not None and f == _all_fields(rec)
    assert (f.arrival, f.session, f.request_id, f.max_tokens, f.logged_output, f.reply) == (
        17.5, "s1", "r1", 256, 135, "Hello.")


json_texts = st.one_of(
    st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5)),
                 lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                 max_leaves=8).map(json.dumps),
    st.text(alphabet=' \t\n\r\x0b\u2028{}[]":,0123456789.eE+-tfnulrsa\\', max_size=20))


@settings(max_examples=2000, deadline=None)
@given(json_texts, st.sampled_from(["", " ", "\n", "\r\n", " \t", "\x0b", "\u2028", "x", ",1"]))
def test_plain_json_reads_what_json_loads_reads(text, tail):
    text += tail
    try:
        expected = ("value", json.loads(text))
    except (ValueError, RecursionError):
        expected = None
    got = plain_json(text)
    if got is not None:  # whatever it reads, json.loads reads the same
        assert expected == ("value", got)
    elif expected is not None and expected[1] is not None:  # it declines only leading whitespace (or null)
        assert text[:1] in " \t\n\r"


def strict(value) -> str:
    """A value's JSON with its types (1 and 1.0 differ; lone surrogates escaped)."""
    return json.dumps(value, ensure_ascii=True)


json_bytes = st.one_of(
    st.tuples(json_texts, st.booleans()).map(lambda t: json.dumps(json.loads(t[0]), ensure_ascii=t[1])
                                             if t[0][:1] in "[{\"" and _loads_or_none(t[0]) is not None
                                             else t[0]).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.lists(st.sampled_from([b'"', b"\\ud800", b"\\udc00", b"\\u00e9", b"\\n", b"1e400", b"-0", b"1.5",
                              b"123456789012345678901234567890", b"NaN", b"Infinity", b"\xc3\xa9", b"\xff",
                              b"\xed\xa0\x80",
                              b"[", b"]", b"{", b"}", b":", b",", b" ", b"\x00", b"a", b"0"]),
             max_size=12).map(b"".join))


def _loads_or_none(text):
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


@settings(max_examples=3000, deadline=None)
@given(json_bytes, st.sampled_from([b"", b" ", b"\n", b"\r\n", b"x", b",1", b"\xff"]))
def test_plain_json_bytes_reads_what_json_loads_reads(raw, tail):
    raw += tail
    try:
        expected = ("value", strict(json.loads(raw.decode("utf-8"))))
    except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError)
        expected = None
    got = plain_json_bytes(raw)
    if got is not None:  # whatever it reads, json.loads reads the same, types included
        assert expected == ("value", strict(got))
    elif expected is not None and expected[1] != "null":  # it declines only leading whitespace (or null)
        assert raw[:1] in b" \t\n\r"


def test_plain_json_bytes_falls_back_where_the_fast_decoder_refuses():
    # what json.loads reads but msgspec refuses: lone surrogates, NaN, floats out of range
    for raw in [b'{"a": "\\ud800"}', b'{"a": NaN}', b'{"a": 1e400}', b'[Infinity]']:
        assert strict(plain_json_bytes(raw)) == strict(json.loads(raw))
    assert plain_json_bytes(b"\xff") is None and plain_json_bytes(b' {"a": 1}') is None
    assert plain_json_bytes(b'{"n": 123456789012345678901234567890}') == {"n": 123456789012345678901234567890}


@settings(max_examples=2000, deadline=None)
@given(records)
def test_the_typed_chat_line_takes_only_what_the_shortcut_takes(rec):
    """The chat fast path decodes a line of the usual fields with msgspec types (one call, no
    checks in Python): where that decoding succeeds, the shortcut takes the record too, with
    the same values, as json.loads reads the line."""
    from kvsim.io.readers.chat import _decoders

    rec = {k: v for k, v in rec.items() if k != "messages"}
    try:
        line = json.dumps({"messages": [], **rec}).encode()
    except ValueError:
        return
    try:
        typed = _decoders().plain(line)
    except _decoders().malformed:  # (ValidationError is one)
        return
    shortcut = _plain_fields(json.loads(line))
    assert shortcut is not None
    got = (typed.timestamp, typed.session_id, typed.request_id, typed.model, typed.max_tokens, typed.output_length,
           typed.response)
    want = (None if math.isnan(shortcut.arrival) else shortcut.arrival, shortcut.session, shortcut.request_id,
            shortcut.model, shortcut.max_tokens, shortcut.logged_output, shortcut.reply)
    assert got == want and [type(v) for v in got[1:]] == [type(v) for v in want[1:]]
