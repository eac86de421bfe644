"""Text and token formats: chat, completion, tokens, ShareGPT, Azure CSV; gzip; detection."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

import kvsim
from kvsim.errors import ConfigError, KvsimError
from kvsim.io.tokenize.templates import get_template, render_chat
from kvsim.io.tokenize.tokenizers import get_tokenizer

PUBLIC = Path(__file__).resolve().parents[1] / "traces" / "public"
SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 8}


def write_jsonl(path: Path, records, gz: bool = False) -> Path:
    data = "".join(json.dumps(r) + "\n" for r in records).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def conversation(turns: int = 3) -> list[dict]:
    """One chat session logged turn by turn, each with its reply."""
    recs, history = [], [SYSTEM]
    for k in range(turns):
        history = history + [{"role": "user", "content": f"Question number {k}: why is the sky blue?"}]
        reply = " ".join([f"Answer {k}: Rayleigh scattering, mostly."] * (k + 1))
        recs.append({"messages": history, "response": reply, "timestamp": 100.0 + k, "session_id": "s1",
                     "user": "alice", "request_id": f"r{k}"})
        history = history + [{"role": "assistant", "content": reply}]
    return recs


@pytest.mark.parametrize("template", ["llama3", "chatml", "mistral"])
def test_chat_turns_line_up_with_prompt_plus_output(tmp_path, template):
    """Turn k+1's prompt starts with turn k's prompt + its output (reply + end-of-turn)."""
    recs = conversation()
    t = kvsim.load_trace(write_jsonl(tmp_path / "chat.jsonl", recs), chat_template=template)
    tmpl = get_template(template)
    tok = get_tokenizer("cl100k_base", tmpl.special_tokens)
    assert t.meta.formats == ["chat"] and t.meta.chat_template == template
    for i, rec in enumerate(recs):
        assert tok.decode(t.prompt(i).tolist()) == render_chat(rec["messages"], template).text
        out = t.output(i)
        assert out[-1] == tok.special_token_ids[tmpl.eot]
        assert t.output_lengths[i] == len(out)
    for i in range(len(recs) - 1):
        head = np.concatenate([t.prompt(i), t.output(i)])
        assert np.array_equal(t.prompt(i + 1)[:len(head)], head)


def test_chat_fields(tmp_path):
    recs = [
        {"messages": [{"role": "user", "content": "a"}], "timestamp": "2024-05-01T00:00:01Z",
         "tenant": "acme", "cache_salt": "salt-1", "lora": "sql", "max_tokens": 40, "prompt_logprobs": 1,
         "id": "req-a"},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "b"}, {"type": "text", "text": "c"}]}],
         "timestamp": 1714521601.5, "user": "bob", "lora_name": "sql", "output_tokens": 17},
        {"messages": [{"role": "user", "content": "d"}], "lora_request": {"lora_name": "chat"},
         "response": {"choices": [{"message": {"role": "assistant", "content": "ok"}}],
                      "usage": {"completion_tokens": 9}}},
        {"messages": [{"role": "user", "content": "e"}], "output_token_ids": [5, 6, 7], "session_id": 12},
        {"messages": [{"role": "user", "content": "f"}]},
    ]
    t = kvsim.load_trace(write_jsonl(tmp_path / "chat.jsonl", recs))
    assert t.arrival[0] == 1714521601.0 and t.arrival[1] == 1714521601.5 and np.isnan(t.arrival[2])
    assert [t.name_of("tenant", c) for c in t.tenant] == ["acme", "bob", None, None, None]
    assert [t.name_of("cache_salt", c) for c in t.cache_salt] == ["salt-1", None, None, None, None]
    assert [t.name_of("lora", c) for c in t.lora] == ["sql", "sql", "chat", None, None]
    assert t.name_of("session", t.session[3]) == "12"
    assert t.prompt_logprobs.tolist() == [True, False, False, False, False]
    assert [t.request_id(i) for i in range(5)] == ["req-a", "1", "2", "3", "4"]
    # output length: max_tokens, logged, usage (reply known), ids, default 1
    assert t.output_lengths.tolist() == [40, 17, 9, 3, 1]
    assert t.output_known.tolist() == [False, False, True, True, False]
    assert t.output(3).tolist() == [5, 6, 7]
    assert any("1 request(s) without a logged output length or reply used max_tokens; 1 had neither" in n
               for n in t.meta.notes)
    tok = get_tokenizer("cl100k_base", get_template("llama3").special_tokens)
    assert "b\nc" in tok.decode(t.prompt(1).tolist())  # text parts joined with a newline
    # message spans: one user message, starting at token 0
    assert t.msg_offsets.tolist() == [0, 1, 2, 3, 4, 5] and set(t.msg_starts.tolist()) == {0}
    assert t.role_names == ["user"]


def test_logprob_fields(tmp_path):
    """What each engine makes of a record's logprob arguments (vLLM: skip the cache read;
    SGLang: cap the match at logprob_start_len)."""
    msg = [{"role": "user", "content": "hello there"}]
    recs = [
        {"prompt_token_ids": [1, 2, 3], "prompt_logprobs": 0},            # vLLM: 0 is not None
        {"prompt_token_ids": [1, 2, 3], "prompt_logprobs": False},
        {"prompt_token_ids": [1, 2, 3], "logprob_start_len": 2},           # SGLang native
        {"prompt_token_ids": [1, 2, 3], "logprob_start_len": 2, "return_logprob": False},
        {"prompt_token_ids": [1, 2, 3], "logprob_start_len": -1, "return_logprob": True},
        {"prompt_token_ids": [1, 2, 3], "prompt_logprobs": 5, "logprob_start_len": 1},
    ]
    t = kvsim.load_trace(write_jsonl(tmp_path / "tok.jsonl", recs))
    assert t.prompt_logprobs.tolist() == [True, False, False, False, False, True]
    assert t.logprob_start_len.tolist() == [0, -1, 2, -1, -1, 1]
    chat = [{"messages": msg, "logprob_start_len": 4},
            {"messages": msg, "echo": True, "top_logprobs": 2},              # vLLM only: SGLang chat uses -1
            {"messages": msg, "prompt_logprobs": True}]
    t = kvsim.load_trace(write_jsonl(tmp_path / "chat.jsonl", chat))
    assert t.prompt_logprobs.tolist() == [False, True, True]
    assert t.logprob_start_len.tolist() == [4, -1, 0]
    comp = [{"prompt": "a b c", "echo": True, "logprobs": 1},
            {"prompt": "a b c", "echo": True, "logprobs": 0},               # SGLang: 0 is falsy, no cap
            {"prompt": "a b c", "logprobs": 3}]                             # output logprobs only
    t = kvsim.load_trace(write_jsonl(tmp_path / "comp.jsonl", comp))
    assert t.prompt_logprobs.tolist() == [True, True, False]
    assert t.logprob_start_len.tolist() == [0, -1, -1]
    for bad in (-2, 1.5, "3", True):
        path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt_token_ids": [1, 2], "logprob_start_len": bad}])
        with pytest.raises(KvsimError, match="logprob_start_len must be an integer >= -1"):
            kvsim.load_trace(path)


def test_message_spans_in_tokens(tmp_path):
    recs = conversation(2)
    t = kvsim.load_trace(write_jsonl(tmp_path / "chat.jsonl", recs[1:]))
    tok = get_tokenizer("cl100k_base", get_template("llama3").special_tokens)
    starts = t.msg_starts[t.msg_offsets[0]:t.msg_offsets[1]]
    roles = [t.role_names[r] for r in t.msg_roles[t.msg_offsets[0]:t.msg_offsets[1]]]
    assert roles == ["system", "user", "assistant", "user"]
    p = t.prompt(0)
    assert starts[0] == 0
    for s in starts[1:]:
        assert p[s] == tok.special_token_ids["<|start_header_id|>"]


def test_completion_prompts_get_the_template_bos(tmp_path):
    log = write_jsonl(tmp_path / "c.jsonl", [{"prompt": "hello world", "output": " again", "model": "m"},
                                             {"prompt": [1, 2, 3], "max_tokens": 4}])
    t = kvsim.load_trace(log)
    tok = get_tokenizer("cl100k_base", get_template("llama3").special_tokens)
    assert t.meta.formats == ["completion"]
    assert t.prompt(0).tolist() == [tok.special_token_ids["<|begin_of_text|>"], 15339, 1917]
    assert t.output(0).tolist() == tok.encode(" again")  # no end-of-turn for completions
    assert t.prompt(1).tolist() == [1, 2, 3] and t.output_lengths[1] == 4
    assert kvsim.load_trace(log, chat_template="chatml").prompt(0).tolist() == [15339, 1917]


def test_tokens_format(tmp_path):
    recs = [{"prompt_token_ids": [1, 2, 3], "output_token_ids": [4, 5], "timestamp": 1.5, "cache_salt": "s",
             "lora": "a", "tenant": "t", "session_id": "x", "request_id": "q"},
            {"prompt_token_ids": [2**40, 7], "output_length": 3}]
    t = kvsim.load_trace(write_jsonl(tmp_path / "t.jsonl", recs))
    assert t.meta.formats == ["tokens"] and t.meta.tokenizer is None
    assert t.tokens.dtype == np.int64 and t.prompt(1).tolist() == [2**40, 7]
    assert t.output(0).tolist() == [4, 5] and t.output(1) is None
    assert t.output_lengths.tolist() == [2, 3]
    assert t.request_id(0) == "q" and t.name_of("lora", t.lora[0]) == "a"


def test_sharegpt_expands_assistant_turns(tmp_path):
    rec = {"id": "conv1", "conversations": [
        {"from": "system", "value": "Be brief."}, {"from": "human", "value": "Hi"},
        {"from": "gpt", "value": "Hello!"}, {"from": "human", "value": "Bye"}, {"from": "gpt", "value": "Bye!"}]}
    rec2 = {"conversations": [{"from": "human", "value": "Q"}, {"from": "gpt", "value": "A"}]}
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([rec, rec2], indent=2))  # a JSON array, as ShareGPT ships
    t = kvsim.load_trace(path)
    assert t.meta.formats == ["sharegpt"] and len(t) == 3
    assert [t.name_of("session", s) for s in t.session] == ["conv1", "conv1", "sg.json:27"]  # file:line of the record
    assert [t.request_id(i) for i in range(3)] == ["conv1:2", "conv1:4", "2"]
    assert t.output_known.all()
    head = np.concatenate([t.prompt(0), t.output(0)])
    assert np.array_equal(t.prompt(1)[:len(head)], head)
    jsonl = write_jsonl(tmp_path / "sg.jsonl", [rec, rec2])
    u = kvsim.load_trace(jsonl)
    assert np.array_equal(u.tokens, t.tokens)


def test_azure_csv_has_no_prefix_information():
    t = kvsim.load_trace(PUBLIC / "AzureLLMInferenceTrace_code.csv")
    assert len(t) == 8_819 and t.tokens is None
    assert round(float(t.prompt_lengths.mean())) == 2_048 and round(float(t.output_lengths.mean())) == 28
    assert t.meta.formats == ["azure-csv"] and not t.meta.has_prefix_info
    assert any("NO prefix information" in n for n in t.meta.notes)
    assert 3400 < t.arrival[-1] - t.arrival[0] < 3500  # about 57-58 minutes
    with pytest.raises(KvsimError, match="no prefix information"):
        t.require_tokens("simulate")
    conv = kvsim.load_trace(PUBLIC / "AzureLLMInferenceTrace_conv.csv")
    assert len(conv) == 19_366 and round(float(conv.prompt_lengths.mean())) == 1_155


def test_azure_csv_cannot_be_mixed_with_token_traces(tmp_path):
    log = write_jsonl(tmp_path / "t.jsonl", [{"prompt_token_ids": [1]}])
    with pytest.raises(ConfigError, match="azure-csv"):
        kvsim.load_trace([PUBLIC / "AzureLLMInferenceTrace_code.csv", log])


def test_gzip_input_equals_plain(tmp_path):
    recs = conversation()
    plain = kvsim.load_trace(write_jsonl(tmp_path / "c.jsonl", recs))
    gz = kvsim.load_trace(write_jsonl(tmp_path / "c.jsonl.gz", recs, gz=True))
    assert np.array_equal(plain.tokens, gz.tokens) and np.array_equal(plain.output_tokens, gz.output_tokens)
    moon = gzip.compress((PUBLIC / "synthetic_trace.jsonl").read_bytes()[:200_000])
    (tmp_path / "s.jsonl.gz").write_bytes(moon)
    head = kvsim.load_trace(tmp_path / "s.jsonl.gz", on_error="skip")  # the cut last line is skipped
    ref = kvsim.load_trace(PUBLIC / "synthetic_trace.jsonl", limit=len(head))
    assert head.meta.skipped_lines == 1 and np.array_equal(head.tokens, ref.tokens)


def test_files_are_concatenated_with_per_file_detection(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", conversation(2))
    b = write_jsonl(tmp_path / "b.jsonl", [{"prompt_token_ids": [9, 9, 9]}])
    t = kvsim.load_trace([a, b])
    assert t.meta.formats == ["chat", "tokens"] and t.meta.source_requests == [2, 1]
    assert t.prompt(2).tolist() == [9, 9, 9]
    assert t.meta.sources == [str(a), str(b)]


def test_limit_and_forced_format(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", conversation(3))
    assert len(kvsim.load_trace(a, limit=2)) == 2
    assert len(kvsim.load_trace([a, a], limit=4)) == 4
    with pytest.raises(KvsimError, match="a.jsonl:1: missing prompt_token_ids"):
        kvsim.load_trace(a, format="tokens")


def test_mooncake_hash_ids_in_tokens_format_priority(tmp_path):
    """A record with both token ids and messages is read as the exact token ids."""
    log = write_jsonl(tmp_path / "x.jsonl", [{"prompt_token_ids": [1, 2], "messages": [{"role": "user", "content": "x"}]}])
    t = kvsim.load_trace(log)
    assert t.meta.formats == ["tokens"] and t.prompt(0).tolist() == [1, 2]


def test_bytes_tokenizer_and_plain_template(tmp_path):
    log = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "hé"}], "response": "ok"}])
    t = kvsim.load_trace(log, tokenizer="bytes", chat_template="plain")
    assert bytes(t.prompt(0).tolist()).decode() == "user: hé\n\nassistant: "
    assert t.output(0).tolist() == list(b"ok") and t.meta.tokenizer == "bytes"
