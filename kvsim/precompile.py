"""Compile kvsim's kernels ahead of time: the build step of a wheel (``pip install .``,
``build_backend/kvsim_build.py``).

numba caches a kernel per signature, so the kernels are compiled by running what a user
runs: each *recipe* is a list of real kvsim commands (:func:`kvsim.cli.run`, in-process) on
generated logs, a token-id log, a chat log and a Mooncake hash-id log (:func:`write_inputs`),
each large enough for the compiled paths to engage (1 MiB for the token and chat scanners,
32K characters for the cl100k word path) and for the compiled tables to grow. The first
command on each log reads it with an empty trace cache, later ones map the stored trace.

The recipes run in two phases of two worker processes (:data:`PHASES`), each worker with
its own numba cache folder (two processes writing one index file can lose an entry); after
each phase the folders are merged (:func:`merge`) and the next phase starts from the merge.

    python -m kvsim.precompile OUT [--only tokens_apc,chat] [--jobs 2] [--check]

writes ``OUT/manifest.json`` and ``OUT/kernels/`` (the layout of :mod:`kvsim.kernels.prebuilt`)
for the kvsim package on ``PYTHONPATH``. ``--check`` then runs the recipes again in a fresh
process on a copy of the result, lists the kvsim kernels it still compiled (``KVSIM_KERNEL_LOG``;
none expected) and the cached kernels of the package that no recipe compiled (they compile
when a command first calls them, as without a precompile).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kvsim.kernels import prebuilt

TOKENS, CHAT, HASH_IDS, OUT = "{tokens}", "{chat}", "{hash_ids}", "{out}"
_SIM = ["simulate", "--per-request", f"{OUT}/per_request.jsonl"]
_STEPS = ["--replay", "steps", "--arrival-from", "timestamp", "--step-seconds", "0.05"]
_TIMED = ["--replay", "timed", "--model", "llama-3-8b", "--gpu", "H100-80GB"]

#: recipe -> the commands it runs (in this order, in one process)
RECIPES: dict[str, list[list[str]]] = {
    # token-id log: the token scanner, vLLM APC's hashes and its compiled sequential replay
    "tokens_apc": [["--no-trace-cache", *_SIM, "--policy", "apc", "--capacity", "1000000", TOKENS],
                   [*_SIM, "--policy", "apc", "--capacity", "1000000", TOKENS],
                   [*_SIM, "--policy", "apc", "--capacity", "20000", TOKENS]],
    "tokens_radix": [[*_SIM, "--policy", "radix", "--capacity", "1000000", TOKENS],
                     [*_SIM, "--policy", "radix", "--capacity", "20000", TOKENS]],
    # the engines' schedulers (vLLM's with the compiled manager)
    "steps": [[*_SIM, *_STEPS, "--policy", "all", "--capacity", "20000", TOKENS]],
    "timed": [[*_SIM, *_TIMED, "--policy", "all", "--num-gpu-blocks", "2000", HASH_IDS],
              [*_SIM, *_TIMED, "--policy", "all", TOKENS]],
    # Mooncake hash ids: tokens synthesized from the ids
    "hash_ids": [[*_SIM, "--policy", "all", "--capacity", "1000000", HASH_IDS]],
    # chat log: the chat scanner, the cl100k word path
    "chat": [["--no-trace-cache", "inspect", CHAT], ["inspect", CHAT],
             [*_SIM, "--policy", "all", "--capacity", "1000000", CHAT]],
    "analyze": [["analyze", TOKENS], ["analyze", CHAT]],
    "sweep": [["sweep", "--capacity", "1e4,1e5", "--policy", "all", "--jobs", "1", "--curve", TOKENS],
              ["sweep", "--capacity", "1e4,1e5", "--policy", "all", "--jobs", "1", *_TIMED, HASH_IDS]],
    "report": [["report", HASH_IDS, "-o", f"{OUT}/report.html", "--capacity", "20000"]],
    "fleet": [[*_SIM, "--policy", "all", "--capacity", "20000", "--replicas", "2", "--router", "cache_aware", TOKENS],
              [*_SIM, *_STEPS, "--policy", "all", "--capacity", "20000", "--replicas", "2", "--router",
               "prefix_hash", TOKENS],
              # Dynamo's index read from the compiled pools (the pools' keys of each routed prompt)
              [*_SIM, *_TIMED, "--policy", "apc", "--num-gpu-blocks", "2000", "--replicas", "2", "--router",
               "dynamo", HASH_IDS],
              # closed-loop sessions: the readable fleet over the compiled manager (its decode runs)
              [*_SIM, *_TIMED, "--policy", "apc", "--num-gpu-blocks", "2000", "--replicas", "2", "--router",
               "round_robin", "--arrivals", "closed-loop", CHAT]],
    # offload tiers: vLLM's native CPU offloading, LMCache, SGLang's HiCache
    "offload": [[*_SIM, "--policy", "apc", "--capacity", "20000", "--offload", tier, "--offload-size", "100000", TOKENS]
                for tier in ("native", "lmcache")]
               + [[*_SIM, "--policy", "radix", "--capacity", "20000", "--offload", "hicache", TOKENS]],
}
#: two workers, in two phases; each phase starts from the kernels the ones before compiled.
#: Most commands read a log and replay it through vLLM's engine, so the first phase compiles
#: those kernels (the token scanner and vLLM's | the chat scanner and the word path) and the
#: second the ones that build on them (the analyzer | the sweep and the report's kernels).
PHASES = ((("tokens_apc", "steps"), ("chat",)),
          (("analyze", "tokens_radix", "timed", "hash_ids", "fleet", "offload"), ("sweep", "report")))


# -- inputs ----------------------------------------------------------------------------------
def write_inputs(folder: Path) -> dict[str, Path]:
    """The generated logs (deterministic, about 1-3 MB each): a token-id log, a chat log and a
    Mooncake hash-id log, each over the sizes where the compiled paths engage and where the
    compiled tables grow (kernels a small log would never call)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    files = {"tokens": folder / "tokens.jsonl", "chat": folder / "chat.jsonl", "hash_ids": folder / "hash_ids.jsonl",
             "out": folder}
    systems = [rng.integers(0, 100_000, 600) for _ in range(4)]
    with open(files["tokens"], "w") as f:
        for i in range(260):
            prompt = np.concatenate([systems[i % 4], rng.integers(0, 100_000, int(rng.integers(50, 500)))])
            output = rng.integers(0, 100_000, int(rng.integers(1, 40)))
            f.write(json.dumps({"prompt_token_ids": prompt.tolist(), "output_token_ids": output.tolist(),
                                "timestamp": round(i * 0.05, 3)}) + "\n")
    with open(files["hash_ids"], "w") as f:
        for i in range(300):
            n_in = int(rng.integers(1600, 8000))  # 4 to 16 blocks of 512 tokens, the first 3 shared
            shared = list(range(i % 5 * 3, i % 5 * 3 + 3))
            ids = shared + list(range(100 + i * 20, 100 + i * 20 + (n_in + 511) // 512 - 3))
            f.write(json.dumps({"timestamp": i * 40, "input_length": n_in, "output_length": int(rng.integers(1, 300)),
                                "hash_ids": ids}) + "\n")
    _write_chat(files["chat"], rng)
    return files


def _write_chat(path: Path, rng) -> None:
    """Three-turn conversations (each turn resends the history and the replies) over more
    than 2,048 lines and 8,192 distinct words (the chat scanner's and the word path's tables
    grow), 300K tokens in the first batch (the compiled gather), a system prompt with a
    volatile value in its middle (analyze's divergence sites)."""
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    words = ["".join(rng.choice(letters, int(rng.integers(3, 9)))) for _ in range(20_000)]

    def text(n: int) -> str:
        return " ".join(words[int(k)] for k in rng.integers(200, len(words), n)) + "."

    head, tail = " ".join(words[:100]), " ".join(words[100:200])
    with open(path, "w") as f:
        for session in range(700):
            system = f"{head}. Session {int(rng.integers(10**8, 10**9))}. {tail}."
            messages = [{"role": "system", "content": system}]
            for turn in range(3):
                messages.append({"role": "user", "content": text(40)})
                reply = text(25)
                f.write(json.dumps({"messages": messages, "timestamp": round((session * 3 + turn) * 0.02, 3),
                                    "session_id": f"s{session}", "response": reply}) + "\n")
                messages = [*messages, {"role": "assistant", "content": reply}]


# -- one worker ------------------------------------------------------------------------------
def run_recipes(names: list[str], inputs: dict[str, Path]) -> None:
    """Run the recipes' commands in this process (their output discarded)."""
    from kvsim.cli import run

    values = {TOKENS: inputs["tokens"], CHAT: inputs["chat"], HASH_IDS: inputs["hash_ids"], OUT: inputs["out"]}
    for name in names:
        for command in RECIPES[name]:
            argv = [str(values.get(a, a)).replace(OUT, str(inputs["out"])) for a in command]
            code = run(argv)
            if code != 0:
                raise RuntimeError(f"kvsim {' '.join(argv)} exited with {code}")
    if "analyze" in names:
        grow_tables()


def grow_tables() -> None:
    """The hash tables' growth (``kernels/table.rehash``) for each value type the commands use:
    analyze's second-level table grows only on logs larger than the recipes' (a 48 MB chat
    log), the compiled pool's key table and the word table on others."""
    from kvsim.kernels.table import grow_table, new_table

    for dtype in (np.int64, np.int32):
        keys, vals = new_table(16, dtype)
        keys[:3] = (1, 2, 3)
        grow_table(keys, vals, 32)


# -- merging worker folders ------------------------------------------------------------------
def _read_index(path: Path):
    with open(path, "rb") as f:
        version = pickle.load(f)
        stamp, overloads = pickle.loads(f.read())
    return version, stamp, overloads


def _write_index(path: Path, version, stamp, overloads) -> None:
    from numba.core.serialize import dumps

    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(version, f, protocol=-1)
        f.write(dumps((stamp, overloads)))
    os.replace(tmp, path)


def merge(src: Path, dst: Path) -> None:
    """Add the kernels of numba cache folder ``src`` to ``dst``: a file ``dst`` lacks is
    copied; an index both have gets ``src``'s entries that ``dst`` lacks, their data files
    renumbered (numba names them ``<base>.<n>.nbc``)."""
    for index in sorted(src.rglob("*.nbi")):
        rel = index.relative_to(src)
        target = dst / rel
        base = index.name[:-len(".nbi")]
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            for data in index.parent.glob(f"{base}.*.nbc"):
                shutil.copyfile(data, target.parent / data.name)
            shutil.copyfile(index, target)
            continue
        version, stamp, theirs = _read_index(index)
        version_d, stamp_d, ours = _read_index(target)
        if (version, stamp) != (version_d, stamp_d):
            continue
        used = set(ours.values())
        n = 1
        for key, name in theirs.items():
            if key in ours:
                continue
            while f"{base}.{n}.nbc" in used:
                n += 1
            new = f"{base}.{n}.nbc"
            shutil.copyfile(index.parent / name, target.parent / new)
            ours[key] = new
            used.add(new)
        _write_index(target, version_d, stamp_d, ours)


# -- the driver ------------------------------------------------------------------------------
def source_tag(package: Path) -> str:
    """``<version>-<hash of every .py file of the package>``: one build's identity."""
    import kvsim

    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        digest.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{kvsim.__version__}-{digest.hexdigest()[:16]}"


def plan(names: list[str], jobs: int) -> list[list[list[str]]]:
    """The phases of :data:`PHASES` that hold the recipes ``names`` (recipes of no phase in a
    last one), each a list of worker groups; one worker a phase when ``jobs`` < 2."""
    phases = [[[n for n in group if n in names] for group in phase] for phase in PHASES]
    phases.append([[n for n in names if not any(n in g for phase in PHASES for g in phase)]])
    if jobs < 2:
        phases = [[[n for g in phase for n in g]] for phase in phases]
    phases = [[g for g in phase if g] for phase in phases]
    return [phase for phase in phases if phase]


def _worker_env(cache: Path, work: Path, log: Path | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "KVSIM_KERNEL_LOG")}
    env.update(NUMBA_CACHE_DIR=str(cache), KVSIM_CACHE_DIR=str(work / "trace-cache"))
    if log is not None:
        env["KVSIM_KERNEL_LOG"] = str(log)
    return env


def _spawn(names, inputs: Path, env: dict, stderr: Path) -> tuple[list[str], subprocess.Popen, Path]:
    """A worker running the recipes ``names`` (its stderr into a file: no pipe to fill)."""
    with open(stderr, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "kvsim.precompile", "--worker", ",".join(names),
                                 "--inputs", str(inputs)], env=env, stdout=subprocess.DEVNULL, stderr=err)
    return names, proc, stderr


def _wait(workers: list[tuple[list[str], subprocess.Popen, Path]]) -> None:
    failed = []
    for names, proc, stderr in workers:
        if proc.wait() != 0:
            failed.append(f"{','.join(names)}: {stderr.read_text(errors='replace')[-3000:]}")
    if failed:
        raise RuntimeError("precompile failed: " + "\n".join(failed))


def _tag_folders(cache: Path) -> list[Path]:
    """A worker's cache holds one folder, named after the build tag its kvsim used."""
    return [p for p in cache.iterdir() if p.is_dir()] if cache.is_dir() else []


def precompile(out: Path, names: list[str], jobs: int = 2, check: bool = False) -> dict:
    """Compile the recipes' kernels into ``out`` (``manifest.json`` and ``kernels/``).

    When ``out`` is the package's own ``prebuilt`` folder (the build), the manifest written
    first gives the workers' locator this build's tag; it is removed again if a worker
    fails, so that a failed precompile leaves a package without prebuilt kernels."""
    from importlib.metadata import version

    from kvsim.kernels.locator import PACKAGE

    t0 = time.perf_counter()
    given = os.environ.get("NUMBA_CACHE_DIR")
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out / prebuilt.KERNELS, ignore_errors=True)
    manifest = {"tag": source_tag(PACKAGE), "numba": version("numba"), "python": prebuilt.python_version(),
                "recipes": names}
    (out / prebuilt.MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    try:
        with tempfile.TemporaryDirectory(prefix="kvsim-precompile-") as d:
            work = Path(d)
            # this process unpickles numba's index files (which imports numba): never the user's cache
            os.environ["NUMBA_CACHE_DIR"] = str(work / "driver-cache")
            inputs = work / "inputs"
            write_inputs(inputs)
            merged = out / prebuilt.KERNELS
            merged.mkdir(parents=True, exist_ok=True)
            phases = plan(names, jobs)
            tags: list[str] = []
            phase_s = []
            for k, groups in enumerate(phases):
                t1 = time.perf_counter()
                caches = [work / f"cache{k}.{i}" for i in range(len(groups))]
                for cache in caches:  # each worker starts from the kernels compiled so far
                    for tag in tags[:1]:
                        shutil.copytree(merged, cache / tag)
                _wait([_spawn(g, inputs, _worker_env(c, work / f"w{k}.{i}"), work / f"w{k}.{i}.err")
                       for i, (g, c) in enumerate(zip(groups, caches))])
                for cache in caches:
                    for folder in _tag_folders(cache):
                        tags.append(folder.name)
                        merge(folder, merged)
                phase_s.append(round(time.perf_counter() - t1, 1))
            files = [p for p in merged.rglob("*") if p.is_file()]
            result = {"tag": manifest["tag"], "seconds": round(time.perf_counter() - t0, 1), "phases": phases,
                      "phase_seconds": phase_s,
                      "files": len(files), "bytes": sum(p.stat().st_size for p in files)}
            if check:
                result["compiled_again"] = check_compiles(merged, tags[0] if tags else manifest["tag"], names,
                                                          inputs, work)
                result["not_compiled"] = not_compiled(PACKAGE, merged)
    except BaseException:
        (out / prebuilt.MANIFEST).unlink(missing_ok=True)
        shutil.rmtree(out / prebuilt.KERNELS, ignore_errors=True)
        raise
    finally:
        os.environ.pop("NUMBA_CACHE_DIR", None)
        if given is not None:
            os.environ["NUMBA_CACHE_DIR"] = given
    return result


def check_compiles(kernels: Path, tag: str, names: list[str], inputs: Path, work: Path) -> list[str]:
    """The kvsim kernels the recipes still compile in a fresh process whose cache holds a
    copy of ``kernels`` (a list of ``module.function<TAB>signature``)."""
    cache = work / "check-cache"
    shutil.copytree(kernels, cache / tag)
    log = work / "check.log"
    _wait([_spawn(names, inputs, _worker_env(cache, work / "check", log), work / "check.err")])
    lines = log.read_text().splitlines() if log.exists() else []
    return [line for line in lines if line.startswith("kvsim.")]


def cached_kernels(package: Path) -> list[str]:
    """``folder/module.function`` of every ``@njit(cache=True)`` function of the package
    (inlined ones, which have no cache entry of their own, left out)."""
    import ast

    out = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef):
                continue
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and ast.unparse(deco.func).split(".")[-1] == "njit":
                    kw = {k.arg: ast.unparse(k.value) for k in deco.keywords}
                    if kw.get("cache") == "True" and kw.get("inline") not in ("'always'", '"always"'):
                        out.append(f"{path.parent.relative_to(package).as_posix()}/{path.stem}.{node.name}")
    return out


def not_compiled(package: Path, kernels: Path) -> list[str]:
    """The package's cached kernels that have no index file in ``kernels``."""
    have = {f"{p.parent.relative_to(kernels).as_posix()}/{p.name.split('-')[0]}" for p in kernels.rglob("*.nbi")}
    return [k for k in cached_kernels(package) if k not in have]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvsim.precompile", description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", type=Path, help="the folder to write (manifest.json, kernels/)")
    ap.add_argument("--only", default=",".join(RECIPES), help=f"recipes, a comma list of {', '.join(RECIPES)}")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--check", action="store_true", help="run the recipes again and list what still compiles")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--inputs", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        inputs = {k: args.inputs / f"{k}.jsonl" for k in ("tokens", "chat", "hash_ids")}
        inputs["out"] = args.inputs
        run_recipes(args.worker.split(","), inputs)
        return 0
    if args.out is None:
        ap.error("the output folder is required")
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        ap.error(f"unknown recipe(s) {', '.join(unknown)}; known: {', '.join(RECIPES)}")
    result = precompile(args.out, names, args.jobs, args.check)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
