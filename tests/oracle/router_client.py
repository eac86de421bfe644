"""Kvsim's side of the router oracles: find the oracle interpreter and run a router driver.

The interpreter is ``$KVSIM_ORACLE_PYTHON`` or ``<repo>/.oracle-venv/bin/python``;
:func:`oracle_python` returns None, with the reason in the second value, when it is missing
or lacks the package a driver needs.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent


def oracle_python(probe: str) -> tuple[Path | None, str]:
    """The oracle interpreter if it can run ``probe`` (Python code), else (None, why not)."""
    path = Path(os.environ.get("KVSIM_ORACLE_PYTHON") or ROOT / ".oracle-venv" / "bin" / "python")
    if not path.exists():
        return None, f"oracle interpreter {path} not found (run `make oracle`)"
    proc = subprocess.run([str(path), "-c", probe], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        return None, (f"{path} cannot run {probe!r} (scripts/oracle-setup-routers.sh installs it): "
                      f"{proc.stderr.strip()[-200:]}")
    return path, ""


def run_driver(driver: str, jobs: list[dict[str, Any]], python: Path, timeout: float = 120) -> list[Any]:
    """Run ``tests/oracle/<driver>`` on ``jobs`` in the oracle venv; its JSON output."""
    with tempfile.TemporaryDirectory(prefix="kvsim-router-oracle-") as tmp:
        spec, out = Path(tmp) / "jobs.json", Path(tmp) / "out.json"
        spec.write_text(json.dumps(jobs))
        proc = subprocess.run([str(python), str(HERE / driver), str(spec), str(out)],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"{driver} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text())
