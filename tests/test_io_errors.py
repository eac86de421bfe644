"""Bad input through the CLI: exit code 2, one line naming file:line and the problem, no traceback;
--on-error skip counts and reports; inputs are never written over."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kvsim.cli import run

GOOD_CHAT = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
GOOD_MOON = json.dumps({"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]})


def fails(capsys, args: list[str], expect: str) -> str:
    """Run the CLI, expect exit 2 and a one-line error containing ``expect``."""
    code = run(args)
    err = capsys.readouterr().err
    assert code == 2, err
    assert expect in err, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err


def log(tmp_path: Path, *lines: str | bytes, name: str = "log.jsonl") -> Path:
    path = tmp_path / name
    path.write_bytes(b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines))
    return path


# (lines, format, expected problem) — the bad line is always line 2 of the file
BAD_LINES = {
    "invalid json": ([GOOD_CHAT, '{"messages": [}'], "auto", "invalid JSON"),
    "not an object": ([GOOD_CHAT, "[1, 2, 3]"], "auto", "expected a JSON object, got a list"),
    "scalar": ([GOOD_CHAT, '"just a string"'], "auto", "expected a JSON object, got a string"),
    "messages wrong type": ([GOOD_CHAT, '{"messages": "hello"}'], "auto", "messages must be a list"),
    "empty messages": ([GOOD_CHAT, '{"messages": []}'], "auto", "messages is empty"),
    "message without role": ([GOOD_CHAT, '{"messages": [{"content": "x"}]}'], "auto", "messages[0] has no role"),
    "max_tokens wrong type": ([GOOD_CHAT, json.dumps({"messages": [{"role": "user", "content": "x"}],
                                                      "max_tokens": "ten"})], "auto",
                              "max_tokens must be an integer, got a string"),
    "negative max_tokens": ([GOOD_CHAT, json.dumps({"messages": [{"role": "user", "content": "x"}],
                                                    "max_tokens": -3})], "auto", "max_tokens is negative (-3)"),
    "bad timestamp": ([GOOD_CHAT, json.dumps({"messages": [{"role": "user", "content": "x"}],
                                              "timestamp": "yesterday"})], "auto", "timestamp is neither"),
    "token ids wrong type": (['{"prompt_token_ids": [1]}', '{"prompt_token_ids": [1, 2.5]}'], "auto",
                             "prompt_token_ids must hold integers only, found a number"),
    "empty prompt": (['{"prompt": "a"}', '{"prompt": ""}'], "auto", "prompt is empty"),
    "negative input_length": ([GOOD_MOON, '{"input_length": -5, "output_length": 1, "hash_ids": []}'],
                              "auto", "input_length is negative (-5)"),
    "missing input_length": ([GOOD_MOON, '{"output_length": 1, "hash_ids": [1]}'], "mooncake",
                             "missing input_length"),
    "negative output_length": ([GOOD_MOON, '{"input_length": 5, "output_length": -1, "hash_ids": [1]}'],
                               "auto", "output_length is negative (-1)"),
    "missing output_length": ([GOOD_MOON, '{"input_length": 5, "hash_ids": [1]}'], "auto",
                              "missing output_length"),
    "hash ids wrong type": ([GOOD_MOON, '{"input_length": 5, "output_length": 1, "hash_ids": "abc"}'], "auto",
                            "hash_ids must be a list of integers"),
    "undecodable bytes": ([GOOD_CHAT, b'{"messages": "\xff\xfe"}'], "auto", "not valid UTF-8 (byte 0xff"),
    "sharegpt bad role": (['{"conversations": [{"from": "human", "value": "a"}]}',
                           '{"conversations": [{"from": "robot", "value": "a"}]}'], "auto",
                          "conversations[0].from is 'robot'"),
}


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_bad_line_fails_with_file_and_line(tmp_path, capsys, case):
    lines, fmt, problem = BAD_LINES[case]
    path = log(tmp_path, *lines)
    before = path.read_bytes()
    err = fails(capsys, ["inspect", str(path), "--format", fmt], f"{path}:2: {problem}")
    assert err.startswith("error:")
    assert path.read_bytes() == before


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_bad_line_is_skipped_and_counted(tmp_path, capsys, case):
    lines, fmt, _ = BAD_LINES[case]
    path = log(tmp_path, *lines, lines[0])
    assert run(["inspect", str(path), "--format", fmt, "--on-error", "skip"]) == 0
    out, err = capsys.readouterr()
    assert "skipped 1 bad line(s)" in err and "Traceback" not in err
    assert "skipped: 1 bad line(s)" in out


def test_skip_counts_several_lines_across_files(tmp_path, capsys):
    a = log(tmp_path, "nope", GOOD_CHAT, "{", '{"messages": []}', name="a.jsonl")
    b = log(tmp_path, GOOD_CHAT, "[]", name="b.jsonl")
    assert run(["inspect", str(a), str(b), "--on-error", "skip"]) == 0
    out, err = capsys.readouterr()
    assert "skipped 4 bad line(s) (a.jsonl: 3, b.jsonl: 1)" in err
    import kvsim

    t = kvsim.load_trace([a, b], on_error="skip")
    assert len(t) == 2 and t.meta.skipped_lines == 4 and t.meta.source_skipped == [3, 1]


def test_first_line_bad_fails_in_detection_too(tmp_path, capsys):
    path = log(tmp_path, "not json", GOOD_CHAT)
    fails(capsys, ["inspect", str(path)], f"{path}:1: invalid JSON")


def test_unknown_record_keys(tmp_path, capsys):
    path = log(tmp_path, '{"text": "hello"}')
    fails(capsys, ["inspect", str(path)], f"{path}:1: cannot tell the input format")


def test_empty_missing_directory(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    fails(capsys, ["inspect", str(empty)], f"{empty}: file is empty")
    blank = log(tmp_path, "", "   ", name="blank.jsonl")
    fails(capsys, ["inspect", str(blank)], f"{blank}: file holds no data")
    fails(capsys, ["inspect", str(tmp_path / "missing.jsonl")], "missing.jsonl: no such file")
    fails(capsys, ["inspect", str(tmp_path)], f"{tmp_path}: is a directory")


def test_corrupt_gzip(tmp_path, capsys):
    data = gzip.compress(("\n".join([GOOD_CHAT] * 200) + "\n").encode())
    path = tmp_path / "log.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    fails(capsys, ["inspect", str(path)], "cannot read compressed data")


def test_azure_csv_bad_rows(tmp_path, capsys):
    path = tmp_path / "a.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97996,10,2\n"
                    "2023-11-16 18:17:04.0,-4,2\n2023-11-16 18:17:05.0,x,2\n2023-11-16 18:17:06.0,3\n")
    fails(capsys, ["inspect", str(path)], f"{path}:3: ContextTokens is negative (-4)")
    assert run(["inspect", str(path), "--on-error", "skip"]) == 0
    assert "skipped 3 bad line(s)" in capsys.readouterr().err
    other = tmp_path / "b.csv"
    other.write_text("a,b\n1,2\n")
    fails(capsys, ["inspect", str(other)], f"{other}:1: not a known CSV trace")


def test_bad_options(tmp_path, capsys):
    path = log(tmp_path, GOOD_CHAT)
    fails(capsys, ["inspect", str(path), "--format", "xml"], "unknown format 'xml'")
    fails(capsys, ["inspect", str(path), "--on-error", "ignore"], "--on-error must be fail or skip")
    fails(capsys, ["inspect", str(path), "--trace-block-size", "0"], "--trace-block-size must be a positive")
    fails(capsys, ["inspect", str(path), "--tokenizer", "nope"], "unknown tokenizer 'nope'")
    fails(capsys, ["inspect", str(path), "--chat-template", "nope"], "unknown chat template 'nope'")


def test_export_never_overwrites_an_input(tmp_path, capsys):
    path = log(tmp_path, GOOD_CHAT)
    before = path.read_bytes()
    fails(capsys, ["inspect", str(path), "--export", str(path)], "refusing to write over an input file")
    fails(capsys, ["inspect", str(path), "--export", str(path), "--force"], "refusing to write over an input file")
    assert path.read_bytes() == before
    out = tmp_path / "out.jsonl"
    out.write_text("precious\n")
    fails(capsys, ["inspect", str(path), "--export", str(out)], "already exists (use --force")
    assert out.read_text() == "precious\n"
    assert run(["inspect", str(path), "--export", str(out), "--force"]) == 0
    assert json.loads(out.read_text())["prompt_token_ids"]


def test_export_of_a_length_only_trace_is_refused(tmp_path, capsys):
    csv = Path(__file__).resolve().parents[1] / "traces" / "public" / "AzureLLMInferenceTrace_code.csv"
    fails(capsys, ["inspect", str(csv), "--export", str(tmp_path / "x.jsonl")], "no prefix information")
    assert not (tmp_path / "x.jsonl").exists()
