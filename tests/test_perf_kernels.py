"""Compiled kernels: cached in the user cache folder (what a site-packages install can write),
compiled when first used, and one note when a compilation runs long (no timing here: the first
and second command are timed by bench/bench_commands.py, section first_run)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

KERNEL = ("import numpy as np\n"
          "from kvsim.io.readers.token_scan import line_bounds\n"
          "line_bounds(np.frombuffer(b'{}\\n{}\\n', np.uint8).copy())\n")


def _python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)


@pytest.fixture
def fresh_user_cache(tmp_path):
    """A process environment with an empty user cache folder and no NUMBA_CACHE_DIR, on numba's
    kernels (the copies built ahead of time, which need no cache, turned off)."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "user-cache")
    env["KVSIM_AOT"] = "0"
    return env, tmp_path / "user-cache" / "kvsim" / "kernels"


def test_kernels_are_cached_in_the_user_cache_folder(fresh_user_cache):
    env, folder = fresh_user_cache
    code = ("import os, sys\nimport kvsim\nassert 'numba' not in sys.modules\n" + KERNEL +
            "import numba\nprint(os.environ['NUMBA_CACHE_DIR'], numba.core.config.CACHE_DIR)\n")
    done = _python(code, env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(folder), str(folder)]
    assert any(p.name.startswith("token_scan.line_bounds") and p.suffix == ".nbi" for p in folder.rglob("*"))


def test_a_given_numba_cache_dir_is_kept(fresh_user_cache, tmp_path):
    env, folder = fresh_user_cache
    env["NUMBA_CACHE_DIR"] = str(tmp_path / "mine")
    done = _python("import kvsim\n" + KERNEL, env)
    assert done.returncode == 0, done.stderr
    assert list((tmp_path / "mine").rglob("*.nbi")) and not folder.exists()


def test_numba_imported_before_kvsim_still_caches_in_the_user_folder(fresh_user_cache):
    env, folder = fresh_user_cache
    done = _python("import numba\nimport kvsim\n" + KERNEL + "print(numba.core.config.CACHE_DIR)", env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(folder) and list(folder.rglob("*.nbi"))


def test_a_command_compiles_only_its_kernels_and_says_so_once(fresh_user_cache, tmp_path):
    """Reading a token-id log compiles the token scanner (not the chat scanner, the word path or
    an engine); the note comes while a compilation runs past the threshold (here 0 s), once.
    The next process loads the cached kernels without compiling and prints nothing."""
    env, folder = fresh_user_cache
    log = tmp_path / "tokens.jsonl"
    line = json.dumps({"prompt_token_ids": list(range(1, 400)), "output_token_ids": [1, 2]})
    log.write_text((line + "\n") * 3000)  # over 1 MB: the compiled scanner reads it
    code = f"import kvsim.kernels.compile_cache as c\nc.NOTE_AFTER_S = 0.0\nimport kvsim\nkvsim.load_trace({str(log)!r})"
    first = _python(code, env)
    assert first.returncode == 0, first.stderr
    notes = [line for line in first.stderr.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "compiling kvsim's kernels" in notes[0] and str(folder) in notes[0]
    modules = {p.name.split(".")[0] for p in folder.rglob("*.nbi")}
    assert "token_scan" in modules
    assert not modules & {"word_scan", "gather", "manager_jit", "hash_kernels"}
    second = _python(code, env)
    assert second.returncode == 0 and second.stderr == ""
