"""Chat prompts tokenized piece by piece (each distinct piece once) give exactly the tokens
and message starts of rendering and tokenizing each whole prompt, for every template."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvsim
import kvsim.errors
from kvsim.io.tokenize.pieces import PieceEncoder, cut_strings, overlap_free
from kvsim.io.readers.base import LoadContext
from kvsim.io.tokenize.templates import BUILTIN, get_template
from kvsim.io.tokenize.tokenizers import get_tokenizer
from test_io_fuzz import VALID as FUZZ_VALID
from trace_equal import assert_same_trace

jinja2 = pytest.importorskip("jinja2")

# Jinja templates: the Llama 3 template as Hugging Face ships it, and templates whose
# rendering of a message depends on its position or joins messages with plain text.
LLAMA3_HF = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
    "<|end_header_id|>\n\n' }}{% endif %}")
POSITIONAL = (  # the first message is marked, the last user turn gets a reminder, odd turns differ
    "{{ bos_token }}{% for m in messages %}{% if loop.first %}<|im_start|>first {{ m['role'] }}\n"
    "{% elif loop.index0 % 2 %}<|im_start|>{{ m['role'] | upper }}\n{% else %}<|im_start|>{{ m['role'] }}\n"
    "{% endif %}{{ m['content'] }}{% if loop.last and m['role'] == 'user' %} (answer briefly){% endif %}"
    "<|im_end|>{% if not loop.last %}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PLAIN_JOINS = (  # no special token between messages: pieces must be tokenized together
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% if not loop.last %} | {% endif %}"
    "{% endfor %}{% if add_generation_prompt %} => {% endif %}")
GLUED = "{% for m in messages %}{{ m['content'] }}{% endfor %}"  # words run across messages
JINJA = {"llama3-hf": LLAMA3_HF, "positional": POSITIONAL, "plain-joins": PLAIN_JOINS, "glued": GLUED}


@pytest.fixture(scope="module")
def templates(tmp_path_factory):
    """Every template under test by name (the Jinja ones written to files)."""
    folder = tmp_path_factory.mktemp("templates")
    out = dict(BUILTIN)
    for name, source in JINJA.items():
        (folder / f"{name}.jinja").write_text(source)
        out[name] = get_template(str(folder / f"{name}.jinja"))
    return out


TEMPLATES = [*BUILTIN, *JINJA]
TOKENIZERS = ["cl100k_base", "bytes"]

contents = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", " ", "\n\n", "  padded  ", "Hi", "<|eot_id|>", "a<|im_end|>b", "[INST]", "</s>",
                     "x\n", "\ud83d", "\ude00", "é 漢字 🙂", " Hello", "Hello ", "\t\r\n", "<|", "|>", "<s"]),
    st.lists(st.sampled_from(["word", " ", "\n", "<|eot_id|>", "<|im_start|>", "[/INST]", "'s", "123", "🙂",
                              "<|", "eot_id|>", "ing", "4"]), max_size=6).map("".join))
messages = st.lists(st.tuples(st.sampled_from(["system", "user", "assistant", "tool"]), contents),
                    min_size=1, max_size=6)


def whole(tok, rendered):
    text = rendered.joined()
    ids, starts = tok.encode_with_starts([text.text], [text.message_starts_chars])
    return ids[0], starts[0]


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
@pytest.mark.parametrize("name", TEMPLATES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(convs=st.lists(messages, min_size=1, max_size=4))
def test_pieces_equal_whole_prompt_encoding(templates, name, tokenizer, convs):
    tmpl = templates[name]
    tok = get_tokenizer(tokenizer, tmpl.special_tokens)
    specials = cut_strings(tok)
    assert specials is not None
    enc = PieceEncoder(tok, specials)
    rendered = []
    for msgs in convs:
        try:
            rendered.append(tmpl.render_pieces(msgs))
        except Exception:  # a Jinja template may refuse some conversations
            continue
    ids, starts, _ = enc.encode(rendered)
    ids2, starts2, extra = enc.encode(rendered, ["some other text"])  # now every piece is cached
    assert [a.tolist() for a in extra] == [tok.encode("some other text")]
    for r, a, s, a2, s2 in zip(rendered, ids, starts, ids2, starts2):
        w_ids, w_starts = whole(tok, r)
        assert a.tolist() == w_ids and a2.tolist() == w_ids
        assert s == w_starts and s2 == w_starts


def test_multi_turn_prompts_reuse_pieces():
    """Turn k+1 resends turn k's messages: only the new messages are tokenized."""
    tmpl = get_template("llama3")
    tok = get_tokenizer("cl100k_base", tmpl.special_tokens)
    enc = PieceEncoder(tok, cut_strings(tok))
    history = [("system", "You are terse. " * 20)]
    for k in range(5):
        history.append(("user", f"question {k}"))
        enc.encode([tmpl.render_pieces(history)])
        history.append(("assistant", f"answer {k}"))
    # BOS, the generation prompt, the system message, 5 questions and the 4 answers resent
    # in later turns: each piece once
    assert len(enc.cache) == 2 + 1 + 5 + 4


def test_overlap_free():
    assert overlap_free(("<|eot_id|>", "<|start_header_id|>", "<s>", "</s>", "[INST]", "[/INST]"))
    assert not overlap_free(("ab", "bc"))      # "abc": one ends with the start of the other
    assert not overlap_free(("<s>", "x<s>y"))  # one inside the other
    assert not overlap_free(("aa",))           # "aaa" overlaps itself


def test_tokenizer_without_simple_cuts_tokenizes_whole_prompts(tmp_path):
    tk = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    t = tk.Tokenizer(models.WordLevel({"[UNK]": 0, "hi": 1}, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.save(str(tmp_path / "tokenizer.json"))
    assert cut_strings(get_tokenizer(f"hf:{tmp_path}", ("<|eot_id|>",))) is None


# -- whole logs: the piecewise reader against the whole-prompt reader --------------------------
def chat_log(path, sessions: int = 6, turns: int = 5):
    rng = np.random.default_rng(3)
    words = ["the", "cache", " ", "\n", "blocks", "é", "🙂", "<|eot_id|>", "'s", "42", "  "]
    lines = []
    for s in range(sessions):
        history = [{"role": "system", "content": "Be brief. " * int(rng.integers(1, 30))}]
        for k in range(turns):
            history.append({"role": "user", "content": "".join(rng.choice(words, int(rng.integers(0, 40))))})
            reply = "".join(rng.choice(words, int(rng.integers(1, 40))))
            lines.append({"messages": list(history), "response": reply, "session_id": f"s{s}"})
            history.append({"role": "assistant", "content": reply})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.mark.parametrize("tokenizer", TOKENIZERS)
@pytest.mark.parametrize("name", TEMPLATES)
def test_chat_log_reads_the_same_piecewise_and_whole(tmp_path, monkeypatch, templates, name, tokenizer):
    path = chat_log(tmp_path / "chat.jsonl")
    tmpl = templates[name].name
    fast = kvsim.load_trace(path, tokenizer=tokenizer, chat_template=tmpl)
    monkeypatch.setattr(LoadContext, "piecewise", False)
    slow = kvsim.load_trace(path, tokenizer=tokenizer, chat_template=tmpl)
    assert_same_trace(fast, slow)
    assert fast.msg_offsets is not None and len(fast.msg_starts) == len(slow.msg_starts)


def test_sharegpt_reads_the_same_piecewise_and_whole(tmp_path, monkeypatch):
    recs = [{"id": f"c{i}", "conversations": [{"from": "system", "value": "sys"},
                                              {"from": "human", "value": f"q{i}"},
                                              {"from": "gpt", "value": f"a{i} " * i},
                                              {"from": "human", "value": "more"},
                                              {"from": "gpt", "value": "done"}]} for i in range(5)]
    path = tmp_path / "sg.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    fast = kvsim.load_trace(path, chat_template="mistral")
    monkeypatch.setattr(LoadContext, "piecewise", False)
    assert_same_trace(fast, kvsim.load_trace(path, chat_template="mistral"))


# -- fuzzing: random chat and ShareGPT records, read both ways ---------------------------------
def _outcome(path, **kw):
    try:
        return kvsim.load_trace(path, **kw)
    except kvsim.errors.KvsimError as e:
        return str(e)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(records=st.lists(st.one_of(*(FUZZ_VALID[k] for k in ("chat", "sharegpt"))), min_size=1, max_size=4),
       name=st.sampled_from(list(BUILTIN)), tokenizer=st.sampled_from(TOKENIZERS),
       on_error=st.sampled_from(["fail", "skip"]))
def test_random_chat_records_read_the_same_piecewise_and_whole(tmp_path_factory, records, name, tokenizer,
                                                                on_error):
    path = tmp_path_factory.mktemp("fuzz") / "log.jsonl"
    path.write_bytes("".join(json.dumps(r) + "\n" for r in records).encode("utf-8", "surrogatepass"))
    kw = dict(chat_template=name, tokenizer=tokenizer, on_error=on_error)
    fast = _outcome(path, **kw)
    LoadContext.piecewise = False
    try:
        whole = _outcome(path, **kw)
    finally:
        LoadContext.piecewise = True
    if isinstance(fast, str) or isinstance(whole, str):
        assert fast == whole
    else:
        assert_same_trace(fast, whole)
