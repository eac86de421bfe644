"""kvsim generate --format tokens: the tokenized form of the same chat log."""
from __future__ import annotations

import itertools
import json

import pytest

from kvsim.cli import run
from kvsim.io.tokenize.templates import get_template, render_chat
from kvsim.io.tokenize.tokenizers import get_tokenizer

CASES = {
    "support_chat": ["--sessions", "4", "--turns", "3"],
    "multi_tenant": ["--requests", "8", "--system-tokens", "80"],
    "multi_lora": ["--requests", "8", "--system-tokens", "60"],
}


def pair(tmp_path, name: str, *extra: str) -> tuple[list[dict], list[dict]]:
    chat, tokens = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.tokens.jsonl"
    assert run(["generate", name, "-o", str(chat), *CASES[name], *extra]) == 0
    assert run(["generate", name, "-o", str(tokens), "--format", "tokens", *CASES[name], *extra]) == 0
    load = lambda p: [json.loads(line) for line in p.read_text().splitlines()]
    return load(chat), load(tokens)


@pytest.mark.parametrize("name", list(CASES))
def test_tokens_file_is_the_rendered_chat_log_tokenized(tmp_path, name):
    chat, tokens = pair(tmp_path, name)
    template = get_template("llama3")
    tok = get_tokenizer("cl100k_base", template.special_tokens)
    assert len(chat) == len(tokens)
    for c, t in zip(chat, tokens):
        assert tok.decode(t["prompt_token_ids"]) == render_chat(c["messages"], "llama3").text
        assert t["prompt_token_ids"][:1] == [tok.special_token_ids["<|begin_of_text|>"]]
        assert tok.decode(t["output_token_ids"]) == c["response"] + "<|eot_id|>"
        assert t["output_length"] == len(t["output_token_ids"]) == c["output_length"]
        for key in ("timestamp", "tenant", "cache_salt", "lora", "session_id", "request_id"):
            assert t.get(key) == c.get(key)
        assert "messages" not in t and "response" not in t


def test_next_turn_starts_with_previous_prompt_and_its_output_tokens(tmp_path):
    """With llama3 + cl100k, turn t+1's prompt = turn t's prompt + generated tokens + more:
    a multi-turn conversation can reuse the cached output blocks too."""
    _, tokens = pair(tmp_path, "support_chat")
    by_session: dict[str, list[dict]] = {}
    for t in tokens:
        by_session.setdefault(t["session_id"], []).append(t)
    checked = 0
    for turns in by_session.values():
        for prev, nxt in itertools.pairwise(turns):
            head = prev["prompt_token_ids"] + prev["output_token_ids"]
            assert nxt["prompt_token_ids"][:len(head)] == head
            checked += 1
    assert checked > 0


def test_other_tokenizer_and_template(tmp_path):
    chat, tokens = pair(tmp_path, "support_chat", "--tokenizer", "bytes", "--chat-template", "chatml")
    for c, t in zip(chat, tokens):
        text = render_chat(c["messages"], "chatml").text
        assert get_tokenizer("bytes", get_template("chatml").special_tokens).decode(t["prompt_token_ids"]) == text
        assert t["output_length"] == c["output_length"]


@pytest.mark.parametrize("name", list(CASES))
def test_load_trace_reads_both_formats_alike(tmp_path, name):
    """kvsim.load_trace gives the same prompts, outputs and labels for the two files, and
    finds the chat log's output lengths consistent with its replies."""
    import numpy as np

    try:
        from kvsim.io.load import load_trace
    except ImportError:
        pytest.skip("kvsim.io.load is not in this checkout yet")
    pair(tmp_path, name)
    a = load_trace(tmp_path / f"{name}.jsonl")
    b = load_trace(tmp_path / f"{name}.tokens.jsonl")
    assert not [n for n in a.meta.notes if n.startswith("output length")]
    assert np.array_equal(a.offsets, b.offsets) and np.array_equal(a.tokens, b.tokens)
    assert np.array_equal(a.output_lengths, b.output_lengths)
    assert np.array_equal(a.arrival, b.arrival)
    for i in range(len(a)):
        assert np.array_equal(a.output(i), b.output(i))
        for col in ("tenant", "cache_salt", "lora", "session"):
            assert a.name_of(col, getattr(a, col)[i]) == b.name_of(col, getattr(b, col)[i])
