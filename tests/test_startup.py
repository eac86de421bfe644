"""Start-up: commands import heavy packages only where they use them (no timing here; the
times are measured by bench/bench_ingest.py, section startup, and bench/command_phases.py).
pydantic is heavy here too: Typer 0.29 imported it to coerce every option (docs/performance.md,
"Start-up: Typer's option parsing"); only ``kvsim serve`` uses it."""
from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("numpy", "pandas", "numba", "matplotlib", "torch", "pyarrow", "tiktoken", "jinja2", "ray", "pydantic")


def imported_by(args: list[str], watch: tuple[str, ...] = HEAVY) -> set[str]:
    code = ("import sys\nfrom kvsim.cli import run\nrun(sys.argv[1:])\n"
            f"print('IMPORTED', [m for m in {watch!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if x.startswith("IMPORTED"))
    return set(json.loads(line.split(" ", 1)[1].replace("'", '"')))


def test_help_imports_nothing_heavy():
    assert imported_by(["--help"]) == set()
    assert imported_by(["simulate", "--help"]) == set()


def test_simulate_on_a_small_token_log_imports_only_what_it_uses(tmp_path):
    log = tmp_path / "one.jsonl"
    log.write_text('{"prompt_token_ids": [1, 2, 3], "output_token_ids": [4]}\n')
    # a small replay is served by the readable model: no compiled kernels to load
    assert imported_by(["--no-trace-cache", "simulate", str(log)]) == {"numpy"}
    assert imported_by(["--no-trace-cache", "simulate", "--policy", "all", str(log)]) == {"numpy"}


def test_simulate_on_a_small_chat_log_imports_only_what_it_uses(tmp_path):
    log = tmp_path / "one.jsonl"
    log.write_text('{"messages": [{"role": "user", "content": "Hello"}], "response": "Hi"}\n')
    assert imported_by(["--no-trace-cache", "simulate", "--tokenizer", "bytes", str(log)]) == {"numpy"}
    # with tiktoken: a one-request log stays below the word path's size (no compiled code)
    assert imported_by(["--no-trace-cache", "simulate", str(log)]) == {"numpy", "tiktoken"}


def test_inspect_of_a_large_chat_log_loads_no_compiled_code(tmp_path):
    """A chat log above the fast path's size (1 MB) is read without numba: msgspec, tiktoken and
    numpy (its import and kernels would cost more than they save on such a log)."""
    log = tmp_path / "chat.jsonl"
    done = subprocess.run([sys.executable, "-c", "from kvsim.cli import main; main()", "generate", "support_chat",
                           "-o", str(log), "--sessions", "40", "--turns", "6"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert log.stat().st_size > 1 << 20
    assert imported_by(["--no-trace-cache", "inspect", str(log)]) == {"numpy", "tiktoken"}


def test_fleets_and_timed_replays_import_no_offload_tier(tmp_path):
    """The offload tiers' modules are imported only with ``--offload`` (not by a fleet's bounds,
    which build the sequential engine, nor by a timed replay)."""
    log = tmp_path / "few.jsonl"
    log.write_text("".join(f'{{"prompt_token_ids": {list(range(i, i + 40))}, "output_token_ids": [7, 8], '
                           f'"timestamp": {i}}}\n' for i in range(6)))
    tiers = ("kvsim.tiers", "kvsim.tiers.setup")
    base = ["--no-trace-cache", "simulate", "--replay", "timed", "--model", "llama-3-8b", "--gpu", "H100-80GB",
            "--num-gpu-blocks", "200", str(log)]
    assert imported_by(base, tiers) == set()
    assert imported_by([*base, "--replicas", "2", "--router", "dynamo"], tiers) == set()
    assert imported_by([*base, "--offload", "native", "--offload-size", "1000"], tiers) == set(tiers)


def test_timed_replays_and_fleets_leave_numpy_ma_unimported(tmp_path):
    """numpy's masked arrays (about 8 ms) come with ``np.percentile`` and ``np.unique``: a timed
    summary's percentiles (kvsim/drive/percentiles.py) and a fleet's bounds use neither."""
    log = tmp_path / "few.jsonl"
    log.write_text("".join(f'{{"prompt_token_ids": {list(range(i, i + 40))}, "output_token_ids": [7, 8], '
                           f'"timestamp": {i}}}\n' for i in range(6)))
    base = ["--no-trace-cache", "simulate", "--replay", "timed", "--model", "llama-3-8b", "--gpu", "H100-80GB",
            "--num-gpu-blocks", "200", str(log)]
    for args in (base, [*base, "--replicas", "2", "--router", "dynamo"], [*base, "--replicas", "3"]):
        assert imported_by(args, ("numpy.ma",)) == set(), args
