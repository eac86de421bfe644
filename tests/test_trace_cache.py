"""The persistent trace cache: a second read maps the stored trace; a changed, truncated or
appended log is read again, never served stale; private files; the CLI switches."""
from __future__ import annotations

import json
import mmap
import os
import stat
import time

import numpy as np
import pytest

import kvsim
from kvsim.cli import run
from kvsim.io import load
from kvsim.io.trace import cache as trace_cache
from trace_equal import assert_same_trace


def tokens_log(path, n: int = 50, base: int = 0):
    lines = [json.dumps({"prompt_token_ids": [base + i, 2, 3, i % 7], "output_token_ids": [9] * (i % 3),
                         "session_id": f"s{i % 4}", "request_id": f"r{i}é"}) for i in range(n)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def reads(monkeypatch):
    """How many times the readers actually read a log (a cache hit reads nothing)."""
    count = []
    real = load._read

    def counting(*args, **kw):
        count.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(load, "_read", counting)
    return count


def age(path, seconds: float = 60) -> None:
    """Make a file look written a while ago (stats recorded then are not 'racy')."""
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_second_read_maps_the_stored_trace(tmp_path, trace_cache_dir, reads):
    log = tokens_log(tmp_path / "log.jsonl")
    age(log)
    first = kvsim.load_trace(log, cache=True)
    second = kvsim.load_trace(log, cache=True)
    assert len(reads) == 1
    assert_same_trace(first, second)
    assert isinstance(second.tokens.base.obj, mmap.mmap)  # memory-mapped, not read
    second.tokens[0] = 999  # copy-on-write: the stored trace is untouched
    assert kvsim.load_trace(log, cache=True).tokens[0] == first.tokens[0]
    assert second.meta.sources == [str(log)]


def test_a_trace_stored_in_the_background_is_served_to_the_next_read(tmp_path, trace_cache_dir, reads):
    """wait_for_store=False (the command line): load_trace returns before the entry is written;
    the next lookup waits for the writer and maps the entry."""
    log = tokens_log(tmp_path / "log.jsonl")
    age(log)
    first = kvsim.load_trace(log, cache=True, wait_for_store=False)
    second = kvsim.load_trace(log, cache=True)
    assert len(reads) == 1
    assert_same_trace(first, second)
    assert isinstance(second.tokens.base.obj, mmap.mmap)


def test_a_log_changed_before_its_background_store_ends_is_not_stored(tmp_path, trace_cache_dir, reads, monkeypatch):
    log = tokens_log(tmp_path / "log.jsonl")
    age(log)
    real = trace_cache.content_hash
    monkeypatch.setattr(trace_cache, "content_hash", lambda p: time.sleep(1.0) or real(p))  # a slow hash
    kvsim.load_trace(log, cache=True, wait_for_store=False)
    tokens_log(log, n=50, base=7)  # other ids, while the entry is not written yet
    age(log, 30)
    trace_cache.wait_for_stores()
    assert trace_cache.entries() == []
    t = kvsim.load_trace(log, cache=True)
    assert len(reads) == 2 and t.prompt(0).tolist()[0] == 7


def test_entries_are_private(tmp_path, trace_cache_dir):
    log = tokens_log(tmp_path / "log.jsonl")
    kvsim.load_trace(log, cache=True)
    folder = trace_cache_dir / "traces"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    files = list(folder.iterdir())
    assert {f.suffix for f in files} == {".json", ".trace"}
    assert all(stat.S_IMODE(f.stat().st_mode) == 0o600 for f in files)
    assert b"prompt_token_ids" not in b"".join(f.read_bytes() for f in files)  # no raw log lines


@pytest.mark.parametrize("change", ["same size", "same size, mtime restored", "truncated", "appended"])
def test_a_changed_log_is_read_again(tmp_path, trace_cache_dir, reads, change, monkeypatch):
    monkeypatch.setattr(trace_cache, "RACY_NS", 0)  # detected by the stat alone, no 'recent' hashing
    log = tokens_log(tmp_path / "log.jsonl")
    age(log)
    before = log.stat()
    kvsim.load_trace(log, cache=True)
    data = log.read_bytes()
    if change.startswith("same size"):
        log.write_bytes(data.replace(b'[0, 2, 3', b'[5, 2, 3', 1))  # same length, other tokens
        if "restored" in change:
            os.utime(log, ns=(before.st_atime_ns, before.st_mtime_ns))
    elif change == "truncated":
        log.write_bytes(data[:len(data) // 2].rsplit(b"\n", 1)[0] + b"\n")
    else:
        log.write_bytes(data + data.splitlines(keepends=True)[0])
    fresh = kvsim.load_trace(log, cache=False)
    cached = kvsim.load_trace(log, cache=True)
    assert len(reads) == 3
    assert_same_trace(cached, fresh)
    kvsim.load_trace(log, cache=True)  # and the new entry is used from then on
    assert len(reads) == 3


def test_touched_log_with_the_same_content_is_still_served(tmp_path, trace_cache_dir, reads, monkeypatch):
    log = tokens_log(tmp_path / "log.jsonl")
    age(log, 120)
    kvsim.load_trace(log, cache=True)
    age(log, 60)  # new mtime and ctime, same bytes: the content hash decides
    monkeypatch.setattr(trace_cache, "RACY_NS", 0)  # (the new ctime is seconds old: trust it)
    hashed = []
    real = trace_cache.content_hash
    monkeypatch.setattr(trace_cache, "content_hash", lambda p: hashed.append(p) or real(p))
    kvsim.load_trace(log, cache=True)
    kvsim.load_trace(log, cache=True)  # the entry's stamp was refreshed: no hashing now
    assert len(reads) == 1 and len(hashed) == 1


def test_a_log_written_just_now_is_checked_by_content(tmp_path, trace_cache_dir, reads, monkeypatch):
    """Timestamps of a file changed within the last seconds prove nothing: hash it."""
    log = tokens_log(tmp_path / "log.jsonl")
    kvsim.load_trace(log, cache=True)
    hashed = []
    real = trace_cache.content_hash
    monkeypatch.setattr(trace_cache, "content_hash", lambda p: hashed.append(p) or real(p))
    kvsim.load_trace(log, cache=True)
    assert len(reads) == 1 and len(hashed) == 1


def test_options_that_change_the_trace_are_part_of_the_key(tmp_path, trace_cache_dir, reads):
    log = tmp_path / "chat.jsonl"
    log.write_text(json.dumps({"messages": [{"role": "user", "content": "hi there"}], "response": "ok"}) + "\n")
    age(log)
    variants = [dict(), dict(tokenizer="bytes"), dict(chat_template="chatml"), dict(limit=1),
                dict(on_error="skip"), dict(format="chat")]
    traces = [kvsim.load_trace(log, cache=True, **kw) for kw in variants]
    assert len(reads) == len(variants)
    for kw, t in zip(variants, traces):
        assert_same_trace(kvsim.load_trace(log, cache=True, **kw), t)
    assert len(reads) == len(variants)
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    kvsim.load_trace(log, cache=True, chat_template=str(template))
    template.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")  # same path, new text
    t = kvsim.load_trace(log, cache=True, chat_template=str(template))
    assert len(reads) == len(variants) + 2
    assert t.meta.chat_template == str(template)


def test_several_files_and_one_of_them_changes(tmp_path, trace_cache_dir, reads):
    a, b = tokens_log(tmp_path / "a.jsonl"), tokens_log(tmp_path / "b.jsonl", base=100)
    age(a)
    age(b)
    kvsim.load_trace([a, b], cache=True)
    kvsim.load_trace([b, a], cache=True)  # another order is another trace
    assert len(reads) == 2
    tokens_log(b, n=10)
    t = kvsim.load_trace([a, b], cache=True)
    assert len(reads) == 3 and len(t) == 60


def test_a_damaged_entry_is_dropped_and_the_log_read_again(tmp_path, trace_cache_dir, reads):
    log = tokens_log(tmp_path / "log.jsonl")
    age(log)
    kvsim.load_trace(log, cache=True)
    data = next((trace_cache_dir / "traces").glob("*.trace"))
    data.write_bytes(data.read_bytes()[:100])
    t = kvsim.load_trace(log, cache=True)
    assert len(reads) == 2 and len(t) == 50


def test_a_log_changed_while_it_was_read_is_not_stored(tmp_path, trace_cache_dir):
    log = tokens_log(tmp_path / "log.jsonl")
    pending = trace_cache.PendingStore([log], {"x": 1})
    trace = kvsim.load_trace(log)
    tokens_log(log, n=60)
    assert not pending.store(trace)
    assert trace_cache.entries() == []


def test_unwritable_cache_folder_only_skips_storing(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(blocker))
    log = tokens_log(tmp_path / "log.jsonl")
    assert len(kvsim.load_trace(log, cache=True)) == 50


def test_least_recently_used_entries_go_first(tmp_path, trace_cache_dir, monkeypatch):
    logs = [tokens_log(tmp_path / f"{k}.jsonl", n=200) for k in range(3)]
    for log in logs:
        age(log)
        kvsim.load_trace(log, cache=True)
        time.sleep(0.01)
    kvsim.load_trace(logs[0], cache=True)  # used again: now the most recent
    one = max(e.bytes for e in trace_cache.entries())
    trace_cache.prune(2 * one)
    assert sorted(os.path.basename(s) for e in trace_cache.entries() for s in e.sources) == ["0.jsonl", "2.jsonl"]


# -- the command line ------------------------------------------------------------------------
def test_cli_uses_the_cache_unless_told_not_to(tmp_path, trace_cache_dir, capsys, reads):
    log = tokens_log(tmp_path / "log.jsonl")
    age(log)
    assert run(["--no-trace-cache", "inspect", str(log)]) == 0
    assert trace_cache.entries() == []
    assert run(["inspect", str(log)]) == 0
    assert run(["analyze", str(log)]) == 0  # another command, same log: no read
    assert len(reads) == 2 and len(trace_cache.entries()) == 1
    capsys.readouterr()
    assert run(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert str(trace_cache_dir / "traces") in out.replace("\n", "") and "1 trace(s)" in out
    assert run(["cache", "clear"]) == 0
    assert "removed 1 trace(s)" in capsys.readouterr().out
    assert trace_cache.entries() == [] and not list((trace_cache_dir / "traces").iterdir())


def test_environment_variable_turns_the_cache_off(tmp_path, trace_cache_dir, monkeypatch):
    monkeypatch.setenv("KVSIM_NO_TRACE_CACHE", "1")
    assert run(["inspect", str(tokens_log(tmp_path / "log.jsonl"))]) == 0
    assert trace_cache.entries() == []


def test_tests_never_use_the_real_user_cache():
    import platformdirs

    assert os.environ["KVSIM_CACHE_DIR"] != platformdirs.user_cache_dir("kvsim")
    assert trace_cache.cache_root() == trace_cache.Path(os.environ["KVSIM_CACHE_DIR"])
