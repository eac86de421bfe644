"""Benchmark: reading prompt logs, end to end, against plain scripts on the same files.

Every input is generated into a temporary folder (deterministic, deleted at the end):

- ``tokens.jsonl``: the first ``--requests`` (1,000) Mooncake conversation requests as a
  pre-tokenized log (``prompt_token_ids`` + ``output_token_ids`` + ``timestamp``): the
  prompt tokens kvsim synthesizes from the 512-token hash ids, mapped into a 128K
  vocabulary, and seeded random output ids of the logged output length;
- ``chat.jsonl``: ``kvsim generate support_chat`` scaled up (multi-turn: every turn resends
  the system prompt and the history) and ``mixture.jsonl`` (``kvsim generate mixture``);
- ``big.jsonl`` (``--big``): the whole Mooncake conversation trace written the same way,
  about 1 GB, for peak memory;
- one-request copies of each log (start-up) and the token log's first megabyte (to cancel
  start-up out of the end-to-end figures).

Sections (``--only``, comma-separated; default all):

- ``parsers``: token-id JSONL parsers on the same bytes: ``json.loads``, orjson, msgspec,
  pysimdjson (each when installed) turning every line's id arrays into integer arrays, and
  kvsim's compiled scanner, all on one core; then kvsim's whole reader (``load_trace``: every
  field, the scanner on every core);
- ``e2e``: a plain script (``plain_replay.py``: ``json.loads`` per line + the real vLLM
  ``KVCacheManager`` or the real SGLang tree, in the oracle interpreter) against
  ``kvsim --no-trace-cache simulate --policy apc|radix --capacity 1000000``, and reading
  alone (``kvsim inspect``) against ``json.loads`` of the lines; every figure is a whole
  process's wall time minus the same process on the log's first megabyte (12 requests, which
  take the same compiled paths: start-up, numba's included, cancelled out; the small log's
  own work, about 1% of the whole, is subtracted too); the per-request cached tokens of
  both sides are checked equal;
- ``chat``: ``load_trace`` of the chat logs against a per-request loop that parses the line
  (``json.loads``), renders the messages with the chat template and encodes the text
  (``tiktoken``, tokenizer loaded beforehand for both), and against the same loop encoding
  the logged reply too (the output tokens the trace holds); wall and CPU time (all threads);
  the prompts and outputs are checked equal; then the texts kvsim tokenizes while reading
  each log, encoded by tiktoken and by kvsim's word path (``kvsim/io/tokenize/word_tokens.py``, a new
  store each run), the ids checked equal;
- ``cache``: ``kvsim simulate`` on the chat log twice with the trace cache (a fresh cache
  folder): the first command reads and stores, the second maps the stored trace;
- ``parquet``: ``kvsim convert`` to Parquet, reading it back, against reading the JSONL;
- ``memory``: peak RSS (``ru_maxrss``) of a process that reads ``big.jsonl`` (``--big``),
  against the size of the trace's token array;
- ``startup``: ``kvsim --help`` and ``kvsim simulate`` on a one-request token log and on a
  one-request chat log (the tokenizer loaded in the process).

Medians of ``--runs`` runs (the plain scripts: ``--plain-runs``). Run it on an idle machine:

    KVSIM_ORACLE_PYTHON=.oracle-venv/bin/python .venv/bin/python bench/bench_ingest.py --big
    .venv/bin/python bench/bench_ingest.py --only parsers,chat --runs 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT / "traces" / "public" / "conversation_trace.jsonl"
PLAIN = Path(__file__).with_name("plain_replay.py")
KVSIM = [str(Path(sys.executable).with_name("kvsim"))]
VOCAB = 128_000
SECTIONS = ("parsers", "e2e", "chat", "cache", "parquet", "memory", "startup")


# -- inputs ----------------------------------------------------------------------------------
def write_tokens_log(path: Path, limit: int | None) -> dict:
    """Mooncake requests as a pre-tokenized JSONL log (ids in a 128K vocabulary)."""
    import kvsim

    trace = kvsim.load_trace(MOONCAKE, format="mooncake", limit=limit)
    rng = np.random.default_rng(0)
    tokens = (trace.tokens.astype(np.int64) * 2654435761) % VOCAB  # spread over the vocabulary
    with open(path, "w") as f:
        for i in range(len(trace)):
            prompt = tokens[trace.offsets[i]:trace.offsets[i + 1]]
            output = rng.integers(0, VOCAB, max(int(trace.output_lengths[i]), 1))
            f.write('{"prompt_token_ids":[' + ",".join(map(str, prompt.tolist())) + '],"output_token_ids":['
                    + ",".join(map(str, output.tolist())) + '],"timestamp":' + repr(float(trace.arrival[i])) + "}\n")
    return {"requests": len(trace), "prompt_tokens": trace.num_prompt_tokens, "bytes": path.stat().st_size}


def first_line(src: Path, dst: Path) -> Path:
    with open(src, "rb") as f:
        dst.write_bytes(f.readline())
    return dst


def first_megabyte(src: Path, dst: Path) -> Path:
    """The first lines of ``src`` up to just over 1 MB: the smallest log that takes the same
    compiled paths as the whole one (the token scanner, the fast replay), so that a run on it
    pays the same start-up (numba's import and kernel loading included)."""
    out = []
    with open(src, "rb") as f:
        while sum(map(len, out)) <= 1 << 20:
            line = f.readline()
            if not line:
                break
            out.append(line)
    dst.write_bytes(b"".join(out))
    return dst


def generate(scenario: str, path: Path, *extra: str) -> None:
    subprocess.run([*KVSIM, "generate", scenario, "-o", str(path), "--force", *extra], check=True,
                   stdout=subprocess.DEVNULL)


# -- running processes -----------------------------------------------------------------------
@dataclass
class Run:
    wall: float
    cpu: float
    rss_mb: float
    out: str


def run(cmd: list[str], env: dict | None = None) -> Run:
    """Run a process; its wall time, CPU time (user + system) and peak RSS."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env={**os.environ, **(env or {})})
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{err.read().decode()[-3000:]}")
        return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out.read().decode())


def median_run(cmd: list[str], runs: int, env: dict | None = None) -> Run:
    rs = [run(cmd, env) for _ in range(runs)]
    return Run(statistics.median(r.wall for r in rs), statistics.median(r.cpu for r in rs),
               max(r.rss_mb for r in rs), rs[-1].out)


def timeit(fn, runs: int) -> tuple[float, object]:
    times, value = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), value


def interleaved(fns: list, runs: int, cpu: list | None = None) -> tuple[list[float], list]:
    """Median seconds of each function, run in turn ``runs`` times (a shared machine's load
    then weighs on all of them alike), and each one's last value. With ``cpu`` (a list) the
    median CPU seconds of each (this process, all threads) are appended to it."""
    times: list[list[float]] = [[] for _ in fns]
    cpus: list[list[float]] = [[] for _ in fns]
    values: list = [None] * len(fns)
    for _ in range(runs):
        for k, fn in enumerate(fns):
            t0, c0 = time.perf_counter(), time.process_time()
            values[k] = fn()
            times[k].append(time.perf_counter() - t0)
            cpus[k].append(time.process_time() - c0)
    if cpu is not None:
        cpu.extend(statistics.median(c) for c in cpus)
    return [statistics.median(t) for t in times], values


# -- sections --------------------------------------------------------------------------------
def bench_parsers(files: dict, runs: int) -> list[dict]:
    data = files["tokens"].read_bytes()
    lines = data.splitlines()
    mb = len(data) / 1e6

    def with_loads(loads):
        def parse():
            n = 0
            for line in lines:
                rec = loads(line)
                n += len(np.asarray(rec["prompt_token_ids"], np.int64))
                np.asarray(rec.get("output_token_ids") or [], np.int64)
            return n
        return parse

    candidates = {"json.loads + numpy": with_loads(json.loads)}
    try:
        import orjson
        candidates["orjson + numpy"] = with_loads(orjson.loads)
    except ImportError:
        pass
    try:
        import msgspec

        class Record(msgspec.Struct):
            prompt_token_ids: list[int]
            output_token_ids: list[int] = []

        decoder = msgspec.json.Decoder(Record)

        def parse_msgspec():
            n = 0
            for line in lines:
                rec = decoder.decode(line)
                n += len(np.asarray(rec.prompt_token_ids, np.int64))
                np.asarray(rec.output_token_ids, np.int64)
            return n
        candidates["msgspec (typed) + numpy"] = parse_msgspec
    except ImportError:
        pass
    try:
        import simdjson

        parser = simdjson.Parser()

        def parse_simdjson():
            n = 0
            for line in lines:
                doc = parser.parse(line)
                n += len(np.frombuffer(doc["prompt_token_ids"].as_buffer(of_type="i"), np.int64))
                np.frombuffer(doc["output_token_ids"].as_buffer(of_type="i"), np.int64)
                del doc
            return n
        candidates["pysimdjson as_buffer"] = parse_simdjson
    except ImportError:
        pass
    from kvsim.io.source import BLOCK_BYTES
    from kvsim.io.readers.token_scan import Scratch, ScannedBlock

    raw = np.frombuffer(data, np.uint8)

    def parse_scanner():
        scratch, n, start = Scratch(), 0, 0
        while start < len(raw):  # blocks of whole lines, as the reader hands them over
            end = min(start + BLOCK_BYTES, len(raw))
            if end < len(raw):
                end = data.rfind(b"\n", start, end) + 1
            n += len(ScannedBlock(raw[start:end], scratch, parts=1).tokens)
            start = end
        return n
    candidates["kvsim scanner (one core)"] = parse_scanner
    import kvsim

    candidates["kvsim load_trace (all fields, every core)"] = (
        lambda: kvsim.load_trace(files["tokens"]).num_prompt_tokens)
    parse_scanner()  # load the compiled kernels before timing
    rows = []
    for name, fn in candidates.items():
        secs, n = timeit(fn, runs)
        assert n == files["tokens_info"]["prompt_tokens"], (name, n)
        rows.append({"parser": name, "seconds": secs, "mb_per_s": mb / secs})
    return rows


def paired(full: list[str], one: list[str], runs: int, env: dict | None = None) -> dict:
    """Run the full command and the same command on a small log alternately; medians of the
    full run and of the differences (start-up cancelled out), wall and CPU."""
    walls, cpus, fulls, ones = [], [], [], []
    for _ in range(runs):
        a, b = run(full, env), run(one, env)
        walls.append(a.wall - b.wall)
        cpus.append(a.cpu - b.cpu)
        fulls.append(a.wall)
        ones.append(b.wall)
    return {"s": statistics.median(walls), "cpu_s": statistics.median(cpus), "full_s": statistics.median(fulls),
            "startup_s": statistics.median(ones), "runs": walls}


def bench_e2e(files: dict, args, env: dict) -> list[dict]:
    python = os.environ.get("KVSIM_ORACLE_PYTHON") or str(ROOT / ".oracle-venv" / "bin" / "python")
    rows = []
    tmp = files["dir"]
    cap = str(args.capacity)
    tokens = files["tokens_info"]["prompt_tokens"]
    for policy in ("apc", "radix"):
        plain_out = tmp / f"plain_{policy}.json"
        plain = paired([python, str(PLAIN), str(files["tokens"]), policy, cap, str(plain_out)],
                       [python, str(PLAIN), str(files["tokens_small"]), policy, cap, str(tmp / "plain_one.json")],
                       args.plain_runs)
        per_request = tmp / f"kvsim_{policy}.jsonl"
        sim = [*KVSIM, "--no-trace-cache", "simulate", "--policy", policy, "--capacity", cap]
        run([*sim, str(files["tokens"])], env)  # compiled kernels loaded once before timing
        k = paired([*sim, str(files["tokens"]), "--per-request", str(per_request)],
                   [*sim, str(files["tokens_small"]), "--per-request", str(tmp / "one.jsonl")], args.runs, env)
        plain_cached = json.loads(plain_out.read_text())["cached"]
        k_cached = [json.loads(line)["cached_tokens"] for line in per_request.read_text().splitlines()]
        per_request.unlink()
        rows.append({"what": f"simulate --policy {policy}", "plain": plain, "kvsim": k,
                     "plain_mtok_s": tokens / plain["s"] / 1e6, "kvsim_mtok_s": tokens / k["s"] / 1e6,
                     "ratio": plain["s"] / k["s"], "cpu_ratio": plain["cpu_s"] / k["cpu_s"],
                     "same_hits": plain_cached == k_cached})
    # reading alone
    lines = files["tokens"].read_bytes().splitlines()
    loads_s, _ = timeit(lambda: [json.loads(line) for line in lines], args.runs)
    inspect = [*KVSIM, "--no-trace-cache", "inspect"]
    k = paired([*inspect, str(files["tokens"])], [*inspect, str(files["tokens_small"])], args.runs, env)
    rows.append({"what": "read only (inspect)", "plain_s": loads_s, "kvsim": k, "ratio": loads_s / k["s"]})
    return rows


def render_encode_loop(path: Path, template, tok, replies: bool = False) -> tuple[list[list[int]], list]:
    """The baseline: parse each line, render its messages, encode the text; with
    ``replies`` also encode the logged reply (the output tokens a trace holds)."""
    prompts, outputs = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            rec = json.loads(line)
            msgs = [(m["role"], m["content"]) for m in rec["messages"]]
            prompts.append(tok.encode(template.render(msgs).text))
            if replies:
                outputs.append(tok.encode(rec["response"]) if rec.get("response") else None)
    return prompts, outputs


def bench_chat(files: dict, runs: int) -> list[dict]:
    import kvsim
    from kvsim.io.tokenize.templates import get_template
    from kvsim.io.tokenize.tokenizers import get_tokenizer

    template = get_template("llama3")
    tok = get_tokenizer("cl100k_base", template.special_tokens)
    tok.encode("warm up")
    rows = []
    for name in ("chat", "mixture"):
        path = files[name]
        kvsim.load_trace(path)  # the chat scanner's kernels loaded before timing
        cpu: list[float] = []
        (loop_s, reply_loop_s, kv_s), ((prompts, _), (_, outputs), trace) = interleaved(
            [lambda: render_encode_loop(path, template, tok), lambda: render_encode_loop(path, template, tok, True),
             lambda: kvsim.load_trace(path)], runs, cpu)
        same = len(prompts) == len(trace) and all(
            np.array_equal(trace.prompt(i), p) for i, p in enumerate(prompts))
        # the trace's output is the reply's tokens and the template's end-of-turn token
        same_out = len(outputs) == len(trace) and all(
            o is None or np.array_equal(trace.output(i)[:-1], o) for i, o in enumerate(outputs))
        tokens = trace.num_prompt_tokens
        lines = path.read_bytes().splitlines()  # the JSON decoders kvsim's chat path can use, on whole lines
        import msgspec

        decode = msgspec.json.Decoder().decode
        (json_s, msgspec_s), _ = interleaved(
            [lambda: [json.loads(x) for x in lines], lambda: [decode(x) for x in lines]], runs)
        words = bench_words(path, tok, runs)
        rows.append({"log": name, "bytes": path.stat().st_size, "requests": len(trace), "prompt_tokens": tokens,
                     "json_loads_s": json_s, "msgspec_s": msgspec_s,
                     "loop_s": loop_s, "reply_loop_s": reply_loop_s, "kvsim_s": kv_s,
                     "loop_mtok_s": tokens / loop_s / 1e6, "kvsim_mtok_s": tokens / kv_s / 1e6,
                     "ratio": loop_s / kv_s, "ratio_reply_loop": reply_loop_s / kv_s,
                     "loop_cpu_s": cpu[0], "reply_loop_cpu_s": cpu[1], "kvsim_cpu_s": cpu[2],
                     "ratio_cpu": cpu[0] / cpu[2], "ratio_reply_loop_cpu": cpu[1] / cpu[2],
                     "same_prompts": same, "same_outputs": same_out, **words})
    return rows


def bench_words(path: Path, tok, runs: int) -> dict:
    """The texts kvsim tokenizes while reading ``path`` (its distinct pieces and replies),
    encoded by tiktoken and by the word path (a new, empty store each run), one thread each."""
    import kvsim
    from kvsim.io.tokenize.tokenizers import TiktokenTokenizer
    from kvsim.io.tokenize.word_tokens import WordTokens

    batches: list[list[str]] = []
    real = TiktokenTokenizer._encode_numpy
    TiktokenTokenizer._encode_numpy = lambda self, texts: batches.append(list(texts)) or real(self, texts)
    try:
        kvsim.load_trace(path)
    finally:
        TiktokenTokenizer._encode_numpy = real

    def by_words():
        store = WordTokens(tok._enc, tok.special_token_ids)
        return [a for b in batches for a in store.encode(b, tok._encode_whole)]

    (whole_s, words_s), (a, b) = interleaved(
        [lambda: [a for b in batches for a in tok._encode_whole(b)], by_words], runs)
    return {"tokenized_chars": sum(len(t) for b in batches for t in b), "tiktoken_s": whole_s, "words_s": words_s,
            "words_ratio": whole_s / words_s, "same_words": all(np.array_equal(x, y) for x, y in zip(a, b))}


def bench_cache(files: dict, runs: int, env: dict) -> list[dict]:
    rows = []
    for name in ("tokens", "chat"):
        sim = [*KVSIM, "simulate", "--policy", "apc", "--capacity", "1000000", str(files[name])]
        misses, hits, nocache = [], [], []
        for _ in range(runs):
            run([*KVSIM, "cache", "clear"], env)
            misses.append(run(sim, env).wall)
            hits.append(run(sim, env).wall)
            nocache.append(run([*KVSIM, "--no-trace-cache", *sim[len(KVSIM):]], env).wall)
        rows.append({"log": name, "no_cache_s": statistics.median(nocache), "first_s": statistics.median(misses),
                     "second_s": statistics.median(hits)})
    return rows


def same_trace(a, b) -> bool:
    """Every column and name list equal (NaN equal to NaN)."""
    for name in ("offsets", "tokens", "output_offsets", "output_tokens", "output_known", "output_lengths",
                 "arrival", "tenant", "cache_salt", "lora", "session", "prompt_logprobs", "logprob_start_len",
                 "msg_offsets", "msg_starts", "msg_roles"):
        x, y = getattr(a, name), getattr(b, name)
        if (x is None) != (y is None) or (x is not None and not np.array_equal(x, y, equal_nan=x.dtype.kind == "f")):
            return False
    ids = [None if t.request_ids is None else list(t.request_ids) for t in (a, b)]
    names = ("tenant_names", "salt_names", "lora_names", "session_names", "role_names")
    return ids[0] == ids[1] and all(getattr(a, n) == getattr(b, n) for n in names)


def bench_parquet(files: dict, runs: int, env: dict) -> list[dict]:
    import kvsim

    rows = []
    for name in ("tokens", "chat"):
        pq = files["dir"] / f"{name}.parquet"
        convert = run([*KVSIM, "--no-trace-cache", "convert", str(files[name]), "-o", str(pq), "--force"], env)
        kvsim.load_trace(pq)  # pyarrow imported before timing
        (jsonl_s, pq_s), (a, b) = interleaved([lambda: kvsim.load_trace(files[name]), lambda: kvsim.load_trace(pq)],
                                              runs)
        rows.append({"log": name, "jsonl_bytes": files[name].stat().st_size, "parquet_bytes": pq.stat().st_size,
                     "convert_s": convert.wall, "read_jsonl_s": jsonl_s, "read_parquet_s": pq_s,
                     "ratio": jsonl_s / pq_s, "lossless": same_trace(a, b)})
    return rows


PEAK_RSS = ("import resource, sys\n"
            "def peak_mib():  # this process's high-water mark (ru_maxrss can include the parent's at fork)\n"
            "    try:\n"
            "        for line in open('/proc/self/status'):\n"
            "            if line.startswith('VmHWM:'):\n"
            "                return int(line.split()[1]) / 1024\n"
            "    except OSError:\n"
            "        pass\n"
            "    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024\n")


def bench_memory(files: dict, env: dict) -> dict:
    code = (PEAK_RSS + "import kvsim\nt = kvsim.load_trace(sys.argv[1])\n"
            "print(t.tokens.nbytes, t.output_tokens.nbytes, t.num_prompt_tokens, peak_mib())")
    r = run([sys.executable, "-c", code, str(files["big"])], env)
    token_bytes, out_bytes, tokens, peak = r.out.split()
    token_bytes = int(token_bytes)
    base = run([sys.executable, "-c", PEAK_RSS + "import kvsim, numpy, numba\nfrom kvsim.io import token_scan\n"
                "print(peak_mib())"], env)
    return {"log_bytes": files["big"].stat().st_size, "prompt_tokens": int(tokens),
            "token_array_mib": token_bytes / 2**20, "output_array_mib": int(out_bytes) / 2**20,
            "peak_rss_mib": float(peak), "interpreter_rss_mib": float(base.out.split()[-1]),
            "peak_over_token_array": float(peak) * 2**20 / token_bytes, "seconds": r.wall}


def bench_startup(files: dict, runs: int, env: dict) -> list[dict]:
    rows = []
    chat_one = first_line(files["chat"], files["dir"] / "chat_one.jsonl") if "chat" in files else None
    for label, cmd in (("kvsim --help", [*KVSIM, "--help"]),
                       ("kvsim simulate (one request)", [*KVSIM, "simulate", str(files["tokens_one"])]),
                       *([("kvsim simulate (one chat request)", [*KVSIM, "--no-trace-cache", "simulate",
                                                                  str(chat_one)])] if chat_one else []),
                       ("python -c 'import numpy'", [sys.executable, "-c", "import numpy"])):
        run(cmd, env)
        r = median_run(cmd, runs, env)
        rows.append({"command": label, "wall_s": r.wall, "cpu_s": r.cpu})
    return rows


# -- main ------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(s for s in SECTIONS if s != "memory"),
                    help=f"sections to run, of {', '.join(SECTIONS)}")
    ap.add_argument("--requests", type=int, default=1000, help="Mooncake requests in tokens.jsonl")
    ap.add_argument("--capacity", type=int, default=1_000_000, help="cache capacity (tokens) for e2e")
    ap.add_argument("--chat-sessions", type=int, default=800)
    ap.add_argument("--chat-turns", type=int, default=8)
    ap.add_argument("--mixture-requests", type=int, default=4000)
    ap.add_argument("--big", action="store_true", help="also generate the ~1 GB log and run 'memory'")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--plain-runs", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write the measurements here")
    args = ap.parse_args()
    sections = set(args.only.split(",")) | ({"memory"} if args.big else set())
    results: dict = {"args": vars(args) | {"json": str(args.json)}}
    with tempfile.TemporaryDirectory(prefix="kvsim-bench-ingest-") as d:
        tmp = Path(d)
        env = {"KVSIM_CACHE_DIR": str(tmp / "cache")}  # never the user's cache
        files: dict = {"dir": tmp, "tokens": tmp / "tokens.jsonl"}
        files["tokens_info"] = write_tokens_log(files["tokens"], args.requests)
        files["tokens_one"] = first_line(files["tokens"], tmp / "tokens_one.jsonl")
        files["tokens_small"] = first_megabyte(files["tokens"], tmp / "tokens_small.jsonl")
        if sections & {"chat", "cache", "parquet", "startup"}:
            files["chat"], files["mixture"] = tmp / "chat.jsonl", tmp / "mixture.jsonl"
            generate("support_chat", files["chat"], "--sessions", str(args.chat_sessions),
                     "--turns", str(args.chat_turns))
            generate("mixture", files["mixture"], "--requests", str(args.mixture_requests))
        if "memory" in sections:
            files["big"] = tmp / "big.jsonl"
            results["big"] = write_tokens_log(files["big"], None)
        results["inputs"] = {k: (v.stat().st_size if isinstance(v, Path) and v.is_file() else None)
                             for k, v in files.items() if isinstance(v, Path)}
        results["tokens_log"] = files["tokens_info"]
        steps = {"parsers": lambda: bench_parsers(files, args.runs),
                 "e2e": lambda: bench_e2e(files, args, env),
                 "chat": lambda: bench_chat(files, args.runs),
                 "cache": lambda: bench_cache(files, args.runs, env),
                 "parquet": lambda: bench_parquet(files, args.runs, env),
                 "memory": lambda: bench_memory(files, env),
                 "startup": lambda: bench_startup(files, args.runs, env)}
        for name in SECTIONS:
            if name in sections:
                print(f"-- {name}", file=sys.stderr, flush=True)
                results[name] = steps[name]()
                print(json.dumps(results[name], indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
