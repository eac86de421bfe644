"""kvsim's build backend: setuptools' own, plus kvsim's kernels compiled into the wheel.

``pip install .`` and ``pip wheel .`` build a wheel; this backend then asks for kvsim's own
dependencies in the isolated build environment (numba, numpy and what the commands import)
and, once setuptools has copied the package into its build folder, runs
``python -m kvsim.precompile`` on that copy: the kernels the commands call are
compiled there and shipped in ``kvsim/kernels/prebuilt/`` (see ``kvsim/kernels/prebuilt.py``
for how they reach the user's kernel cache); then ``python -m kvsim.build_aot`` builds the
replays' kernels ahead of time into ``kvsim/kernels/prebuilt/aot/`` (``make venv`` does the
same in a checkout). An editable install (``pip install -e .``,
``make test``) gets neither: setuptools' requirements, no compilation.

``KVSIM_PRECOMPILE=0`` skips the compilation. If it fails, the wheel is built without
prebuilt kernels (one warning; the kernels are then compiled when first used, as before).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403 - every other hook is setuptools'
from setuptools.command.build_py import build_py as _build_py

#: set while this backend builds a (non-editable) wheel
_WHEEL = "KVSIM_BUILDING_WHEEL"
ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 1800


def _dependencies() -> list[str]:
    """``[project] dependencies`` of pyproject.toml."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        from setuptools.config.pyprojecttoml import load_file

        return list(load_file(ROOT / "pyproject.toml")["project"]["dependencies"])
    with open(ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def get_requires_for_build_wheel(config_settings=None):
    """setuptools' requirements and, unless KVSIM_PRECOMPILE=0, kvsim's dependencies (the
    precompile runs kvsim's commands)."""
    extra = [] if os.environ.get("KVSIM_PRECOMPILE") == "0" else _dependencies()
    return [*_setuptools.get_requires_for_build_wheel(config_settings), *extra]


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    os.environ[_WHEEL] = "1"
    try:
        return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    finally:
        os.environ.pop(_WHEEL, None)


class BuildPy(_build_py):
    """setuptools' build_py; in a wheel build, then the kernels into the build folder."""

    def run(self) -> None:
        super().run()
        if (os.environ.get(_WHEEL) and not getattr(self, "editable_mode", False)
                and os.environ.get("KVSIM_PRECOMPILE") != "0"):
            precompile_into(Path(self.build_lib).resolve())
            build_ahead_of_time(Path(self.build_lib).resolve())


def _run_on_build(build_lib: Path, module: str, out: Path) -> tuple[bool, str]:
    """``python -m module out`` on the package in ``build_lib``, with numba's and kvsim's caches
    in a temporary folder: (whether it succeeded, what it printed)."""
    path = [str(build_lib), *filter(None, [os.environ.get("PYTHONPATH")])]
    with tempfile.TemporaryDirectory(prefix="kvsim-build-") as d:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "NUMBA_CACHE_DIR": str(Path(d) / "numba"),
               "KVSIM_CACHE_DIR": str(Path(d) / "kvsim")}
        env.pop("KVSIM_KERNEL_LOG", None)
        try:
            done = subprocess.run([sys.executable, "-m", module, str(out)], env=env, capture_output=True, text=True,
                                  timeout=TIMEOUT_S, cwd=d)
        except (OSError, subprocess.SubprocessError) as e:
            return False, repr(e)
    if done.returncode != 0:
        return False, ((done.stdout.strip() or "") + "\n" + done.stderr[-3000:]).strip()
    return True, done.stdout.strip()


def precompile_into(build_lib: Path) -> bool:
    """Compile the kernels of the package in ``build_lib`` into its ``kvsim/kernels/prebuilt``
    (False, with a warning, if that failed: the wheel then has no prebuilt kernels)."""
    out = build_lib / "kvsim" / "kernels" / "prebuilt"
    shutil.rmtree(out, ignore_errors=True)
    print("kvsim: compiling its kernels for this machine into the wheel (token-id and chat readers, "
          "the vLLM and SGLang engines, analyze, sweep, report; 30-60 s; KVSIM_PRECOMPILE=0 skips)",
          file=sys.stderr, flush=True)
    ok, said = _run_on_build(build_lib, "kvsim.precompile", out)
    if not ok:
        shutil.rmtree(out, ignore_errors=True)
        print(f"WARNING: kvsim: compiling the kernels failed; the wheel has none prebuilt (they compile when "
              f"first used):\n{said}", file=sys.stderr, flush=True)
        return False
    print(f"kvsim: kernels compiled: {said}", file=sys.stderr, flush=True)
    return True


def build_ahead_of_time(build_lib: Path) -> bool:
    """Compile the readers' and replays' kernels ahead of time into the package in ``build_lib``
    (``kvsim/kernels/prebuilt/aot``, :mod:`kvsim.kernels.aot`; False, with a warning, if that
    failed: the wheel then loads numba's kernels, as without it)."""
    out = build_lib / "kvsim" / "kernels" / "prebuilt" / "aot"
    ok, said = _run_on_build(build_lib, "kvsim.build_aot", out)
    if not ok:
        shutil.rmtree(out, ignore_errors=True)
        print(f"WARNING: kvsim: building the kernels ahead of time failed; the wheel uses numba's:\n{said}",
              file=sys.stderr, flush=True)
        return False
    print(said, file=sys.stderr, flush=True)
    return True
