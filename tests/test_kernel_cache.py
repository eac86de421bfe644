"""Kernels loaded from numba's cache without refreshing the whole target context
(kvsim.kernels.compile_cache._light_cache_loads): a loaded kernel runs and gives the same
result, the lowering modules only a compilation needs stay unimported, and a kernel compiled
after a load (one that needs those modules) compiles and runs as before."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CODE = r"""
import json, sys
import numpy as np
import kvsim, numba
from kvsim.io.readers.token_scan import line_bounds   # a kernel calling a kernel, allocating its result

buf = np.frombuffer(b"a\nbb\n\nccc\nd", np.uint8)
out = {"bounds": line_bounds(buf).tolist(),
       "lowering_loaded": "numba.np.linalg" in sys.modules or "numba.np.arraymath" in sys.modules}
if sys.argv[1] == "compile-after":
    from numba import njit
    from numba.typed import List

    @njit
    def sorted_list(a):                       # array sorting and a typed list: the lowering modules
        out = List()
        for x in np.sort(a):
            out.append(x * 2)
        return out
    out["compiled"] = list(sorted_list(np.array([3, 1, 2])))
print(json.dumps(out))
"""


def run(mode: str, cache: Path, log: Path) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "KVSIM_KERNEL_LOG": str(log)}
    done = subprocess.run([sys.executable, "-c", CODE, mode], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def compiled(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_loaded_kernel_runs_without_the_compilers_tables(tmp_path):
    first = run("plain", tmp_path / "cache", tmp_path / "first.log")
    assert compiled(tmp_path / "first.log")           # compiled (and cached) here
    assert first["bounds"] == [0, 2, 5, 6, 10, 11]
    assert first["lowering_loaded"]                  # a compilation loads them

    second = run("plain", tmp_path / "cache", tmp_path / "second.log")
    assert compiled(tmp_path / "second.log") == []    # loaded from the cache
    assert second["bounds"] == first["bounds"]
    assert not second["lowering_loaded"]             # the light load


def test_a_compilation_after_a_light_load(tmp_path):
    run("plain", tmp_path / "cache", tmp_path / "first.log")
    after = run("compile-after", tmp_path / "cache", tmp_path / "after.log")
    names = [line.split("\t")[0] for line in compiled(tmp_path / "after.log")]
    assert names[0] == "__main__.sorted_list"                  # (then numba's own overloads it uses)
    assert not [n for n in names if n.startswith("kvsim.")]    # the kvsim kernel was loaded
    assert after["bounds"] == [0, 2, 5, 6, 10, 11]
    assert after["compiled"] == [2, 4, 6]
