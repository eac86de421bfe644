"""Drive the REAL SGLang gateway (smg 1.13.0, or sglang-router 0.3.2) over HTTP on 127.0.0.1.

Run in the oracle venv: ``python router_smg_driver.py JOBS.json OUT.json``. Each job holds
``package`` (``smg`` or ``sglang_router``: the folder under ``<venv>/routers/`` holding it),
``workers``, ``args`` (extra gateway flags) and ``ops``:

- ``send``: ``rid, text, hold``: POST ``/generate`` through the gateway; a fake worker
  records which of them got it. ``hold``: the worker keeps the response open until the
  ``release`` of ``rid``, so the gateway counts it in flight; otherwise it answers at once
  and the driver waits for the answer.
- ``release``: ``rid``: the fake worker answers; the driver waits for the client's response.
- ``loads``: ``waiting, running, usage`` (per worker): what the fake workers report on ``/v1/loads``
  from now on; the driver waits until the gateway has polled every worker again.

Output per job: ``workers``, the index (fake worker k = the k-th ``--worker-urls`` entry)
of the worker that received each ``send``, and ``loads``, the gateway's own in-flight count
per worker (its ``/workers`` listing) just before each send. Fake workers and the gateway listen on 127.0.0.1 only; the gateway
is stopped at the end of each job.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Worker(ThreadingHTTPServer):
    """A fake SGLang worker: health, models, loads, and /generate answered when released."""

    daemon_threads = True

    def __init__(self, index: int, fleet: "Fleet") -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.index, self.fleet = index, fleet
        self.waiting, self.running, self.usage, self.polls = 0, 0, 0.0, 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Worker

    def log_message(self, *args) -> None:  # noqa: D102
        pass

    def _json(self, obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        w = self.server
        if self.path.startswith("/v1/loads") or self.path.startswith("/get_load"):
            w.polls += 1
            load = {"dp_rank": 0, "num_running_reqs": w.running, "num_waiting_reqs": w.waiting,
                    "num_total_reqs": w.waiting + w.running, "num_used_tokens": int(w.usage * 1_000_000),
                    "max_total_num_tokens": 1_000_000, "token_usage": w.usage, "utilization": w.usage}
            return self._json({"timestamp": "", "dp_rank_count": 1, "loads": [load], **load})
        if self.path.startswith("/v1/models"):
            return self._json({"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "sglang",
                                                            "root": "fake", "max_model_len": 1 << 20}]})
        return self._json({"status": "ok"})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        fleet = self.server.fleet
        rid = body.get("rid") or fleet.by_text.get(body.get("text"))
        gate = fleet.arrived(rid, self.server.index)
        if gate is not None:
            gate.wait(30)
        self._json({"text": "x", "meta_info": {"id": str(rid), "finish_reason": {"type": "stop"},
                                                "prompt_tokens": 1, "completion_tokens": 1}})


class Fleet:
    """The fake workers, the gateway process, and what each request did."""

    def __init__(self, job: dict, venv: Path) -> None:
        self.job = job
        self.lock = threading.Lock()
        self.got: dict[str, int] = {}
        self.seen: dict[str, threading.Event] = {}
        self.gates: dict[str, threading.Event] = {}
        self.clients: dict[str, threading.Thread] = {}
        self.by_text: dict[str, str] = {}
        self.before: dict[str, list[int]] = {}     # the gateway's in-flight per worker before each send
        self.workers = [Worker(k, self) for k in range(job["workers"])]
        for w in self.workers:
            threading.Thread(target=w.serve_forever, daemon=True).start()
        for attempt in range(3):        # a port picked free can be taken before the gateway binds it
            try:
                self._launch(job, venv)
                return
            except RuntimeError:
                if attempt == 2:
                    raise

    def _launch(self, job: dict, venv: Path) -> None:
        self.port, metrics = free_port(), free_port()
        module = "smg" if job["package"] == "smg" else "sglang_router.launch_router"
        cmd = [sys.executable, "-m", module, *(["launch"] if job["package"] == "smg" else []),
               "--host", "127.0.0.1", "--port", str(self.port),
               "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics),
               "--worker-urls", *[w.url for w in self.workers], *job.get("args", [])]
        env = dict(os.environ, PYTHONPATH=str(venv / "routers" / job["package"]), RUST_LOG="error")
        self.log = open(os.environ.get("KVSIM_SMG_LOG", os.devnull), "w")
        # a session of its own: the launcher forks the router, and close() stops them both
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_up()

    def _wait_up(self) -> None:
        end = time.monotonic() + 120      # a loaded 2-core machine starts the gateway slowly
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}")
            try:
                rows = self.worker_rows()
                if len(rows) == len(self.workers) and all(r.get("is_healthy", True) for r in rows):
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        raise TimeoutError("gateway did not register its workers")

    def worker_rows(self) -> list[dict]:
        """The gateway's own list of workers (with its in-flight ``load`` per worker)."""
        raw = urllib.request.urlopen(f"http://127.0.0.1:{self.port}/workers", timeout=2).read()
        return json.loads(raw)["workers"]

    def settle(self) -> None:
        """Wait until the gateway's in-flight total equals the requests held open."""
        held = sum(1 for rid, g in self.gates.items() if not g.is_set())
        end = time.monotonic() + 10
        while time.monotonic() < end:
            if sum(r.get("load", 0) for r in self.worker_rows()) == held:
                return
            time.sleep(0.002)
        raise TimeoutError("the gateway's in-flight count did not settle")

    def arrived(self, rid: str, worker: int) -> threading.Event | None:
        with self.lock:
            self.got[rid] = worker
            self.seen.setdefault(rid, threading.Event()).set()
            return self.gates.get(rid)

    def _post(self, op: dict) -> None:
        data = json.dumps({"text": op["text"], "rid": op["rid"],
                           "sampling_params": {"max_new_tokens": 1}}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/generate", data=data,
                                     headers={"Content-Type": "application/json"})
        urllib.request.urlopen(req, timeout=60).read()

    def send(self, op: dict) -> None:
        rid = op["rid"]
        try:
            by_url = {r["url"]: r.get("load", 0) for r in self.worker_rows()}
            self.before[rid] = [by_url.get(w.url, -1) for w in self.workers]
        except (OSError, ValueError, KeyError):
            self.before[rid] = []
        self.by_text[op["text"]] = rid
        with self.lock:
            self.seen.setdefault(rid, threading.Event())
            if op.get("hold"):
                self.gates[rid] = threading.Event()
        if op.get("hold"):
            t = threading.Thread(target=self._post, args=(op,), daemon=True)
            t.start()
            self.clients[rid] = t
            if not self.seen[rid].wait(30):
                raise TimeoutError(f"{rid} never reached a worker")
        else:
            self._post(op)
            self.settle()          # the gateway's in-flight decrement follows the response

    def release(self, op: dict) -> None:
        self.gates[op["rid"]].set()
        self.clients[op["rid"]].join(30)
        self.settle()

    def loads(self, op: dict) -> None:
        before = [w.polls for w in self.workers]
        running = op.get("running") or [0] * len(self.workers)
        for w, q, r, u in zip(self.workers, op["waiting"], running, op["usage"]):
            w.waiting, w.running, w.usage = q, r, u
        end = time.monotonic() + 30
        while any(w.polls < b + 2 for w, b in zip(self.workers, before)):
            if time.monotonic() > end:
                raise TimeoutError("the gateway stopped polling loads")
            time.sleep(0.02)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        for g in self.gates.values():
            g.set()
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait()
        self._signal(signal.SIGKILL)          # whatever the launcher left behind
        for w in self.workers:
            w.shutdown()
            w.server_close()
        self.log.close()


def run(job: dict, venv: Path) -> dict:
    fleet = Fleet(job, venv)
    try:
        for op in job["ops"]:
            getattr(fleet, op["op"])(op)
        sends = [op["rid"] for op in job["ops"] if op["op"] == "send"]
        return {"workers": [fleet.got[r] for r in sends], "loads": [fleet.before[r] for r in sends]}
    finally:
        fleet.close()


def main() -> None:
    jobs = json.loads(Path(sys.argv[1]).read_text())
    venv = Path(sys.prefix)
    with ThreadPoolExecutor(max_workers=len(jobs) or 1) as pool:    # one gateway per job, side by side
        results = list(pool.map(lambda job: run(job, venv), jobs))
    Path(sys.argv[2]).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
