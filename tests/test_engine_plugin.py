"""An extra engine registered as a plugin runs through every command: the LFU example
(``examples/engines/lfu.py``: vLLM's blocks, evicted least-frequently-used first)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from kvsim.cli import run
from kvsim.engines import registry
from kvsim.engines.base import Request
from kvsim.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = f"{ROOT / 'examples' / 'engines' / 'lfu.py'}:LFUSpec"
LOG = ROOT / "traces" / "multi_tenant.jsonl"


@pytest.fixture
def plugin(monkeypatch):
    """The LFU engine registered for one test; the registry as it was afterwards."""
    saved = dict(registry._specs), registry._loaded
    monkeypatch.setenv(registry.PLUGINS_ENV, "")      # undone after the test, whatever load_plugin adds
    spec = registry.load_plugin(PLUGIN)
    yield spec
    registry._specs.clear()
    registry._specs.update(saved[0])
    registry._loaded = saved[1]


def _lfu(num_gpu_blocks: int):
    spec = registry.engine("lfu")
    return spec.implementation("reference")(spec.settings(_options(num_gpu_blocks=num_gpu_blocks, block_size=4)))


def _options(**kw):
    from kvsim.engines.options import SimOptions

    return SimOptions(**kw)


def test_lfu_keeps_the_prefix_hit_most_often(plugin):
    """Two cached prefixes, A hit twice and B never: when C needs room, LFU evicts B and keeps
    A; vLLM's LRU free queue evicts A, freed earlier, and keeps B (5 usable blocks of 4 tokens)."""
    from kvsim.engines.vllm.sequential import APCReference
    from kvsim.engines.vllm.settings import APCSettings

    A, B = list(range(100, 108)), list(range(200, 208))
    C = list(range(300, 308))
    seq = [A + [1], A + [2], A + [3], B + [4], C + [5], B + [6], A + [7]]

    def cached(cache):
        return [cache.serve(Request(str(i), np.array(p), np.array([0]))).cached_tokens for i, p in enumerate(seq)]

    lru = cached(APCReference(APCSettings(block_size=4, num_gpu_blocks=6)))
    lfu = cached(_lfu(6))
    assert lru[:5] == lfu[:5] == [0, 8, 8, 0, 0]
    assert lfu[5:] == [0, 8]     # B went for C, A stayed
    assert lru[5:] == [8, 0]     # vLLM's LRU order: A's blocks went for C


def test_simulate_every_replay_mode(plugin, tmp_path):
    for mode in (["--replay", "sequential"], ["--replay", "steps", "--arrival-from", "timestamp", "--step-seconds",
                                                "0.05"], ["--replay", "timed", "--model", "llama-3-8b", "--gpu",
                                                          "H100-80GB"]):
        out = tmp_path / f"{mode[1]}.json"
        assert run(["--engine-plugin", PLUGIN, "simulate", str(LOG), "--policy", "apc,lfu", "--capacity", "3000",
                    "--limit", "80", "--json", str(out), *mode]) == 0
        policies = json.loads(out.read_text())["policies"]
        assert set(policies) == {"apc", "lfu"}
        lfu = policies["lfu"]["summary"]
        assert lfu["requests"] == 80 and 0 < lfu["token_hit_rate"] < 1


def test_sweep_draws_exact_replays_only(plugin, tmp_path, capsys):
    out = tmp_path / "sweep.json"
    assert run(["--engine-plugin", PLUGIN, "sweep", str(LOG), "--policy", "lfu,apc", "--capacity", "2000,8000",
                "--limit", "80", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    rows = [r for r in data["rows"] if r["policy"] == "lfu"]
    assert len(rows) == 2 and all(r["block_size"] == 16 for r in rows)
    assert {c["policy"] for c in data["curves"]} == {"apc"}          # no one-pass curve for LFU
    assert "No one-pass curve for lfu" in capsys.readouterr().out


def test_a_bad_plugin_is_one_line_and_exit_2(capsys):
    assert run(["--engine-plugin", "no_such_module:Spec", "simulate", str(LOG)]) == 2
    assert "--engine-plugin no_such_module:Spec" in capsys.readouterr().err
    with pytest.raises(ConfigError):
        registry.load_plugin("just-a-name")


def test_entry_points_register_engines(monkeypatch, tmp_path):
    """A package naming its spec in the ``kvsim.engines`` entry points needs no option: an
    installed distribution (its ``.dist-info`` folder on ``sys.path``) is found and loaded."""
    (tmp_path / "kvsim_lfu_plugin.py").write_text((ROOT / "examples" / "engines" / "lfu.py").read_text())
    info = tmp_path / "kvsim_lfu_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvsim-lfu-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kvsim.engines]\nlfu = kvsim_lfu_plugin:LFUSpec\n")
    saved = dict(registry._specs), registry._loaded
    registry._specs.clear()
    registry._loaded = False
    try:
        assert not registry._group_named(registry.ENTRY_POINT_GROUP)   # nothing installed declares it
        assert registry.names() == ["apc", "radix"]
        registry._specs.clear()
        registry._loaded = False
        monkeypatch.syspath_prepend(str(tmp_path))
        assert registry._group_named(registry.ENTRY_POINT_GROUP)
        assert registry.names() == ["apc", "radix", "lfu"]
    finally:
        registry._specs.clear()
        registry._specs.update(saved[0])
        registry._loaded = saved[1]


def test_simulate_reads_no_package_metadata_when_no_plugin_is_installed(tmp_path):
    """importlib.metadata (10-20 ms to import and scan) is left out when no installed package
    names the ``kvsim.engines`` group."""
    log = tmp_path / "one.jsonl"
    log.write_text('{"prompt_token_ids": [1, 2, 3], "output_token_ids": [4]}\n')
    code = ("import sys\nfrom kvsim.cli import run\nrun(sys.argv[1:])\n"
            "print('METADATA', 'importlib.metadata' in sys.modules)")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code, "--no-trace-cache", "simulate", "--policy", "all", str(log)],
                         capture_output=True, text=True, check=True).stdout
    assert "METADATA False" in out


def test_serve_answers_as_simulate_replays(plugin, tmp_path, monkeypatch):
    """``kvsim serve --policy lfu`` (a real server process, the openai client): the cached_tokens
    it reports are those ``simulate`` gives when it replays the server's record."""
    from serve_helpers import read_record, start_kvsim

    monkeypatch.setenv(registry.PLUGINS_ENV, PLUGIN)        # the server process loads the plugin too
    record = tmp_path / "record.jsonl"
    server = start_kvsim(tmp_path, "--policy", "lfu", "--capacity", "600", "--record", str(record))
    try:
        client = server.client()
        system = "You are a terse assistant. " * 20
        answers = []
        for i, question in enumerate(["one", "two", "one", "three", "two", "one"] * 2):
            r = client.chat.completions.create(model="kvsim", max_tokens=8, messages=[
                {"role": "system", "content": system}, {"role": "user", "content": f"question {question} {i % 3}"}])
            answers.append(r.usage.prompt_tokens_details.cached_tokens)
    finally:
        server.stop()
    lines = read_record(record)
    assert len(lines) == len(answers) and max(answers) > 0
    assert [line["kvsim"]["policy"] for line in lines] == ["lfu"] * len(lines)
    replayed = tmp_path / "replay.jsonl"
    assert run(["--engine-plugin", PLUGIN, "simulate", str(record), "--policy", "lfu", "--capacity", "600",
                "--per-request", str(replayed)]) == 0
    assert [json.loads(line)["cached_tokens"] for line in replayed.read_text().splitlines()] == answers


def test_the_plugin_leaves_the_built_ins_alone():
    assert not os.environ.get(registry.PLUGINS_ENV)
    assert registry.names() == ["apc", "radix"]


def test_report_shows_the_plugin_beside_the_built_ins(plugin, tmp_path):
    out = tmp_path / "report.html"
    assert run(["--engine-plugin", PLUGIN, "report", str(LOG), "--policy", "apc,lfu", "--capacity", "3000",
                "--limit", "60", "--no-concurrent", "-o", str(out)]) == 0
    page = out.read_text()
    assert plugin.label in page and "vLLM APC" in page
