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

from kvsim.io.trace.columns import Trace

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
    # SGLang's native logprob arguments per request (None: no request asks for logprobs)
    return_logprob: list[bool] | None = None
    logprob_start: list[int] | None = None    # -1: SGLang's default

    def starts(self) -> list[int]:
        """kvsim's logprob_start_len per request: the start SGLang's match is capped at
        (-1 without logprobs, where SGLang ignores the start)."""
        if self.return_logprob is None:
            return [-1] * len(self.prompts)
        return [s if r else -1 for r, s in zip(self.return_logprob, self.logprob_start)]

    def trace(self) -> Trace:
        return Trace.from_prompts(self.prompts, outputs=self.outputs,
                                  loras=self.loras, cache_salts=self.salts, logprob_start_len=self.starts())


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


def add_logprob_requests(w: Workload, seed: int, p_prompt: float = 0.05, p_start: float = 0.04,
                         p_output: float = 0.03, p_abort: float = 0.005, page: int = 16) -> Workload:
    """Mark some requests as logprob requests, as clients send them to SGLang's native API.

    ``p_prompt``: prompt logprobs (``return_logprob`` with start 0, what the OpenAI
    completions API's ``echo`` + ``logprobs`` sends); ``p_start``: an explicit start inside
    the prompt, often one that cuts inside a page; ``p_output``: output logprobs only
    (start -1, no cap); ``p_abort``: a start past the prompt's end (SGLang refuses it).
    """
    rng = np.random.default_rng(seed)
    rl, st = [], []
    for prompt in w.prompts:
        L = len(prompt)
        u = rng.random()
        if u < p_prompt:
            rl.append(True), st.append(0)
        elif u < p_prompt + p_start:
            cut = int(rng.integers(0, L + 1))
            if rng.random() < 0.5 and L > page:  # just past a page boundary
                cut = min(L, int(rng.integers(1, L // page + 1)) * page + int(rng.integers(1, page)))
            rl.append(True), st.append(cut)
        elif u < p_prompt + p_start + p_output:
            rl.append(True), st.append(-1)
        elif u < p_prompt + p_start + p_output + p_abort:
            rl.append(True), st.append(L + int(rng.integers(1, 5)))
        else:  # a start without return_logprob: SGLang ignores it
            rl.append(False), st.append(int(rng.integers(0, L + 1)) if rng.random() < 0.02 else -1)
    w.return_logprob, w.logprob_start = rl, st
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
             names=json.dumps(names), configs=json.dumps(configs),
             return_logprob=np.array(w.return_logprob or [False] * len(w.prompts), bool),
             logprob_start=np.array(w.logprob_start or [-1] * len(w.prompts), np.int64))


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
