"""Randomized workloads for the radix differential tests, and the bridge to the oracle.

A workload is a list of requests (prompt ids, output ids, LoRA, cache salt) with shared
system prompts, multi-turn sessions (the next prompt is the previous prompt plus the
reply plus a new user turn), tenants with cache salts and LoRA adapters. It is written
to an ``.npz`` that ``sglang_driver.py`` replays through the real SGLang code.
"""
from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from kvsim.io.trace import Trace

REPO = Path(__file__).resolve().parents[2]
DRIVER = Path(__file__).with_name("sglang_driver.py")


def oracle_python() -> str:
    """The oracle interpreter, or skip the test with the reason."""
    py = os.environ.get("KVSIM_ORACLE_PYTHON") or str(REPO / ".oracle-venv" / "bin" / "python")
    if not Path(py).exists():
        pytest.skip(f"oracle interpreter {py} not found (run `make oracle`)")
    probe = subprocess.run([py, "-c", "import sglang.srt.mem_cache.unified_radix_cache"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"SGLang 0.5.23 not importable from {py}: {probe.stderr.strip()[-200:]}")
    return py


@dataclass
class Workload:
    prompts: list[np.ndarray]
    outputs: list[np.ndarray]
    loras: list[str | None]
    salts: list[str | None]

    def trace(self) -> Trace:
        return Trace.from_prompts(self.prompts, outputs=self.outputs,
                                  loras=self.loras, cache_salts=self.salts)


def make_workload(seed: int, n: int, *, vocab: int = 64, sys_len=(8, 120), turn_len=(1, 60),
                  out_len=(1, 24), sessions: int = 12, p_continue: float = 0.65,
                  loras: int = 2, salts: int = 2, p_ns: float = 0.3, p_retry: float = 0.0) -> Workload:
    """Shared system prompts, multi-turn sessions, LoRA and salt namespaces, small vocab.

    With ``p_retry`` a request re-sends an earlier prompt, whole or cut short (a client
    retrying or editing a turn), which exercises matches that end inside cached edges.
    """
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, vocab, rng.integers(*sys_len)) for _ in range(4)]
    history: dict[int, tuple[np.ndarray, str | None, str | None]] = {}
    w = Workload([], [], [], [])
    for _ in range(n):
        if p_retry and w.prompts and rng.random() < p_retry:
            j = int(rng.integers(len(w.prompts)))
            cut = int(rng.integers(1, len(w.prompts[j]) + 1))
            w.prompts.append(w.prompts[j][:cut].copy())
            w.outputs.append(rng.integers(0, vocab, rng.integers(*out_len)).astype(np.int64))
            w.loras.append(w.loras[j])
            w.salts.append(w.salts[j])
            continue
        s = int(rng.integers(0, sessions))
        turn = rng.integers(0, vocab, rng.integers(*turn_len))
        if s in history and rng.random() < p_continue:
            prev, lora, salt = history[s]
            prompt = np.concatenate([prev, turn])
        else:
            lora = f"lora{rng.integers(loras)}" if loras and rng.random() < p_ns else None
            salt = f"salt{rng.integers(salts)}" if salts and rng.random() < p_ns else None
            prompt = np.concatenate([systems[rng.integers(len(systems))], turn])
        out = rng.integers(0, vocab, rng.integers(*out_len))
        history[s] = (np.concatenate([prompt, out]), lora, salt)
        w.prompts.append(prompt.astype(np.int64))
        w.outputs.append(out.astype(np.int64))
        w.loras.append(lora)
        w.salts.append(salt)
    return w


def write_npz(path: Path, w: Workload, configs: list[dict]) -> None:
    names = sorted({x for x in w.loras + w.salts if x is not None})
    code = {nm: i for i, nm in enumerate(names)}
    po = np.zeros(len(w.prompts) + 1, np.int64)
    po[1:] = np.cumsum([len(p) for p in w.prompts])
    oo = np.zeros(len(w.outputs) + 1, np.int64)
    oo[1:] = np.cumsum([len(o) for o in w.outputs])
    np.savez(path, prompt_tok=_narrow(np.concatenate(w.prompts)), prompt_off=po,
             out_tok=_narrow(np.concatenate(w.outputs)), out_off=oo,
             lora=np.array([code.get(x, -1) for x in w.loras]),
             salt=np.array([code.get(x, -1) for x in w.salts]),
             names=json.dumps(names), configs=json.dumps(configs))


def _narrow(a: np.ndarray) -> np.ndarray:
    """int32 when every id fits (halves the file for long traces)."""
    if a.size and (a.min() < -(2**31) or a.max() >= 2**31):
        return a.astype(np.int64)
    return a.astype(np.int32)


def run_oracle(jobs: list[tuple[Workload, list[dict]]], tmp: Path, timeout: int = 600) -> list[list[dict]]:
    """Replay each (workload, configs) through the real SGLang in one subprocess."""
    py = oracle_python()
    args = []
    for i, (w, configs) in enumerate(jobs):
        npz = tmp / f"sglang_w{i}.npz"
        write_npz(npz, w, configs)
        args.append(str(npz))
    out = tmp / "sglang_result.json"
    proc = subprocess.run([py, str(DRIVER), *args, "--out", str(out)], capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"sglang oracle failed:\n{proc.stderr[-4000:]}")
    results = json.loads(out.read_text())
    return [results[str(i)] for i in range(len(jobs))]
