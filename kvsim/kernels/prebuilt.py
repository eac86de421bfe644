"""Kernels compiled when the wheel was built, shipped in ``kvsim/kernels/prebuilt/``, and
copied into the user's kernel cache the first time numba is imported.

The build (``build_backend/kvsim_build.py``, through :mod:`kvsim.precompile`)
writes ``prebuilt/manifest.json`` (the build tag, numba's and Python's versions) and
``prebuilt/kernels/`` (numba's index and data files, laid out as :mod:`.locator` places
them). :func:`seed` copies the files the user's folder lacks into ``<kernel cache>/<build
tag>/``; then numba loads them as kernels it had compiled itself.

Why a copy rather than a locator that reads the shipped folder: numba's cache reads and
writes one folder per module, and a kernel the build did not compile (another signature, or
another machine's CPU) is written next to the others. A site-packages folder may be
read-only, and sharing one index file between the shipped folder and the user's would mean
writing into site-packages. The copy is a few MB, once a build (a marker file), and it never
overwrites a file: each is written under a temporary name and linked into place, so two
processes seeding at once, or one compiling while another seeds, each see whole files. A
folder that cannot be written is left alone (numba then compiles as before).

A build whose numba or Python differs from the running one is ignored (numba would not load
its files anyway); so are a checkout and an editable install, which have no manifest.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import uuid
from pathlib import Path

from kvsim.kernels.aot import python_version

FOLDER = Path(__file__).resolve().parent / "prebuilt"
MANIFEST = "manifest.json"
KERNELS = "kernels"
MARKER = ".seeded"


@functools.lru_cache(maxsize=1)
def manifest() -> dict | None:
    """The shipped manifest (``tag``, ``numba``, ``python``), or None when there is none."""
    try:
        data = json.loads((FOLDER / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("tag"), str) else None


def usable(shipped: dict | None, numba_version: str) -> bool:
    """Whether the shipped kernels were built for this numba and this Python."""
    return bool(shipped) and shipped.get("numba") == numba_version and shipped.get("python") == python_version()


def seed(dest: Path, source: Path = FOLDER / KERNELS) -> int:
    """Copy every file under ``source`` that ``dest`` lacks into ``dest`` (never over a file),
    then leave :data:`MARKER` there so that later processes skip the walk. Returns how many
    files were copied; a folder that cannot be written is left as it is."""
    if (dest / MARKER).exists() or not source.is_dir():
        return 0
    copied = 0
    try:
        # data files (.nbc) before the index files (.nbi) that name them
        for path in sorted((p for p in source.rglob("*") if p.is_file()), key=lambda p: p.suffix == ".nbi"):
            target = dest / path.relative_to(source)
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if _place(path, target):
                copied += 1
        (dest / MARKER).touch()
    except OSError:
        pass
    return copied


def _place(src: Path, target: Path) -> bool:
    """Copy ``src`` to ``target`` whole or not at all, and never over an existing file."""
    tmp = target.with_name(f"{target.name}.tmp.{uuid.uuid4().hex[:16]}")
    shutil.copyfile(src, tmp)
    try:
        os.link(tmp, target)  # fails if target exists: another process placed it first
        return True
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links
        if target.exists():
            return False
        os.replace(tmp, target)
        return True
    finally:
        if tmp.exists():
            tmp.unlink()


def seed_user_cache() -> int:
    """At numba's import: seed this build's kernel folder from the shipped kernels."""
    shipped = manifest()
    if shipped is None:
        return 0
    import numba

    if not usable(shipped, numba.__version__):
        return 0
    from kvsim.kernels.locator import kernel_root

    return seed(kernel_root())
