"""Benchmark: whole ``kvsim`` commands as a user runs them, phase by phase.

Inputs are generated into a temporary folder (deterministic, deleted at the end), as
``bench_ingest.py`` builds them: ``tokens.jsonl``, the first ``--requests`` (1,000) Mooncake
conversation requests as a token-id log (the tokens kvsim synthesizes from the hash ids in a
128K vocabulary, seeded output ids of the logged lengths); ``chat.jsonl``, ``kvsim generate
support_chat --sessions 800 --turns 8`` (multi-turn, every turn resends the history; 48.5 MB;
``--chat-shape 285x17`` gives the shape of the log the issue measured: 56.7 MB, 4,839
requests, 10.4M prompt tokens);
``hash_ids.jsonl``, the same 1,000 Mooncake requests as hash ids; the first megabyte of each
(start-up: the same compiled paths on a small log) and the first line.

Sections (``--only``, comma-separated; default all but ``first_run``):

- ``phases``: each command below run whole (``bench/command_phases.py``: the command as the
  ``kvsim`` script runs it, its stages timed in the process: importing the CLI, numba's
  import, loading (or compiling) kernels, loading the tokenizer, reading, the trace cache's
  content hash and store, the replay, the per-request file), on the log and on its first
  megabyte, in turn; medians of ``--runs``. The trace cache is on and emptied before each run
  (the first command on a log), except where the command says ``--no-trace-cache``.
  Commands: ``simulate --policy apc`` and ``--policy radix`` (``--capacity 1000000
  --per-request``) on tokens.jsonl, ``simulate --replay steps --arrival-from timestamp --step-seconds 0.05`` on it, ``simulate --replay
  timed --model llama-3-8b --gpu H100-80GB --num-gpu-blocks 20000`` on hash_ids.jsonl,
  ``inspect`` on chat.jsonl;
- ``engines``: the real vLLM 0.33.0 ``KVCacheManager`` and SGLang 0.5.23 tree on the same
  token-id log (``plain_replay.py``, oracle interpreter), their replay time apart from their
  ``json.loads`` reading; kvsim's whole command minus the same command on the first megabyte
  (start-up cancelled), trace cache on and empty, as ``phases`` runs it;
- ``chat``: the chat log read whole (``kvsim --no-trace-cache inspect``) against a script
  running the per-request loop (parse, render the Llama-3 template, tiktoken encode), each
  minus the same on the log's first line (start-up cancelled; with ``--baseline`` the other
  code's command runs in turn too), and both in one process;
- ``second``: the second read of a log: a command that stores the trace (empty cache) and
  the next one (maps it), and a command on the Parquet file ``kvsim convert`` wrote;
- ``report``: ``kvsim report`` on ``traces/demo_mixture.jsonl`` (``--capacity 20000``) in turn
  with the same command with ``--jobs 1`` and ``KVSIM_SIDE_PROCESSES=0`` (its exact replays
  and charts one after the other), the pages compared byte for byte;
- ``first_run``: ``pip install`` of a clean export of the repository (``git archive HEAD``)
  into a fresh virtual environment under /tmp (``--fresh-venv``; reused when it holds
  kvsim), then a command with an empty user cache folder (no compiled kernels, no trace)
  and the same command again with the trace cache emptied; the commands: ``simulate
  --policy apc``, ``--policy radix`` and ``--replay steps`` on tokens.jsonl, ``inspect``
  and ``analyze`` on chat.jsonl, ``simulate --replay timed --policy all`` on hash_ids.jsonl.
  The first run's kvsim kernel compilations are counted (``KVSIM_KERNEL_LOG``).

    .venv/bin/python bench/bench_commands.py --runs 5
    KVSIM_ORACLE_PYTHON=.oracle-venv/bin/python .venv/bin/python bench/bench_commands.py --only engines
    .venv/bin/python bench/bench_commands.py --only first_run --fresh-venv /tmp/kvsim-fresh
    .venv/bin/python bench/bench_commands.py --only phases --baseline /tmp/kvsim-before  # old code in turn
    .venv/bin/python bench/bench_commands.py --only chat --runs 9 --baseline /tmp/kvsim-before
    .venv/bin/python bench/bench_commands.py --only chat --runs 7 --chat-shape 285x17
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench_ingest  # noqa: E402  (inputs and the chat loop, shared)

PHASES = HERE / "command_phases.py"
KVSIM = [sys.executable, "-c", "from kvsim.cli import main; main()"]
SECTIONS = ("phases", "engines", "chat", "second", "report", "first_run")


# -- inputs ----------------------------------------------------------------------------------
def make_inputs(tmp: Path, requests: int, chat_shape: str = "800x8") -> dict:
    files: dict = {"dir": tmp}
    sessions, turns = chat_shape.split("x")
    files["tokens"] = tmp / "tokens.jsonl"
    files["tokens_info"] = bench_ingest.write_tokens_log(files["tokens"], requests)
    files["tokens_small"] = bench_ingest.first_megabyte(files["tokens"], tmp / "tokens_small.jsonl")
    files["chat"] = tmp / "chat.jsonl"
    subprocess.run([*KVSIM, "generate", "support_chat", "-o", str(files["chat"]), "--sessions", sessions, "--turns", turns,
                    "--force"], check=True, stdout=subprocess.DEVNULL)
    files["chat_small"] = bench_ingest.first_megabyte(files["chat"], tmp / "chat_small.jsonl")
    files["chat_one"] = bench_ingest.first_line(files["chat"], tmp / "chat_one.jsonl")
    files["hash_ids"] = tmp / "hash_ids.jsonl"
    with open(bench_ingest.MOONCAKE) as src, open(files["hash_ids"], "w") as dst:
        for _, line in zip(range(requests), src):
            dst.write(line)
    files["hash_ids_small"] = bench_ingest.first_megabyte(files["hash_ids"], tmp / "hash_ids_small.jsonl")
    if files["hash_ids_small"].stat().st_size >= files["hash_ids"].stat().st_size:  # a 1,000-line file is < 1 MB
        with open(files["hash_ids"]) as src, open(tmp / "hash_ids_small.jsonl", "w") as dst:
            for _, line in zip(range(12), src):
                dst.write(line)
    return files


# -- running ---------------------------------------------------------------------------------
def run(cmd: list[str], env: dict | None = None) -> tuple[float, str]:
    """(wall seconds, stdout) of one process."""
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({done.returncode}):\n{done.stderr.decode()[-3000:]}")
    return wall, done.stdout.decode()


def profiled(args: list[str], env: dict, clear_cache: bool) -> dict:
    """One whole kvsim command with its phases (see command_phases.py)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    if clear_cache:
        shutil.rmtree(Path(env["KVSIM_CACHE_DIR"]) / "traces", ignore_errors=True)
    try:
        t0 = time.perf_counter()
        before = os.times()
        done = subprocess.run([sys.executable, str(PHASES), str(out), *map(str, args)], capture_output=True,
                              env={**os.environ, **env})
        wall = time.perf_counter() - t0
        exited_at = time.time()
        after = os.times()
        if done.returncode != 0:
            raise RuntimeError(f"kvsim {' '.join(map(str, args))} failed:\n{done.stderr.decode()[-3000:]}")
        data = json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)
    data["wall_s"] = wall
    data["cpu_s"] = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    data["exit_s"] = exited_at - data["ended_at"]  # the interpreter's shutdown (threads joined, memory freed)
    data["interpreter_s"] = wall - data["in_process_s"] - data["exit_s"]  # its start-up before this script ran
    return data


def med(values) -> float:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else 0.0


def summarize(runs: list[dict]) -> dict:
    names = sorted({k for r in runs for k in r["phases"]})
    return {"kvsim": runs[0]["kvsim"], "wall_s": med(r["wall_s"] for r in runs), "cpu_s": med(r["cpu_s"] for r in runs),
            "interpreter_s": med(r["interpreter_s"] for r in runs), "exit_s": med(r["exit_s"] for r in runs),
            "before_first_stage_s": med(r["before_first_stage_s"] for r in runs),
            "phases": {n: med(r["phases"].get(n, 0.0) for r in runs) for n in names},
            "walls": [round(r["wall_s"], 3) for r in runs]}


def paired(full: list[str], small: list[str], runs: int, env: dict, clear_cache: bool = True,
           baseline: dict | None = None) -> dict:
    """The command on the log and on its small copy, in turn; medians, and the median of the
    differences (start-up cancelled). With ``baseline`` (the environment of other code, e.g.
    its PYTHONPATH) that code runs in turn with this one, and its figures are under "baseline"."""
    variants = {"now": env, **({"baseline": {**env, **baseline}} if baseline else {})}
    got: dict = {v: ([], []) for v in variants}
    for _ in range(runs):
        for v, e in variants.items():
            got[v][0].append(profiled(full, e, clear_cache))
            got[v][1].append(profiled(small, e, clear_cache))
    out = {}
    for v, (a_runs, b_runs) in got.items():
        diffs = [a["wall_s"] - b["wall_s"] for a, b in zip(a_runs, b_runs)]
        cpu_diffs = [a["cpu_s"] - b["cpu_s"] for a, b in zip(a_runs, b_runs)]
        out[v] = {"full": summarize(a_runs), "small": summarize(b_runs), "difference_s": med(diffs),
                  "difference_cpu_s": med(cpu_diffs), "differences": [round(d, 3) for d in diffs]}
    return out if baseline else out["now"]


def commands(files: dict, per_request: Path) -> dict[str, tuple[list[str], list[str]]]:
    sim = ["simulate", "--capacity", "1000000", "--per-request", str(per_request)]
    steps = ["--replay", "steps", "--arrival-from", "timestamp", "--step-seconds", "0.05"]
    timed = ["simulate", "--replay", "timed", "--model", "llama-3-8b", "--gpu", "H100-80GB",
             "--num-gpu-blocks", "20000", "--per-request", str(per_request)]
    return {
        "simulate --policy apc (tokens.jsonl)": ([*sim, "--policy", "apc", files["tokens"]],
                                                 [*sim, "--policy", "apc", files["tokens_small"]]),
        "simulate --policy radix (tokens.jsonl)": ([*sim, "--policy", "radix", files["tokens"]],
                                                   [*sim, "--policy", "radix", files["tokens_small"]]),
        "simulate --replay steps --policy apc (tokens.jsonl)": (
            [*sim, *steps, "--policy", "apc", files["tokens"]], [*sim, *steps, "--policy", "apc", files["tokens_small"]]),
        "simulate --replay timed (hash_ids.jsonl)": ([*timed, files["hash_ids"]], [*timed, files["hash_ids_small"]]),
        "inspect (chat.jsonl)": (["inspect", files["chat"]], ["inspect", files["chat_small"]]),
    }


# -- sections --------------------------------------------------------------------------------
def bench_phases(files: dict, runs: int, env: dict, only: str | None, baseline: dict | None) -> dict:
    out = {}
    per_request = files["dir"] / "per_request.jsonl"
    for name, (full, small) in commands(files, per_request).items():
        if only and only not in name:
            continue
        profiled(full, env, True)  # kernels loaded (compiled once) before timing
        if baseline:
            profiled(full, {**env, **baseline}, True)
        out[name] = paired(full, small, runs, env, baseline=baseline)
        for v, r in (out[name].items() if baseline else [("now", out[name])]):
            print(f"  {name} [{v}]: {r['full']['wall_s']:.2f} s whole (CPU {r['full']['cpu_s']:.2f} s), "
                  f"{r['difference_s']:.2f} s beyond the first megabyte's command", file=sys.stderr, flush=True)
    return out


def oracle_python() -> str | None:
    python = os.environ.get("KVSIM_ORACLE_PYTHON") or str(ROOT / ".oracle-venv" / "bin" / "python")
    return python if Path(python).exists() else None


ENGINE_TIMER = """
import json, sys, time
sys.path.insert(0, {bench!r})
import plain_replay
read = plain_replay.read_log
spent = []
def timed_read(path):
    t = time.perf_counter(); r = read(path); spent.append(time.perf_counter() - t); return r
plain_replay.read_log = timed_read
path, policy, capacity, out = sys.argv[1:5]
t0 = time.perf_counter()
cached = (plain_replay.replay_apc if policy == "apc" else plain_replay.replay_radix)(path, int(float(capacity)))
total = time.perf_counter() - t0
json.dump({{"total_s": total, "read_s": sum(spent), "engine_s": total - sum(spent), "cached": cached}}, open(out, "w"))
"""


def bench_engines(files: dict, runs: int, real_runs: int, env: dict) -> dict:
    python = oracle_python()
    if python is None:
        return {"skipped": "no oracle interpreter (KVSIM_ORACLE_PYTHON or .oracle-venv)"}
    tokens = files["tokens_info"]["prompt_tokens"]
    per_request = files["dir"] / "per_request.jsonl"
    out = {}
    for policy in ("apc", "radix"):
        real = []
        for _ in range(real_runs):
            res = files["dir"] / f"real_{policy}.json"
            subprocess.run([python, "-c", ENGINE_TIMER.format(bench=str(HERE)), str(files["tokens"]), policy,
                            "1000000", str(res)], check=True)
            real.append(json.loads(res.read_text()))
        sim = ["simulate", "--capacity", "1000000", "--per-request", str(per_request), "--policy", policy]
        profiled([*sim, files["tokens"]], env, True)
        k = paired([*sim, files["tokens"]], [*sim, files["tokens_small"]], runs, env)
        ours = [json.loads(line)["cached_tokens"] for line in per_request.read_text().splitlines()]
        profiled([*sim, files["tokens"]], env, True)  # the per-request file of the whole log
        ours = [json.loads(line)["cached_tokens"] for line in per_request.read_text().splitlines()]
        engine_s = med(r["engine_s"] for r in real)
        out[policy] = {"real_engine_s": engine_s, "real_read_s": med(r["read_s"] for r in real),
                       "real_engine_mtok_s": tokens / engine_s / 1e6, "kvsim": k,
                       "kvsim_mtok_s": tokens / k["difference_s"] / 1e6, "ratio": engine_s / k["difference_s"],
                       "same_hits": ours == real[-1]["cached"]}
        print(f"  {policy}: real engine {engine_s:.2f} s, kvsim {k['difference_s']:.2f} s beyond start-up: "
              f"{out[policy]['ratio']:.1f}x, same hits {out[policy]['same_hits']}", file=sys.stderr, flush=True)
    return out


LOOP = """
import sys, time
sys.path.insert(0, {bench!r})
t0 = time.perf_counter()
from kvsim.io.tokenize.templates import get_template
from kvsim.io.tokenize.tokenizers import get_tokenizer
import bench_ingest
template = get_template("llama3")
tok = get_tokenizer("cl100k_base", template.special_tokens)
prompts, _ = bench_ingest.render_encode_loop(sys.argv[1], template, tok)
print(sum(map(len, prompts)))
"""


def bench_chat(files: dict, runs: int, env: dict, baseline: dict | None = None) -> dict:
    """The chat log read whole against the loop (start-up cancelled); with ``baseline`` (the
    environment of other code) that code's kvsim runs in turn too, its figures under "baseline"."""
    loop = [sys.executable, "-c", LOOP.format(bench=str(HERE))]
    inspect = ["--no-trace-cache", "inspect"]
    variants = {"kvsim": env, **({"baseline": {**env, **baseline}} if baseline else {})}
    walls: dict[str, list[float]] = {"loop": [], "loop_one": []}
    kv_runs: dict[str, tuple[list, list]] = {v: ([], []) for v in variants}
    for e in variants.values():
        profiled([*inspect, files["chat"]], e, False)
    for _ in range(runs):
        walls["loop"].append(run([*loop, str(files["chat"])], env)[0])
        walls["loop_one"].append(run([*loop, str(files["chat_one"])], env)[0])
        for v, e in variants.items():
            kv_runs[v][0].append(profiled([*inspect, files["chat"]], e, False))
            kv_runs[v][1].append(profiled([*inspect, files["chat_one"]], e, False))
    loop_d = med(a - b for a, b in zip(walls["loop"], walls["loop_one"]))
    out: dict = {"loop_s": med(walls["loop"]), "loop_one_s": med(walls["loop_one"]), "loop_minus_one_s": loop_d}
    for v, (full, one) in kv_runs.items():
        kv_d = med(a["wall_s"] - b["wall_s"] for a, b in zip(full, one))
        figures = {"kvsim_s": med(r["wall_s"] for r in full), "kvsim_one_s": med(r["wall_s"] for r in one),
                   "kvsim_minus_one_s": kv_d, "whole_ratio": med(walls["loop"]) / med(r["wall_s"] for r in full),
                   "startup_cancelled_ratio": loop_d / kv_d,
                   "run_ratios": [round((la - lb) / (a["wall_s"] - b["wall_s"]), 2) for la, lb, a, b
                                  in zip(walls["loop"], walls["loop_one"], full, one)],
                   "kvsim_phases": summarize(full), "kvsim_one_phases": summarize(one)}
        if v == "kvsim":
            out.update(figures)
        else:
            out[v] = figures
        print(f"  chat [{v}]: whole {figures['whole_ratio']:.1f}x, start-up cancelled "
              f"{figures['startup_cancelled_ratio']:.1f}x", file=sys.stderr, flush=True)
    in_process = bench_ingest.bench_chat({"chat": files["chat"], "mixture": files["chat"]}, runs)[0]
    out["in_process"] = {k: in_process[k] for k in ("loop_s", "kvsim_s", "ratio", "same_prompts")}
    print(f"  chat: in process {in_process['ratio']:.1f}x", file=sys.stderr, flush=True)
    return out


def bench_second(files: dict, runs: int, env: dict) -> dict:
    out = {}
    for name in ("tokens", "chat"):
        log = files[name]
        pq = files["dir"] / f"{name}.parquet"
        subprocess.run([*KVSIM, "--no-trace-cache", "convert", str(log), "-o", str(pq), "--force"], check=True,
                       stdout=subprocess.DEVNULL, env={**os.environ, **env})
        cmd = ["simulate", "--capacity", "1000000", "--policy", "apc"]
        first, second, parquet, nocache = [], [], [], []
        for _ in range(runs):
            first.append(profiled([*cmd, log], env, True))
            second.append(profiled([*cmd, log], env, False))
            parquet.append(profiled([*cmd, pq], env, True))
            nocache.append(profiled(["--no-trace-cache", *cmd, log], env, False))
        out[name] = {"first": summarize(first), "second": summarize(second), "parquet": summarize(parquet),
                     "no_cache": summarize(nocache),
                     "read_first_s": med(r["phases"].get("read", 0) for r in first),
                     "read_second_s": med(r["phases"].get("read", 0) for r in second),
                     "read_parquet_s": med(r["phases"].get("read", 0) for r in parquet)}
        o = out[name]
        print(f"  {name}: read {o['read_first_s']:.2f} s first, {o['read_second_s']:.2f} s second "
              f"({o['read_first_s'] / max(o['read_second_s'], 1e-9):.1f}x), {o['read_parquet_s']:.2f} s Parquet; whole "
              f"{o['first']['wall_s']:.2f} / {o['second']['wall_s']:.2f} / {o['parquet']['wall_s']:.2f} s",
              file=sys.stderr, flush=True)
    return out


def bench_report(files: dict, runs: int, env: dict) -> dict:
    """``kvsim report`` on the demo trace (``make demo``'s last command), whole processes, in turn
    with the same command run as before this round (``--jobs 1`` and ``KVSIM_SIDE_PROCESSES=0``:
    its exact replays and its charts one after the other); the two pages compared byte for byte."""
    trace = ROOT / "traces" / "demo_mixture.jsonl"
    variants = {"now": ({}, []), "in_turn": ({"KVSIM_SIDE_PROCESSES": "0"}, ["--jobs", "1"])}
    walls: dict[str, list[float]] = {v: [] for v in variants}
    pages: dict[str, bytes] = {}
    for _ in range(runs):
        for v, (extra_env, extra) in variants.items():
            page = files["dir"] / f"report_{v}" / "report.html"   # the same PNG names in both pages
            page.parent.mkdir(exist_ok=True)
            walls[v].append(run([*KVSIM, "report", str(trace), "--capacity", "20000", "-o", str(page), *extra],
                                {**env, **extra_env})[0])
            pages[v] = page.read_bytes()
    out = {v: {"wall_s": med(w), "walls": [round(x, 2) for x in w]} for v, w in walls.items()}
    out["ratio"] = out["now"]["wall_s"] / out["in_turn"]["wall_s"]
    out["same_page"] = pages["now"] == pages["in_turn"]
    print(f"  report (demo_mixture.jsonl): now {out['now']['wall_s']:.2f} s, replays and charts in turn "
          f"{out['in_turn']['wall_s']:.2f} s ({out['ratio']:.2f}x); same page: {out['same_page']}",
          file=sys.stderr, flush=True)
    return out


def bench_first_run(files: dict, runs: int, venv: Path) -> dict:
    kvsim = venv / "bin" / "kvsim"
    if not kvsim.exists():
        src = files["dir"] / "src"
        src.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        t = time.perf_counter()
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(src)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"  pip install . into {venv}: {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NUMBA_CACHE_DIR", "KVSIM_CACHE_DIR")}
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import kvsim; print(kvsim.__file__)"],
                          check=True, capture_output=True, text=True, cwd=files["dir"], env=clean).stdout.strip()
    if not site.startswith(str(venv)):
        raise RuntimeError(f"{venv} imports kvsim from {site}, not from its own site-packages")
    out = {"kvsim_module": site}
    timed = ["--replay", "timed", "--model", "llama-3-8b", "--gpu", "H100-80GB", "--num-gpu-blocks", "20000"]
    steps = ["--replay", "steps", "--arrival-from", "timestamp", "--step-seconds", "0.05"]
    cmds = {"simulate --policy apc (tokens.jsonl)": ["simulate", "--capacity", "1000000", "--policy", "apc",
                                                       str(files["tokens"])],
            "inspect (chat.jsonl)": ["inspect", str(files["chat"])],
            "simulate --policy radix (tokens.jsonl)": ["simulate", "--capacity", "1000000", "--policy", "radix",
                                                         str(files["tokens"])],
            "simulate --replay steps --policy apc (tokens.jsonl)": ["simulate", "--capacity", "1000000", *steps,
                                                                      "--policy", "apc", str(files["tokens"])],
            "simulate --replay timed --policy all (hash_ids.jsonl)": ["simulate", *timed, "--policy", "all",
                                                                        str(files["hash_ids"])],
            "analyze (chat.jsonl)": ["analyze", str(files["chat"])]}
    for name, args in cmds.items():
        firsts, seconds, notes, compiled = [], [], [], []
        for _ in range(runs):
            home = Path(tempfile.mkdtemp(prefix="kvsim-fresh-home-"))
            env = dict(clean)
            env.update(XDG_CACHE_HOME=str(home / "cache"), HOME=str(home), TIKTOKEN_CACHE_DIR=str(home / "tiktoken"))
            try:
                t = time.perf_counter()
                done = subprocess.run([str(kvsim), *args], capture_output=True, text=True, check=True,
                                      cwd=files["dir"], env={**env, "KVSIM_KERNEL_LOG": str(home / "compiled.log")})
                firsts.append(time.perf_counter() - t)
                notes.append([line for line in done.stderr.splitlines() if line.startswith("note")])
                log = home / "compiled.log"  # one line per kernel compiled (a cache miss)
                compiled.append(sum(line.startswith("kvsim.") for line in log.read_text().splitlines())
                                if log.exists() else 0)
                shutil.rmtree(home / "cache" / "kvsim" / "traces", ignore_errors=True)  # the trace cache empty again
                t = time.perf_counter()
                subprocess.run([str(kvsim), *args], capture_output=True, env=env, check=True, cwd=files["dir"])
                seconds.append(time.perf_counter() - t)
            finally:
                shutil.rmtree(home, ignore_errors=True)
        out[name] = {"first_s": med(firsts), "second_s": med(seconds), "ratio": med(firsts) / med(seconds),
                     "firsts": [round(x, 2) for x in firsts], "seconds": [round(x, 2) for x in seconds],
                     "notes": notes[-1], "kernels_compiled": compiled}
        print(f"  {name}: first {med(firsts):.2f} s, second {med(seconds):.2f} s ({out[name]['ratio']:.2f}x); "
              f"kvsim kernels compiled by the first {compiled}; notes {notes[-1]}", file=sys.stderr, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(s for s in SECTIONS if s != "first_run"),
                    help=f"sections, of {', '.join(SECTIONS)}")
    ap.add_argument("--command", help="phases: only the commands whose name holds this text")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--chat-shape", default="800x8", help="the chat log: support_chat SESSIONSxTURNS (285x17: the "
                    "issue's 58 MB log's shape, 4,839 requests, 10.4M prompt tokens)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--real-runs", type=int, default=1, help="runs of the real engines (engines)")
    ap.add_argument("--fresh-venv", type=Path, default=Path("/tmp/kvsim-fresh-venv"))
    ap.add_argument("--baseline", type=Path, help="phases, chat: also run the kvsim code in this folder (a checkout), "
                    "in turn with this one")
    ap.add_argument("--json", type=Path, help="write the measurements here")
    args = ap.parse_args()
    sections = args.only.split(",")
    results: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "load_average": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="kvsim-bench-commands-") as d:
        tmp = Path(d)
        env = {"KVSIM_CACHE_DIR": str(tmp / "cache")}  # never the user's trace cache
        files = make_inputs(tmp, args.requests, args.chat_shape)
        results["inputs"] = {k: v.stat().st_size for k, v in files.items() if isinstance(v, Path) and v.is_file()}
        results["tokens_log"] = files["tokens_info"]
        baseline = {"PYTHONPATH": str(args.baseline.resolve())} if args.baseline else None
        steps = {"phases": lambda: bench_phases(files, args.runs, env, args.command, baseline),
                 "engines": lambda: bench_engines(files, args.runs, args.real_runs, env),
                 "chat": lambda: bench_chat(files, args.runs, env, baseline),
                 "second": lambda: bench_second(files, args.runs, env),
                 "report": lambda: bench_report(files, args.runs, env),
                 "first_run": lambda: bench_first_run(files, args.runs, args.fresh_venv)}
        for name in SECTIONS:
            if name in sections:
                print(f"-- {name}", file=sys.stderr, flush=True)
                results[name] = steps[name]()
    results["load_average_after"] = os.getloadavg()
    text = json.dumps(results, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
