"""Kvsim's side of the scheduler oracles: write step-clock workloads, run the drivers.

``vllm_sched_driver.py`` and ``sglang_sched_driver.py`` run under the oracle interpreter
(``$KVSIM_ORACLE_PYTHON``, else ``<repo>/.oracle-venv/bin/python``) and read the same
``.npz``: prompts, the output tokens each request generates, arrival steps, priorities.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DRIVERS = {"vllm": Path(__file__).with_name("vllm_sched_driver.py"),
           "sglang": Path(__file__).with_name("sglang_sched_driver.py")}
PROBES = {"vllm": "import einops, vllm.v1.core.sched.scheduler",
          "sglang": "import sglang.srt.managers.scheduler"}


def oracle_python(engine: str) -> tuple[Path | None, str]:
    """The oracle interpreter if it can import the engine's real scheduler, else (None, why)."""
    path = Path(os.environ.get("KVSIM_ORACLE_PYTHON") or ROOT / ".oracle-venv" / "bin" / "python")
    if not path.exists():
        return None, f"oracle interpreter {path} not found (run `make oracle`)"
    probe = subprocess.run([str(path), "-c", PROBES[engine]], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return None, f"{path} cannot import the real {engine} scheduler: {probe.stderr.strip()[-300:]}"
    return path, ""


def write_workload(path: Path | str, prompts: list, outputs: list, arrival, priority=None,
                   max_new_tokens=None, loras=None, salts=None, prompt_logprobs=None, logprob_starts=None) -> Path:
    """Requests as both drivers read them; ``outputs[i]`` is what request i generates.

    ``loras`` / ``salts``: per request an adapter name / cache salt, or None.
    ``prompt_logprobs`` (vLLM) / ``logprob_starts`` (SGLang, -1 none): the logprob arguments.
    """
    n = len(prompts)
    names = sorted({x for x in (loras or []) + (salts or []) if x is not None})
    code = {name: k for k, name in enumerate(names)}
    po = np.zeros(n + 1, np.int64)
    po[1:] = np.cumsum([len(p) for p in prompts])
    oo = np.zeros(n + 1, np.int64)
    oo[1:] = np.cumsum([len(o) for o in outputs])
    cat = lambda xs: np.concatenate([np.asarray(x, np.int64) for x in xs]) if n else np.zeros(0, np.int64)  # noqa: E731
    np.savez(path, prompt_tok=cat(prompts), prompt_off=po, out_tok=cat(outputs), out_off=oo,
             arrival=np.asarray(arrival, np.int64),
             priority=np.zeros(n, np.int64) if priority is None else np.asarray(priority, np.int64),
             max_new_tokens=(np.asarray([len(o) for o in outputs], np.int64) if max_new_tokens is None
                             else np.asarray(max_new_tokens, np.int64)),
             lora=np.array([code.get(x, -1) for x in (loras or [None] * n)], np.int64),
             salt=np.array([code.get(x, -1) for x in (salts or [None] * n)], np.int64),
             names=np.array(json.dumps(names)),
             prompt_logprobs=np.zeros(n, bool) if prompt_logprobs is None else np.asarray(prompt_logprobs, bool),
             logprob_start=(np.full(n, -1, np.int64) if logprob_starts is None
                            else np.asarray(logprob_starts, np.int64)))
    return Path(path)


def run_jobs(engine: str, jobs: list[dict[str, Any]], python: Path, timeout: float = 1800) -> list[dict]:
    """Run driver jobs (each: workload + engine settings) in one subprocess; one result per job."""
    with tempfile.TemporaryDirectory(prefix=f"kvsim-{engine}-sched-") as tmp:
        for k, job in enumerate(jobs):
            job.setdefault("out", str(Path(tmp) / f"result{k}.npz"))
        spec = Path(tmp) / "jobs.json"
        spec.write_text(json.dumps(jobs))
        proc = subprocess.run([str(python), str(DRIVERS[engine]), str(spec)], capture_output=True,
                              text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{engine} scheduler driver failed:\n{proc.stderr[-4000:]}")
        results = []
        for job in jobs:
            with np.load(job["out"]) as z:
                results.append({k: z[k] for k in z.files})
        return results
