"""Kvsim's side of the offload-tier oracles: find the interpreter, write workloads, run drivers.

The drivers (``offload_vllm_driver.py``, ``offload_lmcache_driver.py``,
``offload_hicache_driver.py``) run under the oracle interpreter (``$KVSIM_ORACLE_PYTHON``,
else ``<repo>/.oracle-venv/bin/python``), one subprocess per batch of jobs; each job
writes its results to its ``out`` path (``.npz`` or ``.json``), read back here.
Workloads use the scheduler oracles' ``.npz`` layout (``sched_client.write_workload``).
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from sched_client import write_workload  # noqa: F401  (re-exported; tests/oracle on sys.path)

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DRIVERS = {"vllm": HERE / "offload_vllm_driver.py", "lmcache": HERE / "offload_lmcache_driver.py",
           "hicache": HERE / "offload_hicache_driver.py"}
# Cheap probes (the distributions at the pinned versions, without importing them: importing
# vLLM alone takes seconds); the setup script checks that the tier code really imports.
_VERSIONS = "import importlib.metadata as m, importlib.util as u; "
PROBES = {
    "vllm": _VERSIONS + "assert m.version('vllm') == '0.33.0', m.version('vllm'); assert u.find_spec('einops')",
    "lmcache": _VERSIONS + "assert m.version('lmcache') == '0.5.6', m.version('lmcache'); "
               "assert all(u.find_spec(n) for n in ('numba', 'blake3', 'sortedcontainers', 'aiofile'))",
    "hicache": _VERSIONS + "assert m.version('sglang') == '0.5.23', m.version('sglang'); "
               "assert m.version('vllm') == '0.33.0'",
}
JSON_KINDS = {"manager", "storage"}
_found: dict[str, tuple[Path | None, str]] = {}


def oracle_python(system: str) -> tuple[Path | None, str]:
    """The oracle interpreter if it holds the system's real tier code, else (None, why)."""
    if system in _found:
        return _found[system]
    path = Path(os.environ.get("KVSIM_ORACLE_PYTHON") or ROOT / ".oracle-venv" / "bin" / "python")
    if not path.exists():
        _found[system] = None, f"oracle interpreter {path} not found (run `make oracle`)"
    else:
        probe = subprocess.run([str(path), "-W", "ignore", "-c", PROBES[system]], capture_output=True,
                               text=True, check=False)
        if probe.returncode != 0:
            why = probe.stderr.strip().splitlines()[-1:] or ["?"]
            _found[system] = None, f"{path} lacks the real {system} tier code (run `make oracle`): {why[0][-300:]}"
        else:
            _found[system] = path, ""
    return _found[system]


def run_jobs(system: str, jobs: list[dict[str, Any]], python: Path, timeout: float = 900) -> list[Any]:
    """Run driver jobs in one subprocess; per job its ``.npz`` (dict) or ``.json`` result.

    Jobs whose ``kind`` is in :data:`JSON_KINDS` return JSON, the others ``.npz``; a job with
    ``record`` also returns its call log under ``"calls"``.
    """
    with tempfile.TemporaryDirectory(prefix=f"kvsim-{system}-tier-") as tmp:
        for k, job in enumerate(jobs):
            suffix = ".json" if job.get("kind") in JSON_KINDS else ".npz"
            job.setdefault("out", str(Path(tmp) / f"result{k}{suffix}"))
            for name in ("script", "ops"):
                if isinstance(job.get(name), list):           # inline data goes through a file
                    p = Path(tmp) / f"{name}{k}.json"
                    p.write_text(json.dumps(job[name]))
                    job[name] = str(p)
        spec = Path(tmp) / "jobs.json"
        spec.write_text(json.dumps(jobs))
        proc = subprocess.run([str(python), str(DRIVERS[system]), str(spec)], capture_output=True, text=True,
                              timeout=timeout, check=False, cwd=str(ROOT))
        if proc.returncode != 0:
            raise RuntimeError(f"{system} tier driver failed:\n{proc.stderr[-4000:]}")
        results: list[Any] = []
        for job in jobs:
            out = Path(job["out"])
            if out.suffix == ".json":
                results.append(json.loads(out.read_text()))
                continue
            with np.load(out) as z:
                res: dict[str, Any] = {k: z[k] for k in z.files}
            for k in ("counters", "info"):
                if k in res:
                    res[k] = json.loads(str(res[k]))
            calls = Path(str(out) + ".calls.json")
            if calls.exists():
                res["calls"] = json.loads(calls.read_text())
            results.append(res)
        return results
