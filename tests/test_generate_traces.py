"""The bundled traces are exactly what the commands in traces/README.md generate."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from kvsim.cli import run

TRACES = Path(__file__).resolve().parent.parent / "traces"


def readme_commands() -> list[list[str]]:
    text = (TRACES / "README.md").read_text()
    return [shlex.split(line)[1:] for line in re.findall(r"^kvsim generate .*$", text, re.MULTILINE)]


def test_readme_lists_a_command_for_every_bundled_trace():
    outputs = {Path(argv[argv.index("-o") + 1]).name for argv in readme_commands()}
    bundled = {p.name for p in TRACES.glob("*.jsonl")}
    assert outputs == bundled
    assert {"demo_mixture.jsonl", "support_chat.tokens.jsonl"} <= bundled


@pytest.mark.parametrize("argv", readme_commands(), ids=lambda a: a[1] + ":" + Path(a[a.index("-o") + 1]).name)
def test_bundled_trace_is_reproduced_byte_for_byte(tmp_path, argv):
    i = argv.index("-o") + 1
    bundled = TRACES.parent / argv[i]
    fresh = tmp_path / bundled.name
    assert run([*argv[:i], str(fresh), *argv[i + 1:]]) == 0
    assert fresh.read_bytes() == bundled.read_bytes(), f"{bundled} differs from a fresh `kvsim {' '.join(argv)}`"


def test_bundled_traces_stay_small():
    for path in TRACES.glob("*.jsonl"):
        limit = 1_400_000 if path.name == "demo_mixture.jsonl" else 800_000
        assert path.stat().st_size < limit, path.name
