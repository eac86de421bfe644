"""Benchmark: ``kvsim serve`` on loopback — requests per second, the cache model's share of
the server's time, and the latency the proxy adds.

The workload is a realistic chat log (default ``traces/demo_mixture.jsonl``: support chats,
RAG, tenants with salts, LoRA adapters), replayed through the ``openai`` client: each
record's messages, its logged reply length as ``max_tokens``, its ``cache_salt``, its
adapter as the model name.

1. Throughput, per policy: the log (``--repeat`` times) from ``--clients`` concurrent
   clients (threads, one ``OpenAI`` client each); requests per second over the whole run.
   The server reports the CPU seconds spent in the cache model (``kvsim:cache_model_cpu_seconds``);
   divided by the server's CPU seconds (``/proc``) that is the model's share of the work.
2. Proxy overhead: one client, one request at a time, the log sent straight to a
   ``kvsim serve`` upstream and then through ``kvsim serve --upstream`` (caches reset
   before each pass); the overhead is the difference of the median latencies.

Servers run on one CPU and the clients on another when the machine has two (Linux).
Every figure is the median over ``--runs`` runs.

    .venv/bin/python bench/bench_serve.py                       # 3 runs, apc and radix
    .venv/bin/python bench/bench_serve.py --runs 5 --json out/bench_serve.json
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:(\d+))/v1")


def load_requests(path: Path) -> tuple[list[dict], list[str]]:
    """The log's requests as openai-client keyword arguments, and the adapters they name."""
    requests, adapters = [], set()
    for line in path.read_text().splitlines():
        rec = json.loads(line)
        kw = {"messages": rec["messages"], "max_tokens": int(rec.get("output_length") or rec.get("max_tokens") or 64)}
        extra = {}
        if rec.get("cache_salt"):
            extra["cache_salt"] = rec["cache_salt"]
        if rec.get("tenant"):
            kw["user"] = rec["tenant"]
        if rec.get("lora"):
            kw["model"] = rec["lora"]
            adapters.add(rec["lora"])
        else:
            kw["model"] = "kvsim"
        if extra:
            kw["extra_body"] = extra
        requests.append(kw)
    return requests, sorted(adapters)


class Server:
    """``kvsim serve`` in a subprocess, optionally pinned to some CPUs."""

    def __init__(self, args: list[str], cpus: set[int] | None) -> None:
        cmd = [sys.executable, "-c", "from kvsim.cli import main; main()", "serve", "--port", "0", *args]
        pre = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                     preexec_fn=pre, cwd=ROOT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = LISTENING.search(self.proc.stdout.readline())
            if m:
                self.url = m.group(1)
                return
        self.proc.kill()
        raise RuntimeError("kvsim serve did not start")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def metric(self, name: str) -> float:
        import httpx

        text = httpx.get(self.url + "/metrics").text
        m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def client(url: str):
    from openai import OpenAI

    return OpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0, timeout=120)


def throughput(policy: str, requests: list[dict], adapters: list[str], clients: int, cpus,
               engine: str = "fast") -> dict:
    lora = [a for name in adapters for a in ("--lora-modules", f"{name}=/adapters/{name}")]
    server = Server(["--policy", policy, "--implementation", engine, *lora], cpus["server"])
    try:
        warm = client(server.url)
        warm.chat.completions.create(model="kvsim", messages=[{"role": "user", "content": "warm up"}], max_tokens=2)
        cpu0, model0 = server.cpu_seconds(), server.metric("kvsim:cache_model_cpu_seconds_total")

        def work(c: int) -> int:
            api = client(server.url)
            for kw in requests[c::clients]:
                api.chat.completions.create(**kw)
            return len(requests[c::clients])

        t0 = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            done = sum(pool.map(work, range(clients)))
        wall = time.perf_counter() - t0
        cpu = server.cpu_seconds() - cpu0
        model = server.metric("kvsim:cache_model_cpu_seconds_total") - model0
    finally:
        server.stop()
    return {"requests": done, "req_per_s": done / wall, "server_cpu_ms_per_request": 1000 * cpu / done,
            "model_ms_per_request": 1000 * model / done, "model_share_of_server_cpu": model / cpu}


def proxy_overhead(requests: list[dict], adapters: list[str], cpus) -> dict:
    import httpx

    lora = [a for name in adapters for a in ("--lora-modules", f"{name}=/adapters/{name}")]
    upstream = Server(lora, cpus["server"])
    proxy = Server(["--upstream", upstream.url, *lora], cpus["server"])
    try:
        def one_pass(url: str) -> list[float]:
            httpx.post(url + "/reset_prefix_cache")
            api = client(url)
            out = []
            for kw in requests:
                t = time.perf_counter()
                api.chat.completions.create(**kw)
                out.append(time.perf_counter() - t)
            return out

        one_pass(proxy.url)  # warm both servers
        direct = one_pass(upstream.url)
        cpu0 = proxy.cpu_seconds()
        proxied = one_pass(proxy.url)
        proxy_cpu = proxy.cpu_seconds() - cpu0
    finally:
        proxy.stop()
        upstream.stop()
    d, p = statistics.median(direct), statistics.median(proxied)
    return {"requests": len(requests), "direct_median_ms": 1000 * d, "proxied_median_ms": 1000 * p,
            "overhead_ms": 1000 * (p - d), "proxy_cpu_ms_per_request": 1000 * proxy_cpu / len(requests)}


def cpu_plan() -> dict:
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:
        return {"server": None, "client": None}
    if len(cpus) < 2:
        return {"server": None, "client": None}
    os.sched_setaffinity(0, {cpus[1]})
    return {"server": {cpus[0]}, "client": {cpus[1]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log", type=Path, default=ROOT / "traces" / "demo_mixture.jsonl")
    ap.add_argument("--repeat", type=int, default=4, help="send the log this many times per throughput run")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--policies", default="apc,radix")
    ap.add_argument("--implementation", dest="engine", default="fast",
                    help="the server's --implementation (fast or reference)")
    ap.add_argument("--no-proxy", action="store_true", help="skip the proxy measurement")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    requests, adapters = load_requests(args.log)
    cpus = cpu_plan()
    print(f"{args.log.name}: {len(requests)} requests, {len(adapters)} adapters; servers on CPUs {cpus['server']}, "
          f"clients on {cpus['client']}")
    results: dict = {"log": str(args.log.name), "runs": args.runs, "clients": args.clients, "engine": args.engine,
                     "throughput": {}, "proxy": None}
    for policy in args.policies.split(","):
        runs = [throughput(policy, requests * args.repeat, adapters, args.clients, cpus, args.engine)
                for _ in range(args.runs)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        results["throughput"][policy] = {"median": med, "runs": runs}
        print(f"{policy} ({args.engine}): {med['req_per_s']:.0f} req/s with {args.clients} clients; server CPU "
              f"{med['server_cpu_ms_per_request']:.2f} ms/request, of which the cache model "
              f"{med['model_ms_per_request']:.2f} ms ({100 * med['model_share_of_server_cpu']:.0f}%)")
    if args.no_proxy:
        runs = []
    else:
        runs = [proxy_overhead(requests, adapters, cpus) for _ in range(args.runs)]
    if runs:
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        results["proxy"] = {"median": med, "runs": runs}
        print(f"proxy: median latency {med['direct_median_ms']:.2f} ms direct, {med['proxied_median_ms']:.2f} ms "
            f"through kvsim serve --upstream: {med['overhead_ms']:+.2f} ms per request "
            f"(the proxy's CPU: {med['proxy_cpu_ms_per_request']:.2f} ms per request)")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
