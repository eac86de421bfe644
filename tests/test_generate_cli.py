"""kvsim generate on the command line: files, formats, refusals."""
from __future__ import annotations

import gzip
import json

import pytest

from kvsim.cli import run

SMALL = ["--sessions", "3", "--turns", "3"]


def gen(tmp_path, name: str, *args: str) -> int:
    return run(["generate", *args] if name == "" else ["generate", name, *args])


def read_jsonl(path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_same_command_writes_identical_bytes(tmp_path):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    assert run(["generate", "support_chat", "-o", str(a), *SMALL]) == 0
    assert run(["generate", "support_chat", "-o", str(b), *SMALL]) == 0
    assert run(["generate", "support_chat", "-o", str(c), *SMALL, "--seed", "1"]) == 0
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_gzip_output_is_deterministic_and_matches_plain(tmp_path):
    plain, gz1, gz2 = tmp_path / "t.jsonl", tmp_path / "t1.jsonl.gz", tmp_path / "t2.jsonl.gz"
    for path in (plain, gz1, gz2):
        assert run(["generate", "rag", "-o", str(path), "--requests", "5", "--doc-tokens", "40"]) == 0
    assert gz1.read_bytes()[:2] == b"\x1f\x8b"
    assert gz1.read_bytes() == gz2.read_bytes()
    assert gzip.decompress(gz1.read_bytes()) == plain.read_bytes()


def test_refuses_to_overwrite_without_force(tmp_path, capsys):
    out = tmp_path / "x.jsonl"
    out.write_text("precious\n")
    assert run(["generate", "support_chat", "-o", str(out), *SMALL]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "--force" in err and "Traceback" not in err
    assert out.read_text() == "precious\n"
    assert run(["generate", "support_chat", "-o", str(out), *SMALL, "--force"]) == 0
    assert len(read_jsonl(out)) > 3


def test_chat_lines_carry_the_documented_fields(tmp_path):
    out = tmp_path / "mt.jsonl"
    assert run(["generate", "multi_tenant", "-o", str(out), "--requests", "6", "--system-tokens", "80"]) == 0
    recs = read_jsonl(out)
    assert len(recs) == 6
    assert list(recs[0]) == ["messages", "model", "timestamp", "tenant", "cache_salt",
                             "request_id", "max_tokens", "output_length", "response"]


def test_output_length_counts_reply_tokens_plus_end_of_turn(tmp_path):
    """The written output_length is what a server logs: reply tokens + the stop token."""
    from kvsim.io.tokenize.templates import get_template
    from kvsim.io.tokenize.tokenizers import get_tokenizer

    out = tmp_path / "s.jsonl"
    assert run(["generate", "support_chat", "-o", str(out), *SMALL]) == 0
    template = get_template("llama3")
    tok = get_tokenizer("cl100k_base", template.special_tokens)
    for r in read_jsonl(out):
        assert r["output_length"] == len(tok.encode(r["response"])) + 1
        assert r["output_length"] <= r["max_tokens"]


@pytest.mark.parametrize("argv", [["generate", "--list"], ["generate", "list"]])
def test_list_shows_every_scenario(argv, capsys):
    from kvsim.workloads import scenarios

    assert run(argv) == 0
    shown = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in shown] == list(scenarios())


@pytest.mark.parametrize("argv, message", [
    (["generate", "rag"], "missing -o/--output"),
    (["generate", "nope", "-o", "X"], "unknown scenario"),
    (["generate", "rag", "-o", "X", "--tenants", "2"], "--tenants does not apply"),
    (["generate", "rag", "-o", "X", "--format", "csv"], "--format must be chat or tokens"),
    (["generate", "rag", "-o", "X", "--requests", "0"], "--requests must be at least 1"),
    (["generate", "mixture", "-o", "X", "--mix", "rag=oops"], "--mix"),
    (["generate", "rag", "-o", "X", "--format", "tokens", "--tokenizer", "no_such_enc"], "unknown tokenizer"),
])
def test_bad_options_exit_2_with_one_line(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert run(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "Traceback" not in err and len(err.splitlines()) <= 2
    assert not (tmp_path / "X").exists()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_replies_fit_max_tokens_when_counted_exactly(seed):
    """Exact output lengths (reply + end-of-turn, cl100k + llama3) never exceed max_tokens."""
    from kvsim.workloads import generate, scenarios
    from kvsim.workloads.writer import Encoder, count_outputs

    encoder = Encoder()
    for name in scenarios():
        opts = {"requests": 150} if name != "support_chat" else {"sessions": 30}
        for r in count_outputs(generate(name, seed=seed, **opts), encoder):
            assert 1 < r.output_length <= r.max_tokens, (name, r.request_id)
