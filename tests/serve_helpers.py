"""Start ``kvsim serve`` (or the fake upstream) as a real process on a free loopback port."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:(\d+))/v1")


@dataclass
class Server:
    proc: subprocess.Popen
    url: str               # http://127.0.0.1:PORT
    log: Path

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def client(self, api_key: str = "EMPTY", **kw):
        from openai import OpenAI

        return OpenAI(base_url=self.base_url, api_key=api_key, max_retries=0, **kw)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def stderr(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _spawn(cmd: list[str], log: Path) -> tuple[subprocess.Popen, Path]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=HERE.parent)
    return proc, log


def _start(cmd: list[str], log: Path, timeout: float = 60.0) -> Server:
    return _wait(*_spawn(cmd, log), timeout)


def _wait(proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> Server:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        m = _LISTENING.search(line)
        if m:
            return Server(proc, m.group(1), log)
    proc.kill()
    raise RuntimeError(f"server did not start: {''.join(seen)} {log.read_text(errors='replace')}")


def _kvsim_cmd(args) -> list[str]:
    return [sys.executable, "-c", "from kvsim.cli import main; main()", "serve", *args]


def start_kvsim(tmp_path: Path, *args: str, name: str = "serve") -> Server:
    """``kvsim serve --port 0 ARGS`` in a subprocess; returns once it listens."""
    return _start(_kvsim_cmd(["--port", "0", *args]), tmp_path / f"{name}.log")


def start_kvsims(tmp_path: Path, specs: dict[str, list[str]]) -> dict[str, Server]:
    """Several servers started at once (start-up is mostly imports: they overlap).
    ``{port}`` in an argument is replaced by the port chosen for the first server."""
    port = free_port()
    procs = {}
    for i, (name, args) in enumerate(specs.items()):
        args = [a.replace("{port}", str(port)) for a in args]
        procs[name] = _spawn(_kvsim_cmd(["--port", str(port) if i == 0 else "0", *args]), tmp_path / f"{name}.log")
    return {name: _wait(*pl) for name, pl in procs.items()}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_fake_upstream(tmp_path: Path, *args: str) -> Server:
    """The scripted upstream of ``fake_upstream.py``."""
    return _start([sys.executable, str(HERE / "fake_upstream.py"), *args], tmp_path / "fake_upstream.log")


def read_record(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    x, y = np.asarray(a[:n]), np.asarray(b[:n])
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if len(diff) else n


def unlimited_cache_oracle(lines: list[dict], policy: str, block_size: int = 16) -> list[int]:
    """cached_tokens of each recorded request in an unlimited cache, from first principles.

    Nothing is ever evicted, so the cache holds every earlier request's computed tokens:
    its prompt and all outputs but the last sampled one (that one is never computed). A
    request reuses its longest prefix shared with any of them in its own namespace (LoRA
    adapter, cache_salt), at most ``len(prompt) - 1`` tokens (one is always recomputed);
    APC reuses whole blocks only (vLLM's chained block hashes), and none when the request
    asks for prompt logprobs; radix matches at most a logprob request's
    ``logprob_start_len``. Radix here is page size 1.
    """
    out = []
    held: list[tuple[tuple, list[int]]] = []
    for line in lines:
        prompt = line["prompt_token_ids"]
        ns = (line.get("lora"), line.get("cache_salt"))
        cap = len(prompt) - 1
        if policy == "radix" and line.get("logprob_start_len", -1) >= 0:
            cap = min(cap, line["logprob_start_len"])
        best = max((min(common_prefix(prompt, seq), cap) for key, seq in held if key == ns), default=0)
        if policy == "apc":
            best = 0 if line.get("prompt_logprobs") else best // block_size * block_size
        out.append(best)
        outputs = line["output_token_ids"] or [-1]
        held.append((ns, prompt + outputs[:-1]))
    return out


def wait_for_record(path: Path, lines: int, timeout: float = 15.0) -> list[dict]:
    """The record once it has ``lines`` lines (a proxy writes right after answering)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = read_record(path) if Path(path).exists() else []
        if len(rows) >= lines or time.monotonic() > deadline:
            return rows
        time.sleep(0.02)
