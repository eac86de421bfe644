"""Chat templates: the built-ins render exactly what the models' Hugging Face templates render."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.errors import ConfigError
from kvsim.io.tokenize.templates import BUILTIN, get_template, render_chat

jinja2 = pytest.importorskip("jinja2")

# The chat templates shipped with the models (tokenizer_config.json "chat_template").
LLAMA3_HF = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
    "<|end_header_id|>\n\n' }}{% endif %}"
)
MISTRAL_V01_HF = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}"
)
# Qwen2-style ChatML without the default system prompt.
CHATML_HF = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)


def hf_render(source: str, messages, bos: str = "", eos: str = "") -> str:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(source).render(messages=[{"role": r, "content": c} for r, c in messages],
                                          add_generation_prompt=True, bos_token=bos, eos_token=eos)


CONV = [("system", "You are terse."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "  padded  ")]


def test_llama3_exact_text():
    text = render_chat(CONV, "llama3").text
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\npadded<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_chatml_exact_text():
    assert render_chat(CONV[1:3], "chatml").text == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>assistant\n")


def test_mistral_exact_text_and_system_folded_into_first_user_turn():
    assert render_chat(CONV[1:], "mistral").text == "<s>[INST] Hi [/INST]Hello!</s>[INST]   padded   [/INST]"
    assert render_chat(CONV[:2], "mistral").text == "<s>[INST] You are terse.\n\nHi [/INST]"


def test_plain_text():
    assert render_chat(CONV[1:3], "plain").text == "user: Hi\n\nassistant: Hello!\n\nassistant: "


@pytest.mark.parametrize("name", list(BUILTIN))
def test_message_starts_point_at_each_message(name):
    r = render_chat(CONV, name)
    assert r.roles == [role for role, _ in CONV]
    assert r.message_starts_chars[0] == 0
    assert r.message_starts_chars == sorted(r.message_starts_chars)
    for (role, content), start, nxt in zip(CONV, r.message_starts_chars, r.message_starts_chars[1:] + [len(r.text)]):
        assert content.strip() in r.text[start:nxt]


texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)
alternating = st.lists(st.tuples(texts, texts), min_size=1, max_size=4).map(
    lambda pairs: [m for u, a in pairs for m in (("user", u), ("assistant", a))][:-1])


@settings(max_examples=60, deadline=None)
@given(system=st.one_of(st.none(), texts), conv=alternating)
def test_builtins_match_the_hf_jinja_templates(system, conv):
    """Differential: the built-in renderers equal jinja2 running the models' own templates."""
    msgs = ([("system", system)] if system is not None else []) + conv
    assert render_chat(msgs, "llama3").text == hf_render(LLAMA3_HF, msgs, bos="<|begin_of_text|>")
    assert render_chat(msgs, "chatml").text == hf_render(CHATML_HF, msgs)
    # the v0.1 Mistral template has no system role and no generation prompt
    assert render_chat(conv, "mistral").text == hf_render(MISTRAL_V01_HF, conv, bos="<s>", eos="</s>")


def test_jinja_file_template(tmp_path):
    path = tmp_path / "llama3.jinja"
    path.write_text(LLAMA3_HF)
    tmpl = get_template(str(path))
    assert "<|eot_id|>" in tmpl.special_tokens and tmpl.eot == "<|eot_id|>"
    r = render_chat(CONV, tmpl)
    assert r.text == hf_render(LLAMA3_HF, CONV)  # no bos_token known from a bare .jinja file
    builtin = render_chat(CONV, "llama3")
    offset = len("<|begin_of_text|>")
    assert [s + offset for s in r.message_starts_chars[1:]] == builtin.message_starts_chars[1:]


def test_tokenizer_config_json_template(tmp_path):
    cfg = {"chat_template": LLAMA3_HF, "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
           "added_tokens_decoder": {"128000": {"content": "<|begin_of_text|>", "special": True}}}
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps(cfg))
    tmpl = get_template(str(path))
    assert render_chat(CONV, tmpl).text == render_chat(CONV, "llama3").text
    assert tmpl.bos == "<|begin_of_text|>" and tmpl.eot == "<|eot_id|>"


def test_unknown_template_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown chat template"):
        get_template("no-such-template")
