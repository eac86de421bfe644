"""Kvsim's side of the vLLM oracle: write workloads, run ``vllm_driver.py`` in the oracle venv.

The oracle interpreter is ``$KVSIM_ORACLE_PYTHON`` or ``<repo>/.oracle-venv/bin/python``;
:func:`oracle_python` returns None (with the reason in :data:`REASON`) when it is missing or
cannot import vLLM's cache manager.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.io.trace.columns import Trace
from kvsim.drive.requests import output_token_arrays

ROOT = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("vllm_driver.py")
REASON = ""


def oracle_python() -> Path | None:
    """The oracle interpreter, if it can import vLLM 0.33's KV-cache manager."""
    global REASON
    path = Path(os.environ.get("KVSIM_ORACLE_PYTHON") or ROOT / ".oracle-venv" / "bin" / "python")
    if not path.exists():
        REASON = f"oracle interpreter {path} not found (run `make oracle`)"
        return None
    probe = subprocess.run([str(path), "-c", "import vllm.v1.core.kv_cache_manager"],
                           capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        REASON = f"{path} cannot import vllm.v1.core.kv_cache_manager: {probe.stderr.strip()[-300:]}"
        return None
    return path


def write_workload(trace: Trace, path: Path | str, lora_paths: dict[str, str] | None = None) -> Path:
    """The trace as the driver reads it: prompts, output tokens (as kvsim replays them), namespaces."""
    lora_paths = lora_paths or {}
    out, out_off = output_token_arrays(trace)
    names = {"lora": [[n, lora_paths.get(n, n)] for n in trace.lora_names], "salt": list(trace.salt_names)}
    np.savez(path, prompt_tok=np.asarray(trace.tokens), prompt_off=trace.offsets,
             out_tok=out.astype(np.int64), out_off=out_off, plp=trace.prompt_logprobs.astype(bool),
             lora=trace.lora, salt=trace.cache_salt, names=np.array(json.dumps(names)))
    return Path(path)


def run_jobs(jobs: list[dict[str, Any]], python: Path, timeout: float = 1800,
             env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run driver jobs (each: workload, block_size, num_gpu_blocks, ...) in one subprocess.

    ``env`` adds environment variables for the driver (e.g. ``PYTHONHASHSEED``).
    """
    with tempfile.TemporaryDirectory(prefix="kvsim-oracle-") as tmp:
        for k, job in enumerate(jobs):
            job.setdefault("out", str(Path(tmp) / f"result{k}.npz"))
        spec = Path(tmp) / "jobs.json"
        spec.write_text(json.dumps(jobs))
        proc = subprocess.run([str(python), str(DRIVER), str(spec)], capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, **(env or {})}, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"vLLM driver failed:\n{proc.stderr[-3000:]}")
        results = []
        for job in jobs:
            with np.load(job["out"]) as z:
                results.append({k: z[k] for k in z.files})
        return results


def split_hashes(result: dict[str, Any]) -> list[list[bytes]]:
    """Per-request vLLM block hashes (32-byte digests) returned with ``return_hashes``."""
    raw = result["hashes"].tobytes()
    off = result["hash_off"]
    return [[raw[32 * j:32 * (j + 1)] for j in range(off[i], off[i + 1])] for i in range(len(off) - 1)]
