"""The compiled token-id scanner: on the same bytes it gives the same trace as the general
reader, or the same error (file, line, problem), in both --on-error modes."""
from __future__ import annotations

import gzip
import json
import random
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import kvsim
from kvsim.errors import InputError
from kvsim.io.readers.tokens import TokensReader
from kvsim.io.readers.token_scan import BLANK, DECLINED, FAST, Scratch, ScannedBlock
from trace_equal import assert_same_trace


@contextmanager
def fast_path(enabled: bool):
    saved = TokensReader.fast_min_bytes
    TokensReader.fast_min_bytes = 0 if enabled else 1 << 62
    try:
        yield
    finally:
        TokensReader.fast_min_bytes = saved


def outcome(path: Path, fast: bool, **kw):
    with fast_path(fast):
        try:
            return kvsim.load_trace(path, tokenizer="bytes", **kw)
        except InputError as e:
            return str(e)


def assert_same_outcome(data: bytes, name: str = "log.jsonl", **kw) -> object:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / name
        path.write_bytes(data)
        fast, general = outcome(path, True, **kw), outcome(path, False, **kw)
        if isinstance(general, str) or isinstance(fast, str):
            assert fast == general
        else:
            assert_same_trace(fast, general)
        assert path.read_bytes() == data
        return fast


def scan(data: bytes) -> ScannedBlock:
    return ScannedBlock(np.frombuffer(data, np.uint8), Scratch())


# -- the scanner on its own ------------------------------------------------------------------
def test_scanner_reads_ids_and_spans():
    line = b'{"timestamp": 1.5, "prompt_token_ids": [3, 1,4] , "output_token_ids":[],"user":"a"}\n'
    s = scan(line + b"  \r\n" + b'{"prompt_token_ids":[12345678901234567]}')
    assert s.status.tolist() == [FAST, BLANK, FAST]
    assert s.tokens.tolist() == [3, 1, 4, 12345678901234567] and s.tokens.dtype == np.int64
    assert s.token_offsets.tolist() == [0, 3, 3, 4] and s.output_offsets.tolist() == [0, 0, 0, 0]
    ps, pe, os_, oe = s.spans[0]
    assert line[ps:pe] == b"[3, 1,4]" and line[os_:oe] == b"[]"


@pytest.mark.parametrize("line", [
    b'{"prompt_token_ids": []}',                          # empty prompt: an error, said by the general reader
    b'{"prompt_token_ids": [1, -2]}',                     # negative id
    b'{"prompt_token_ids": [1, 2.0]}',                    # a float
    b'{"prompt_token_ids": [1e3]}',
    b'{"prompt_token_ids": [01]}',                        # not JSON
    b'{"prompt_token_ids": [1234567890123456789]}',       # 19 digits
    b'{"prompt_token_ids": [1,]}',
    b'{"prompt_token_ids": [1], "prompt_token_ids": [2]}',  # repeated key
    b'{"prompt\\u005ftoken_ids": [1]}',                  # an escaped key
    b'{"a\\"": 1, "prompt_token_ids": [1]}',
    b'{"prompt_token_ids": "1"}',
    b'{"output_token_ids": [1]}',                         # no prompt
    b'[{"prompt_token_ids": [1]}]',
    b'{"prompt_token_ids": [1]} x',
    b'{"prompt_token_ids": [1]',
    b'{"x": {"prompt_token_ids": [1]}}',                  # not a top-level key
])
def test_scanner_declines_what_it_does_not_fully_read(line):
    assert scan(line).status.tolist() == [DECLINED]


def test_a_block_scanned_in_parallel_runs_equals_one_run():
    lines = [b'{"prompt_token_ids": [%d, 2], "output_token_ids": [%d]}' % (i, i) for i in range(50)]
    lines[7] = b'{"prompt_token_ids": [1, -2]}'
    lines[30] = b"   "
    lines[41] = b'{"prompt_token_ids": [%d]}' % 2**40
    block = np.frombuffer(b"\n".join(lines) + b"\n", np.uint8)
    one = ScannedBlock(block, Scratch(), parts=1)
    for parts in (2, 3, 7, 60):
        many = ScannedBlock(block, Scratch(), parts=parts)
        for name in ("status", "spans", "tokens", "outputs", "token_offsets", "output_offsets", "bounds"):
            a, b = getattr(one, name), getattr(many, name)
            assert a.dtype == b.dtype and np.array_equal(a, b), (parts, name)


def test_nested_key_is_not_taken_for_the_top_level_one():
    s = scan(b'{"meta": {"prompt_token_ids": [9, 9]}, "prompt_token_ids": [1, 2], "x": ["]", "}"]}')
    assert s.status.tolist() == [FAST] and s.tokens.tolist() == [1, 2]


# -- the reader: same trace or same error ----------------------------------------------------
def test_large_log_matches_the_general_reader(tmp_path):
    rng = random.Random(1)
    lines = []
    for i in range(3000):
        rec = {"prompt_token_ids": [rng.randrange(200_000) for _ in range(rng.randrange(1, 300))],
               "timestamp": i * 0.25, "session_id": f"s{i % 7}", "request_id": f"r{i}"}
        if i % 3:
            rec["output_token_ids"] = [rng.randrange(200_000) for _ in range(rng.randrange(0, 40))]
        if i % 11 == 0:
            rec["prompt_token_ids"].append(2**40 + i)  # int64 ids
        lines.append(json.dumps(rec, separators=(",", ":") if i % 2 else (", ", ": ")))
    lines[1500] = lines[1500].replace("[", "[ ", 1)
    data = ("\n".join(lines) + "\n").encode()
    t = assert_same_outcome(data)
    assert len(t) == 3000 and t.tokens.dtype == np.int64
    assert_same_outcome(gzip.compress(data), name="log.jsonl.gz")
    assert_same_outcome(data, limit=1234)


def test_line_numbers_run_on_across_blocks():
    """A bad line in the third block (a 1 MB first block, then 8 MB ones) is named by the same
    line number as the general reader names it, blank lines before it counted."""
    row = b'{"prompt_token_ids": [' + b", ".join(b"%d" % (i * 7919 % 100_000) for i in range(2000)) + b"]}\n"
    rows = [row if i % 97 else b"\n" for i in range(1600)]      # about 10.5 MB
    assert sum(map(len, rows[:1500])) > 9 << 20
    rows[1540] = b'{"prompt_token_ids": [1, -2]}\n'
    for on_error in ("fail", "skip"):
        assert_same_outcome(b"".join(rows), on_error=on_error)


def test_bad_lines_fail_and_skip_alike():
    good = b'{"prompt_token_ids": [1, 2, 3], "output_token_ids": [4]}\n'
    bad = [b'{"prompt_token_ids": [1, -2]}\n', b'{"prompt_token_ids": [1], "timestamp": "x"}\n',
           b'{"prompt_token_ids": [1], "max_tokens": 1.5}\n', b'{"prompt_token_ids": [1], "user": [1]}\n',
           b'\xff\xfe\n', b'not json\n', b'{"prompt_token_ids": [1], "user": "\xe9"}\n', b"\x0b\n", b"\n"]
    data = good + b"".join(bad[i] + good for i in range(len(bad)))
    for on_error in ("fail", "skip"):
        assert_same_outcome(data, on_error=on_error)


def test_first_line_that_the_scanner_declines_hands_the_file_to_the_general_reader(tmp_path):
    doc = json.dumps({"prompt_token_ids": [1, 2, 3], "output_token_ids": [4]}, indent=1).encode()
    assert isinstance(assert_same_outcome(doc), kvsim.Trace)  # one pretty-printed document
    assert_same_outcome(b"\xef\xbb\xbf" + b'{"prompt_token_ids": [5]}\n{"prompt_token_ids": [6]}\n')


def test_truncated_gzip_fails_at_the_same_line():
    data = b"".join(b'{"prompt_token_ids": [%d, 2, 3]}\n' % i for i in range(5000))
    packed = gzip.compress(data)
    for cut in (len(packed) // 3, len(packed) - 9):
        err = assert_same_outcome(packed[:cut], name="log.jsonl.gz")
        assert isinstance(err, str) and "cannot read compressed data" in err


# -- fuzzing --------------------------------------------------------------------------------
good_ids = st.lists(st.integers(0, 300), min_size=1, max_size=6)
odd_ids = st.lists(st.one_of(st.integers(0, 300), st.integers(0, 2**64), st.integers(-5, 5)), max_size=6)
ids = st.one_of(good_ids, good_ids, good_ids, odd_ids)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**65), st.floats(), st.text(max_size=6))
names = st.one_of(st.text(max_size=4), st.integers(0, 9), scalars)
numbers = st.one_of(st.integers(0, 99), st.floats(0, 1e9), scalars)
fields = st.fixed_dictionaries({"prompt_token_ids": ids}, optional={
    "output_token_ids": st.one_of(ids, ids, scalars), "timestamp": numbers, "user": names, "session_id": names,
    "request_id": names, "max_tokens": numbers, "output_length": numbers, "prompt_logprobs": st.booleans(),
    "output_tokens": st.one_of(ids, numbers), "x": st.lists(scalars, max_size=3),
    "logprob_start_len": numbers, "arrival_step": numbers, "return_logprob": scalars, "echo": scalars, "logprobs": scalars})
JSONISH = '{}[]",:0123456789-+.eE \t\r\\u_ptoknids\xe9\x00'


KEYS = ["prompt_token_ids", "output_token_ids", "prompt\\u005ftoken_ids", "output_token_id\\u0073"]


@st.composite
def token_lines(draw):
    """A JSON line of the tokens format: keys maybe repeated or escaped, odd spacing, maybe
    with a few bytes edited."""
    rec = draw(fields)
    members = [(json.dumps(k), json.dumps(v, allow_nan=True)) for k, v in rec.items()]
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):  # repeated keys, some of them escaped
        members.append(('"%s"' % draw(st.sampled_from(KEYS)), json.dumps(draw(st.one_of(ids, scalars)))))
    draw(st.randoms()).shuffle(members)
    space = st.sampled_from(["", "", " ", "\t", " \r "])
    text = "{" + ",".join(f"{draw(space)}{k}{draw(space)}:{draw(space)}{v}{draw(space)}" for k, v in members) + "}"
    if draw(st.booleans()):
        text = text.replace(",", draw(st.sampled_from([", ", " ,", ",\t"])))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        pos = draw(st.integers(0, len(text)))
        cut = draw(st.integers(0, 3))
        text = text[:pos] + draw(st.text(st.sampled_from(JSONISH), max_size=3)) + text[pos + cut:]
    return text.encode("utf-8", "surrogatepass")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(st.one_of(token_lines(), st.sampled_from([b"", b"  ", b"\x0c", b"\xff", b"\xef\xbb\xbf{"])),
                      min_size=1, max_size=6),
       ending=st.sampled_from([b"\n", b"\r\n"]), on_error=st.sampled_from(["fail", "skip"]),
       gz=st.booleans(), limit=st.sampled_from([None, None, 2]))
def test_fast_and_general_readers_agree_on_any_bytes(lines, ending, on_error, gz, limit):
    # a first line the scanner takes, so that the file is not handed to the general reader
    data = ending.join([b'{"prompt_token_ids": [7, 8]}', *lines]) + ending
    assert_same_outcome(gzip.compress(data) if gz else data, name="log.jsonl.gz" if gz else "log.jsonl",
                        format="tokens", on_error=on_error, limit=limit)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([b"\n", b"a", b"\n\n", b"abcdefgh", b"\r\n", b"\x8a"]), max_size=40).map(b"".join),
       st.integers(0, 7))
def test_line_bounds_eight_bytes_at_a_time_equal_newline_positions(data, skip):
    from kvsim.io.readers.token_scan import line_bounds

    buf = np.frombuffer(b"#" * skip + data, np.uint8)[skip:]  # any alignment
    expected = [0, *(np.flatnonzero(buf == 10) + 1).tolist()]
    if len(buf) and buf[-1] != 10:
        expected.append(len(buf))  # a last line without a newline
    assert line_bounds(buf).tolist() == expected


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(lines=st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), min_size=1, max_size=12),
       end=st.booleans(), size=st.integers(4, 64), first=st.integers(1, 64))
def test_line_blocks_cut_the_file_into_its_lines(tmp_path, lines, end, size, first):
    """Blocks of whole lines (lines longer than the buffer grow it), numbered by their first
    line, together the file; block_buffer gives each block's bytes (the reader's own buffer)."""
    from kvsim.io.source import Source, block_buffer

    data = b"\n".join(lines) + (b"\n" if end else b"")
    assume(not data.startswith(b"\x1f\x8b"))  # (gzip: read line by line)
    path = tmp_path / "log.jsonl"
    path.write_bytes(data)
    got = b""
    for number, block in Source(path).line_blocks(size=size, first=first):
        assert bytes(block_buffer(block)[:len(block)]) == block.tobytes()
        assert number == 1 + got.count(b"\n")  # the number of the block's first line
        got += block.tobytes()
        assert got.endswith(b"\n") or got == data  # whole lines only
    assert got == data
    assert b"".join(b.tobytes() for _, b in Source(path).line_blocks(size=size, first=first, numbered=False)) == data
