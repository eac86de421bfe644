"""Kernels built ahead of time (kvsim.kernels.aot) and kvsim's lazy njit (kvsim.kernels.jit).

The built copies must give the replays' results exactly, be called only with exactly the
types they were built for (anything else goes to numba), be dropped when a source changed,
and spare a command numba's import altogether.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvsim.kernels import aot
from kvsim.kernels.jit import Kernel, njit

TIMED = ["--replay", "timed", "--model", "llama-3-8b", "--gpu", "H100-80GB", "--num-gpu-blocks", "3000"]
#: runs a kvsim command, then says whether numba was imported
RUN = ("import sys, os; from kvsim.cli import run; rc = run(sys.argv[1:]); "
       "print('numba imported:', 'numba' in sys.modules, file=sys.stderr); os._exit(rc or 0)")


# -- the argument check -----------------------------------------------------------------------
class _Subclass(np.ndarray):
    """An array subclass (numba types one as another type)."""


def test_the_check_takes_exactly_the_built_types():
    fits = aot.checker([["a", "<i8", 1, "C", False], ["a", "<u8", 2, "C", False], ["i", "<i8"], ["f", "<f8"],
                        ["b"], ["t", [["a", "<i4", 1, "C", False], ["i", "<i8"]]]])
    a, m, t = np.arange(6), np.zeros((2, 3), np.uint64), (np.arange(3, dtype=np.int32), 4)
    good = [a, m, 3, 0.5, True, t]
    assert fits(good)
    assert fits([a, m, np.int64(3), np.float64(0.5), np.bool_(True), t])
    read_only = np.arange(6)
    read_only.flags.writeable = False
    for k, bad in [(0, a.astype(np.int32)), (0, a[::2]), (0, read_only), (0, a.reshape(2, 3)),
                   (0, a.view(_Subclass)),
                   (0, list(a)), (1, np.zeros((3, 2), np.uint64).T),
                   (2, 3.0), (2, True), (2, np.int32(3)), (3, 1), (3, np.float32(0.5)), (4, 1),
                   (5, (np.arange(3), 4)), (5, t + (1,)), (5, list(t))]:
        args = list(good)
        args[k] = bad
        assert not fits(args), (k, bad)
    assert not fits(good[:-1])


def test_a_read_only_array_fits_only_a_read_only_signature():
    ro = np.arange(3)
    ro.flags.writeable = False
    assert aot.checker([["a", "<i8", 1, "C", True]])([ro])
    assert not aot.checker([["a", "<i8", 1, "C", True]])([np.arange(3)])
    assert aot.checker([["a", "<i8", 1, "A", False]])([np.arange(6)[::2]])      # any layout


# -- the lazy njit -------------------------------------------------------------------------------
@njit(cache=False, inline="always")
def _twice(x):
    return 2 * x


@njit(cache=False)
def _sum_twice(values):
    s = 0
    for v in values:
        s += _twice(v)
    return s


def test_kernels_call_kernels_in_compiled_code():
    assert isinstance(_sum_twice, Kernel) and _sum_twice.__name__ == "_sum_twice"
    assert _sum_twice(np.arange(5)) == 20
    assert _sum_twice(values=np.arange(5)) == 20                 # keywords: numba's dispatcher
    assert len(_sum_twice.signatures) == 1           # numba's dispatcher, reached through the kernel
    assert _sum_twice.py_func(np.arange(5)) == 20


def test_kernel_modules_import_without_numba():
    code = ("import sys; import kvsim.engines.vllm.scheduler_jit, kvsim.engines.vllm.manager_jit, "
            "kvsim.kernels.multiset, kvsim.engines.vllm.rules_jit; print('numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# -- a build -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    if not (shutil.which("cc") or shutil.which("gcc")):
        pytest.skip("numba's pycc needs a C compiler (kvsim then runs numba's kernels; make venv warns)")
    out = tmp_path_factory.mktemp("aot")
    subprocess.run([sys.executable, "-m", "kvsim.build_aot", str(out)], check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict[str, Path]:
    from kvsim.precompile import write_inputs

    return write_inputs(tmp_path_factory.mktemp("logs"))


@pytest.fixture(scope="module")
def log(logs) -> Path:
    return logs["hash_ids"]


def _run(args: list[str], env: dict[str, str], per_request: Path | None) -> tuple[bytes, bool]:
    """A command's per-request file (else what it printed), and whether it imported numba."""
    more = [] if per_request is None else ["--per-request", str(per_request)]
    done = subprocess.run([sys.executable, "-c", RUN, *args, *more], env={**os.environ, **env, "COLUMNS": "200"},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = done.stdout.encode() if per_request is None else per_request.read_bytes()
    return out, "numba imported: True" in done.stderr


def test_the_build_records_its_kernels_and_sources(built):
    meta = json.loads((built / aot.META).read_text())
    assert set(meta["kernels"]) == set(aot.EXPORTS)
    assert aot.current(meta)
    # the kernels' modules, what they import (hashing's constants), and modules that make kernels of
    # other modules' functions (rules_jit of rules', reached only through rules' lazy __getattr__)
    assert {"engines/vllm/scheduler_jit.py", "kernels/table.py", "engines/vllm/hashing.py",
            "engines/vllm/rules_jit.py"} <= set(meta["sources"])


@pytest.mark.parametrize("fleet", [[], ["--replicas", "4", "--router", "dynamo"], ["--replicas", "3", "--router",
                                                                                    "round_robin"]])
def test_built_kernels_replay_exactly_without_numba(built, log, tmp_path, fleet):
    args = ["simulate", str(log), "--format", "mooncake", *TIMED, *fleet]
    ahead, numba_ahead = _run(args, {aot.DIR_ENV: str(built)}, tmp_path / "ahead.jsonl")
    jit, numba_jit = _run(args, {aot.ENV: "0"}, tmp_path / "jit.jsonl")
    assert ahead == jit
    assert not numba_ahead and numba_jit


@pytest.mark.parametrize("command", [["--no-trace-cache", "simulate", "--policy", "apc", "--capacity", "1000000",
                                      "{tokens}"],
                                     ["--no-trace-cache", "inspect", "{chat}"]])
def test_built_readers_read_exactly_without_numba(built, logs, tmp_path, command):
    args = [a.format(**logs) for a in command]
    per_request = (lambda tag: tmp_path / f"{tag}.jsonl") if "simulate" in args else (lambda tag: None)
    ahead, numba_ahead = _run(args, {aot.DIR_ENV: str(built)}, per_request("ahead"))
    jit, numba_jit = _run(args, {aot.ENV: "0"}, per_request("jit"))
    assert ahead == jit and len(ahead) > 500
    # (without built kernels a read takes a compiled path only where numba is imported already,
    # or, for the words of a chat log, after 16M characters: here the chunk path, no numba)
    assert not numba_ahead and numba_jit == ("simulate" in args)


def test_a_stale_build_is_not_used(built, log, tmp_path):
    stale = tmp_path / "stale"
    shutil.copytree(built, stale)
    meta = json.loads((stale / aot.META).read_text())
    meta["sources"]["kernels/table.py"] = "0" * 40          # as if table.py had changed since
    (stale / aot.META).write_text(json.dumps(meta))
    assert not aot.current(meta)
    args = ["simulate", str(log), "--format", "mooncake", *TIMED]
    used, numba_used = _run(args, {aot.DIR_ENV: str(stale)}, tmp_path / "stale.jsonl")
    fresh, _ = _run(args, {aot.DIR_ENV: str(built)}, tmp_path / "fresh.jsonl")
    assert numba_used and used == fresh


def test_other_argument_types_go_to_numba(built):
    code = """
import sys, numpy as np
from kvsim.kernels.multiset import _held_prefix
from kvsim.kernels.table import new_table
keys, _ = new_table(16, np.int64)
chain = np.arange(1, 4, dtype=np.uint64)
first = _held_prefix(keys, chain)
print(first, 'numba' in sys.modules)
print(_held_prefix(keys, chain[::2].copy()), _held_prefix(keys.astype(np.uint64), chain.astype(np.int64)), 'numba' in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, aot.DIR_ENV: str(built)},
                         capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "0 False"               # the built copy: no numba
    assert out[1].endswith("True")           # an int64 chain is not what was built: numba's
