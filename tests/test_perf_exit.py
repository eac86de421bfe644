"""The kvsim script ends its process without the interpreter's teardown (kvsim.cli.exit_now):
the exit code, every byte of output and the trace cache entry written in the background are
all there when it has ended."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from kvsim.io.trace import cache as trace_cache


def _script(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "from kvsim.cli import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=300)


def test_exit_code_output_and_background_store_survive_the_fast_exit(tmp_path, monkeypatch):
    log = tmp_path / "log.jsonl"
    log.write_text("".join(json.dumps({"prompt_token_ids": [1, 2, 3, i], "output_token_ids": [5]}) + "\n"
                           for i in range(200)))
    env = {**os.environ, "KVSIM_CACHE_DIR": str(tmp_path / "cache")}
    done = _script(["simulate", str(log), "--json", str(tmp_path / "s.json"), "--per-request",
                    str(tmp_path / "r.jsonl")], env)
    assert done.returncode == 0, done.stderr
    assert "per-request results written" in done.stdout  # the last line printed is there
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 200
    assert json.loads((tmp_path / "s.json").read_text())["trace"]["requests"] == 200
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "cache"))
    entries = trace_cache.entries()  # written by the ended process's background writer
    assert len(entries) == 1 and entries[0].requests == 200
    bad = _script(["simulate", str(tmp_path / "missing.jsonl")], env)
    assert bad.returncode == 2 and "no such file" in bad.stderr


def test_a_closed_pipe_ends_quietly(tmp_path):
    """kvsim ... | head: the reader goes away; no traceback, the process still ends."""
    env = {**os.environ, "KVSIM_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-c", "from kvsim.cli import main; main()", "generate", "list"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    proc.stdout.read(10)
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err
