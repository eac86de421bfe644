"""Chat prompts assembled from each distinct message's tokens (kvsim.io.tokenize.message_tokens), the
messages of each line read raw by the chat reader's fast path (kvsim.io.readers.chat): token for
token and message start for message start what rendering and tokenizing each whole prompt gives,
and the same trace or the same error as the general reader on the same bytes."""
from __future__ import annotations

import gzip
import json
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvsim
from kvsim.errors import InputError
from kvsim.io.tokenize.message_tokens import MessageTokens
from kvsim.io.tokenize.pieces import PieceEncoder, cut_strings
from kvsim.io.readers.base import LoadContext
from kvsim.io.readers.chat import ChatReader
from kvsim.io.tokenize.templates import BUILTIN
from kvsim.io.tokenize.tokenizers import get_tokenizer
from test_io_pieces import JINJA, TEMPLATES, contents, messages, whole
from trace_equal import assert_same_trace

TOKENIZERS = ["cl100k_base", "bytes"]
LOCAL = [name for name, t in BUILTIN.items() if t.local is not None]


@contextmanager
def chat_path(fast: bool = True, piecewise: bool = True):
    """Read chat logs by the fast path (any size) or without it, piece by piece or whole."""
    saved = ChatReader.fast_min_bytes
    ChatReader.fast_min_bytes = 0 if fast else 1 << 62
    LoadContext.piecewise = piecewise
    try:
        yield
    finally:
        ChatReader.fast_min_bytes = saved
        LoadContext.piecewise = True


def outcome(path: Path, fast: bool, piecewise: bool = True, **kw):
    with chat_path(fast, piecewise):
        try:
            return kvsim.load_trace(path, **kw)
        except InputError as e:
            return str(e)


# -- the store on its own ----------------------------------------------------------------------
@pytest.mark.parametrize("tokenizer", TOKENIZERS)
@pytest.mark.parametrize("name", LOCAL)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(convs=st.lists(messages, min_size=1, max_size=4), replies=st.lists(contents, max_size=4))
def test_assembled_prompts_equal_whole_prompt_encoding(name, tokenizer, convs, replies):
    tmpl = BUILTIN[name]
    tok = get_tokenizer(tokenizer, tmpl.special_tokens)
    specials = cut_strings(tok)
    if not MessageTokens.usable(tmpl.local, specials):
        assert name == "plain"  # no special token to cut at: tokenized whole
        return
    store = MessageTokens(tok, tmpl.local, specials, PieceEncoder(tok, specials))
    # replies repeated as assistant messages: their pieces are built from the reply's tokens
    convs = [[*c, *(("assistant", r) for r in replies)] for c in convs]
    for round_ in range(2):  # the second time every piece is known
        prompts = [store.render(c) for c in convs]
        ids, starts, texts = store.encode([p if p is not None else tmpl.render_pieces(c)
                                           for p, c in zip(prompts, convs)], replies)
        assert [a.tolist() for a in texts] == [tok.encode(r) for r in replies]
        for c, a, s in zip(convs, ids, starts):
            w_ids, w_starts = whole(tok, tmpl.render_pieces(c))
            assert a.tolist() == w_ids and s == w_starts


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
@settings(max_examples=300, deadline=None)
@given(left=st.one_of(contents, st.sampled_from(["<|start_header_id|>assistant<|end_header_id|>\n\n",
                                                 "<|im_start|>user\n", "user: ", "\n\n", "x<|eot_id|>"])),
       right=contents)
def test_joins_only_where_the_ids_simply_concatenate(tokenizer, left, right):
    tok = get_tokenizer(tokenizer, BUILTIN["llama3"].special_tokens + BUILTIN["chatml"].special_tokens)
    plain = max(tok.encode(right), default=-1) < tok.first_special_id  # what the store passes
    for known_plain in {False, plain}:
        if tok.joins(left, right, right_plain=known_plain):
            assert tok.encode(left + right) == tok.encode(left) + tok.encode(right)


def test_joins_after_newlines_needs_no_pattern_match():
    """After a template text ending in newlines, a reply starting with a visible ASCII character
    joins (what joins answers without compiling the pattern) as the pattern says it does."""
    tok = get_tokenizer("cl100k_base", BUILTIN["llama3"].special_tokens + BUILTIN["chatml"].special_tokens)
    for first in map(chr, range(33, 127)):
        for run in ("\n", "\n\n", "\n\n\n"):
            assert tok._run_joins(run, first), (run, first)  # the pattern's answer
        for name in ("llama3", "chatml"):
            before = BUILTIN[name].local.parts("assistant", "x")[0]  # the template text before a reply
            assert tok.joins(before, first + "x", right_plain=True)


def test_a_reply_repeated_in_the_next_turn_is_not_tokenized_again(monkeypatch):
    tmpl = BUILTIN["llama3"]
    tok = get_tokenizer("cl100k_base", tmpl.special_tokens)
    specials = cut_strings(tok)
    store = MessageTokens(tok, tmpl.local, specials, PieceEncoder(tok, specials))
    reply = "Sure. The cache holds 42 blocks, each of 16 tokens."
    store.encode([store.render([("user", "How big is the cache?")])], [reply])
    encoded: list[str] = []
    real = type(tok).encode_arrays
    monkeypatch.setattr(type(tok), "encode_arrays", lambda self, texts: encoded.extend(texts) or real(self, texts))
    conv = [("user", "How big is the cache?"), ("assistant", reply), ("user", "Thanks")]
    (ids,), _, _ = store.encode([store.render(conv)])
    assert ids.tolist() == tok.encode(tmpl.render(conv).text)
    assert not any(reply in text for text in encoded)


# -- the token scanner's string skipping ---------------------------------------------------
def words_of(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    from kvsim.io.readers.token_scan import as_words

    buf = np.frombuffer(data, np.uint8)
    return buf, as_words(buf)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from([b"a", b'"', b"\\", b"{", b"}", b"[", b"]", b",", b" ", b"plain text",
                                  "\u00e9".encode()]), max_size=40).map(b"".join), st.integers(0, 79))
def test_eight_byte_skipping_equals_the_byte_by_byte_scanner(data, start):
    from kvsim.io.readers.token_scan import _skip_string, _skip_value

    data = b'"' + data if not data.startswith(b'"') else data
    buf, words = words_of(data)
    end = len(buf)
    assert _skip_string(buf, words, 0, end) == _skip_string(buf, None, 0, end)
    start = min(start, end)
    assert _skip_value(buf, words, start, end) == _skip_value(buf, None, start, end)


# -- whole logs --------------------------------------------------------------------------------
def multi_turn_log(path: Path, sessions: int = 5, turns: int = 4) -> Path:
    rng = np.random.default_rng(7)
    words = ["the", "cache", " ", "\n", "blocks", "é", "🙂", "<|eot_id|>", "'s", "42", "  ", "<|im_end|>", "[INST]"]
    lines = []
    for s in range(sessions):
        history = [{"role": "system", "content": "Be brief. " * int(rng.integers(1, 20))}]
        for k in range(turns):
            history.append({"role": "user", "content": "".join(rng.choice(words, int(rng.integers(0, 30))))})
            reply = "".join(rng.choice(words, int(rng.integers(0, 30))))
            lines.append({"messages": list(history), "response": reply, "session_id": f"s{s}", "timestamp": k,
                          "arrival_step": 3 * k + s})
            history.append({"role": "assistant", "content": reply if k % 3 else f" {reply} "})
    path.write_text("".join(json.dumps(x, ensure_ascii=bool(i % 2)) + "\n" for i, x in enumerate(lines)))
    return path


@pytest.fixture(scope="module")
def jinja_templates(tmp_path_factory):
    pytest.importorskip("jinja2")
    folder = tmp_path_factory.mktemp("templates")
    out = {}
    for name, source in JINJA.items():
        (folder / f"{name}.jinja").write_text(source)
        out[name] = str(folder / f"{name}.jinja")
    return out


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
@pytest.mark.parametrize("name", TEMPLATES)
def test_fast_read_log_equals_whole_prompt_reading(tmp_path, jinja_templates, name, tokenizer):
    path = multi_turn_log(tmp_path / "chat.jsonl")
    tmpl = jinja_templates.get(name, name)
    fast = outcome(path, fast=True, tokenizer=tokenizer, chat_template=tmpl)
    slow = outcome(path, fast=False, piecewise=False, tokenizer=tokenizer, chat_template=tmpl)
    assert_same_trace(fast, slow)


@pytest.mark.parametrize("name", LOCAL)
def test_compiled_gathering_equals_numpy_gathering(tmp_path, monkeypatch, name):
    import kvsim.io.tokenize.message_tokens as mt

    path = multi_turn_log(tmp_path / "chat.jsonl", sessions=8, turns=5)
    traces = []
    for threshold in (0, 1 << 62):  # every batch compiled / none
        monkeypatch.setattr(mt, "COMPILED_GATHER_TOKENS", threshold)
        traces.append(outcome(path, fast=True, chat_template=name))
    assert_same_trace(*traces)
    assert traces[0].msg_starts.size > 0  # messages were recorded


# -- fuzzing: the fast path against the general reader on the same bytes -----------------------
MESSAGE_KEYS = ['"messages"', '"messag\\u0065s"', '"role"', '"content"']
JSONISH = '{}[]",:0123456789 \t\\u_rolecntsmag\xe9'


@st.composite
def chat_lines(draw):
    """A chat JSON line: odd spacing, messages maybe repeated, escaped, not objects, or with a
    few bytes edited."""
    msgs = draw(st.lists(st.one_of(
        st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", ""]), "content": contents}),
        st.fixed_dictionaries({"role": st.just("user"), "content": st.one_of(st.none(), st.integers(),
                                                                               st.lists(st.text(max_size=3)))}),
        st.sampled_from(["hi", 3, None, {"role": "user"}, {"role": "assistant", "content": None,
                                                           "tool_calls": [{"id": "1"}]}])), max_size=4))
    members = [('"messages"', json.dumps(msgs, ensure_ascii=draw(st.booleans())))]
    for key, value in draw(st.lists(st.sampled_from([("response", '"fine"'), ("session_id", '"s1"'),
                                                     ("timestamp", "1.5"), ("max_tokens", "-1"),
                                                     ("user", "3"), ("arrival_step", "4"),
                                                     ("arrival_step", "-2")]), max_size=3)):
        members.append((f'"{key}"', value))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1]))):
        members.append((draw(st.sampled_from(MESSAGE_KEYS)), json.dumps(msgs[:1])))
    draw(st.randoms()).shuffle(members)
    space = st.sampled_from(["", "", " ", "\t"])
    text = "{" + ",".join(f"{draw(space)}{k}{draw(space)}:{draw(space)}{v}" for k, v in members) + "}"
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        pos = draw(st.integers(0, len(text)))
        text = text[:pos] + draw(st.text(st.sampled_from(JSONISH), max_size=3)) + text[pos + draw(st.integers(0, 3)):]
    return text.encode("utf-8", "surrogatepass")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(st.one_of(chat_lines(), st.sampled_from([b"", b" ", b"\xff", b"\xef\xbb\xbf{"])),
                      min_size=1, max_size=5),
       template=st.sampled_from(list(BUILTIN)), on_error=st.sampled_from(["fail", "skip"]),
       limit=st.sampled_from([None, None, 2]), gz=st.booleans())
def test_fast_path_and_general_reader_agree_on_any_bytes(lines, template, on_error, limit, gz):
    first = b'{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]}'
    data = b"\n".join([first, *lines]) + b"\n"
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / ("log.jsonl.gz" if gz else "log.jsonl")
        path.write_bytes(gzip.compress(data) if gz else data)
        kw = dict(format="chat", tokenizer="bytes", chat_template=template, on_error=on_error, limit=limit)
        fast, general = outcome(path, fast=True, **kw), outcome(path, fast=False, piecewise=False, **kw)
        if isinstance(fast, str) or isinstance(general, str):
            assert fast == general
        else:
            assert_same_trace(fast, general)


# -- multi-turn logs whose lines the fast path does not all take ---------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns=st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["plain", "plain", "parts", "bad", "odd"])),
                      min_size=1, max_size=12),
       held=st.sampled_from([None, 1, 400]), template=st.sampled_from(LOCAL))
def test_history_found_again_when_lines_in_between_are_read_otherwise(turns, held, template):
    """Sessions whose turns are sometimes read by the general reader (a message that is not the
    plain case, a bad record skipped, an unusual field) and a reader that forgets what it holds
    (``held``, in batches of two requests): the turn before is then not one the fast path kept,
    and the line's messages are looked up one by one. Same trace as the general reader."""
    import kvsim.io.readers.chat as chat_reader

    histories: dict[int, list] = {}
    lines = []
    for k, (session, kind) in enumerate(turns):
        history = histories.setdefault(session, [{"role": "system", "content": f"Be brief, {session}."}])
        content = [{"type": "text", "text": f"q{k}"}] if kind == "parts" else f"question {k}"
        history.append({"role": "user", "content": content})
        record = {"messages": list(history), "response": f"answer {k}", "session_id": f"s{session}"}
        if kind == "bad":
            record["max_tokens"] = -1
        if kind == "odd":
            record["tenant"] = f"t{k % 2}"
        lines.append(json.dumps(record))
        history.append({"role": "assistant", "content": f"answer {k}"})
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "log.jsonl"
        path.write_text("\n".join(lines) + "\n")
        kw = dict(format="chat", tokenizer="bytes", chat_template=template, on_error="skip")
        with pytest.MonkeyPatch.context() as mp:
            if held is not None:
                mp.setattr(chat_reader, "MAX_HELD_CHARS", held)
                mp.setattr(ChatReader, "batch_requests", 2)
            fast = outcome(path, fast=True, **kw)
        general = outcome(path, fast=False, piecewise=False, **kw)
        assert_same_trace(fast, general)
