"""Kernels compiled when the wheel is built: kvsim's cache locator gives every copy of one build
the same kernel folder, the shipped kernels are copied into the user's folder without
overwriting anything, the build asks for numba only for a wheel, and a command run from a
relocated copy of a precompiled package compiles nothing (docs/performance.md, "The first
command after an install"; the timings are bench/bench_commands.py's, section first_run)."""
from __future__ import annotations

import importlib.util
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvsim.kernels import prebuilt
from kvsim.precompile import merge

ROOT = Path(__file__).resolve().parents[1]

CACHE_PATH = ("import kvsim, numba\n"
              "from kvsim.kernels.locator import locator_for\n"
              "from kvsim.io.readers.token_scan import line_bounds\n"
              "print(locator_for(line_bounds).get_cache_path())\n")


def copy_package(dest: Path, manifest: dict | None = None) -> Path:
    """A copy of the kvsim package under ``dest`` (as an install puts it in site-packages)."""
    shutil.copytree(ROOT / "kvsim", dest / "kvsim",
                    ignore=shutil.ignore_patterns("__pycache__", "prebuilt", "*.nbi", "*.nbc"))
    if manifest is not None:
        (dest / "kvsim" / "kernels" / "prebuilt").mkdir(parents=True)
        (dest / "kvsim" / "kernels" / "prebuilt" / "manifest.json").write_text(json.dumps(manifest))
    return dest


def python_in(site: Path, code: str, env: dict, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -c code`` importing kvsim from ``site``."""
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(site)}, cwd=cwd, timeout=600)


def numba_version() -> str:
    from importlib.metadata import version

    return version("numba")


def test_two_copies_of_one_build_share_their_kernel_folder(tmp_path):
    """The folder is <cache>/<build tag>/<module folder relative to kvsim>, wherever kvsim lies."""
    manifest = {"tag": "0.1.0-test", "numba": numba_version(), "python": prebuilt.python_version()}
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    paths = []
    for name in ("a", "b"):
        site = copy_package(tmp_path / name, manifest)
        done = python_in(site, CACHE_PATH, env, tmp_path)
        assert done.returncode == 0, done.stderr
        paths.append(done.stdout.strip())
    assert paths[0] == paths[1] == str(tmp_path / "cache" / "0.1.0-test" / "io" / "readers")


def test_checkouts_without_a_manifest_keep_their_kernels_apart(tmp_path):
    """No build tag (a checkout, an editable install): one folder per package location, as numba's own."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    paths = [python_in(copy_package(tmp_path / name), CACHE_PATH, env, tmp_path).stdout.strip() for name in "ab"]
    assert paths[0] != paths[1]
    assert all(p.startswith(str(tmp_path / "cache" / "src-")) and p.endswith("/io/readers") for p in paths)


def test_other_modules_keep_numbas_locators(tmp_path):
    mod = tmp_path / "mine.py"
    mod.write_text("from numba import njit\n@njit(cache=True)\ndef f(x):\n    return x + 1\n")
    code = ("import sys; sys.path.insert(0, sys.argv[1])\nimport kvsim, numba\nimport mine\n"
            "from kvsim.kernels.locator import locator_for\nprint(type(locator_for(mine.f)).__name__)\n")
    done = python_in(ROOT, code, {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}, tmp_path, str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "UserProvidedCacheLocator"


def test_seed_copies_what_is_missing_and_never_overwrites(tmp_path):
    src, dest = tmp_path / "shipped", tmp_path / "user"
    (src / "io" / "readers").mkdir(parents=True)
    (src / "io" / "readers" / "k.1.nbc").write_bytes(b"data")
    (src / "io" / "readers" / "k.nbi").write_bytes(b"shipped index")
    (src / "top.nbi").write_bytes(b"top")
    (dest / "io" / "readers").mkdir(parents=True)
    (dest / "io" / "readers" / "k.nbi").write_bytes(b"the user's index")
    assert prebuilt.seed(dest, src) == 2
    assert (dest / "io" / "readers" / "k.nbi").read_bytes() == b"the user's index"
    assert (dest / "io" / "readers" / "k.1.nbc").read_bytes() == b"data"
    assert (dest / "top.nbi").read_bytes() == b"top"
    assert not [p for p in dest.rglob("*") if ".tmp." in p.name]
    (src / "later.nbi").write_bytes(b"later")
    assert prebuilt.seed(dest, src) == 0 and not (dest / "later.nbi").exists()  # once: the marker


def test_seed_leaves_a_folder_it_cannot_write(tmp_path):
    src = tmp_path / "shipped"
    src.mkdir()
    (src / "k.nbi").write_bytes(b"x")
    (tmp_path / "a-file").write_text("")
    assert prebuilt.seed(tmp_path / "a-file" / "kernels", src) == 0


def test_shipped_kernels_are_used_only_with_the_numba_and_python_they_were_built_for():
    shipped = {"tag": "t", "numba": "0.68.1", "python": prebuilt.python_version()}
    assert prebuilt.usable(shipped, "0.68.1")
    assert not prebuilt.usable(shipped, "0.69.0")
    assert not prebuilt.usable({**shipped, "python": "2.7"}, "0.68.1")
    assert not prebuilt.usable(None, "0.68.1")


def _index(path: Path, entries: dict) -> None:
    with open(path, "wb") as f:
        pickle.dump("0.68.1", f)
        f.write(pickle.dumps(("stamp", entries)))


def test_merge_adds_the_entries_a_folder_lacks_with_their_data_renumbered(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    _index(a / "m.f-1.py311.nbi", {"sig0": "m.f-1.py311.1.nbc"})
    (a / "m.f-1.py311.1.nbc").write_bytes(b"a0")
    _index(b / "m.f-1.py311.nbi", {"sig0": "m.f-1.py311.1.nbc", "sig1": "m.f-1.py311.2.nbc"})
    (b / "m.f-1.py311.1.nbc").write_bytes(b"b0")
    (b / "m.f-1.py311.2.nbc").write_bytes(b"b1")
    _index(b / "m.g-9.py311.nbi", {"sig": "m.g-9.py311.1.nbc"})
    (b / "m.g-9.py311.1.nbc").write_bytes(b"g")
    merge(b, a)
    with open(a / "m.f-1.py311.nbi", "rb") as f:
        assert pickle.load(f) == "0.68.1"
        stamp, entries = pickle.loads(f.read())
    assert stamp == "stamp" and set(entries) == {"sig0", "sig1"}
    assert (a / entries["sig0"]).read_bytes() == b"a0" and (a / entries["sig1"]).read_bytes() == b"b1"
    assert (a / "m.g-9.py311.1.nbc").read_bytes() == b"g"


def test_only_a_wheel_build_asks_for_numba(tmp_path, monkeypatch):
    """The backend's requirements, from a copy of the project (setuptools runs egg_info there)."""
    pytest.importorskip("setuptools")  # pip installs it in the build environment; a venv may lack it
    for name in ("pyproject.toml", "README.md", "MANIFEST.in"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(ROOT / "build_backend", tmp_path / "build_backend")
    copy_package(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "build_backend"))
    monkeypatch.delenv("KVSIM_PRECOMPILE", raising=False)
    spec = importlib.util.spec_from_file_location("kvsim_build", tmp_path / "build_backend" / "kvsim_build.py")
    backend = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "kvsim_build", backend)
    spec.loader.exec_module(backend)
    assert any(r.startswith("numba") for r in backend.get_requires_for_build_wheel())
    assert not any(r.startswith("numba") for r in backend.get_requires_for_build_editable())
    monkeypatch.setenv("KVSIM_PRECOMPILE", "0")
    assert not any(r.startswith("numba") for r in backend.get_requires_for_build_wheel())


def test_a_failed_precompile_leaves_a_wheel_without_prebuilt_kernels(tmp_path, capsys, monkeypatch):
    """The build goes on: a warning, and no prebuilt folder in the build folder."""
    spec = importlib.util.spec_from_file_location("kvsim_build_copy", ROOT / "build_backend" / "kvsim_build.py")
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    (tmp_path / "kvsim" / "kernels" / "prebuilt").mkdir(parents=True)  # a stale one
    (tmp_path / "kvsim" / "kernels" / "prebuilt" / "manifest.json").write_text("{}")
    monkeypatch.setattr(backend, "TIMEOUT_S", 0.001)  # the precompile fails: it runs out of time
    assert backend.precompile_into(tmp_path) is False
    assert not (tmp_path / "kvsim" / "kernels" / "prebuilt").exists()
    assert "WARNING: kvsim: compiling the kernels failed" in capsys.readouterr().err


def test_a_failed_ahead_of_time_build_leaves_a_wheel_without_built_kernels(tmp_path, capsys, monkeypatch):
    """The build goes on: a warning, and no stale built module in the build folder."""
    spec = importlib.util.spec_from_file_location("kvsim_build_copy", ROOT / "build_backend" / "kvsim_build.py")
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    stale = tmp_path / "kvsim" / "kernels" / "prebuilt" / "aot"
    stale.mkdir(parents=True)
    (stale / "aot.json").write_text("{}")
    monkeypatch.setattr(backend, "TIMEOUT_S", 0.001)  # the build fails: it runs out of time
    assert backend.build_ahead_of_time(tmp_path) is False
    assert not stale.exists()
    assert "WARNING: kvsim: building the kernels ahead of time failed" in capsys.readouterr().err


def write_token_log(path: Path) -> None:
    """Over 1 MiB (the compiled scanner reads it), other ids and lengths than the build's log."""
    import numpy as np

    rng = np.random.default_rng(7)
    with open(path, "w") as f:
        for i in range(400):
            f.write(json.dumps({"prompt_token_ids": rng.integers(0, 50_000, int(rng.integers(100, 700))).tolist(),
                                "output_token_ids": rng.integers(0, 50_000, 5).tolist()}) + "\n")
    assert path.stat().st_size > 1 << 20


def run_simulate(site: Path, tmp_path: Path, log: Path, name: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """``kvsim simulate --policy apc`` from ``site`` with an empty user cache folder; the kvsim
    kernels it compiled (KVSIM_KERNEL_LOG)."""
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "KVSIM_KERNEL_LOG", "PYTHONPATH")}
    env.update(XDG_CACHE_HOME=str(tmp_path / f"{name}-user-cache"), KVSIM_CACHE_DIR=str(tmp_path / f"{name}-traces"),
               KVSIM_KERNEL_LOG=str(tmp_path / f"{name}.log"), PYTHONPATH=str(site))
    done = subprocess.run([sys.executable, "-c", "from kvsim.cli import main; main()", "simulate", "--policy", "apc",
                           "--capacity", "100000", str(log)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=600)
    lines = (tmp_path / f"{name}.log").read_text().splitlines() if (tmp_path / f"{name}.log").exists() else []
    return done, [line for line in lines if line.startswith("kvsim.")]


@pytest.mark.slow
def test_a_relocated_precompiled_package_compiles_nothing(tmp_path):
    """Precompile the token reader and APC (recipe tokens_apc) into a copy of the package, as
    the wheel build does; copy that package elsewhere (as pip installs it); then
    ``simulate --policy apc`` on another token-id log with an empty user cache compiles no
    kvsim kernel and says nothing about compiling, and the user's folder holds only the
    shipped files. The same command from a copy without them compiles the kernels."""
    build = copy_package(tmp_path / "build")
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "KVSIM_KERNEL_LOG")}
    env["PYTHONPATH"] = str(build)
    out = build / "kvsim" / "kernels" / "prebuilt"
    made = subprocess.run([sys.executable, "-m", "kvsim.precompile", str(out), "--only", "tokens_apc", "--jobs", "1"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert made.returncode == 0, made.stderr
    shipped = {p.relative_to(out / "kernels") for p in (out / "kernels").rglob("*") if p.is_file()}
    assert any(p.name.startswith("manager_jit.run_sequential") for p in shipped)
    site = tmp_path / "site"
    shutil.copytree(build, site)
    shutil.rmtree(build)
    log = tmp_path / "other.jsonl"
    write_token_log(log)

    done, compiled = run_simulate(site, tmp_path, log, "installed")
    assert done.returncode == 0, done.stderr
    assert compiled == []
    assert "compiling" not in done.stderr
    tag = json.loads((site / "kvsim" / "kernels" / "prebuilt" / "manifest.json").read_text())["tag"]
    kernels = tmp_path / "installed-user-cache" / "kvsim" / "kernels" / tag
    held = {p.relative_to(kernels) for p in kernels.rglob("*") if p.is_file()} - {Path(prebuilt.MARKER)}
    assert held == shipped  # seeded, and nothing written beside

    bare = copy_package(tmp_path / "bare")
    done, compiled = run_simulate(bare, tmp_path, log, "bare")
    assert done.returncode == 0, done.stderr
    assert any(line.startswith("kvsim.engines.vllm.manager_jit.run_sequential") for line in compiled)
