"""`kvsim serve --replay timed`: the scheduler model in wall-clock time, driven by the openai client."""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvsim.cli import run
from kvsim.costs.calibration import Calibration
from serve_helpers import read_record, start_kvsim

pytest.importorskip("openai")
STEP = 0.2      # seconds per step: the calibration's fixed cost
PROMPT = "The quick brown fox jumps over the lazy dog. " * 8


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("timed")
    calib = tmp / "calib.json"
    Calibration(device="hand", model="hand", dtype="bf16", fixed_s=STEP, per_token_s=0.0,
                per_context_token_s=0.0).save(calib)
    srv = start_kvsim(tmp, "--replay", "timed", "--calibration", str(calib), "--policy", "apc", "--capacity", "8192",
                      "--no-async-scheduling", "--max-num-seqs", "1", "--tokenizer", "bytes",
                      "--record", str(tmp / "rec.jsonl"))
    yield srv, tmp
    srv.stop()


def test_replies_take_the_modelled_time_and_queue(server):
    """4 output tokens at one step each: a lone reply takes 4 steps; of two sent together behind
    one running slot, the second waits for the first (about 8 steps), and then hits its prompt."""
    srv, tmp = server
    client = srv.client()
    t0 = time.monotonic()
    lone = client.completions.create(model="kvsim", prompt="Hello there, lone request", max_tokens=4)
    assert time.monotonic() - t0 >= 4 * STEP
    assert lone.usage.completion_tokens == 4 and lone.usage.prompt_tokens_details.cached_tokens == 0

    def ask(suffix: str):
        return client.completions.create(model="kvsim", prompt=PROMPT + suffix, max_tokens=4)

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(ask, ["one", "two"]))
    lines = read_record(tmp / "rec.jsonl")
    assert len(lines) == 3
    timed = [line["kvsim_timed"] for line in lines]
    assert timed[0] == {"ttft_s": STEP, "e2e_s": 4 * STEP}
    first, second = sorted(timed[1:], key=lambda t: t["e2e_s"])
    assert first == {"ttft_s": STEP, "e2e_s": 4 * STEP}
    # released at most a step after the first (the two arrive together), it waits for its 4 steps
    assert second["ttft_s"] >= 2 * STEP - 1e-9 and second["e2e_s"] >= 5 * STEP - 1e-9
    cached = sorted(a.usage.prompt_tokens_details.cached_tokens for a in answers)
    assert cached[0] == 0 and cached[1] >= len(PROMPT) // 16 * 16 - 16
    recorded = {line["request_id"]: line["kvsim"]["cached_tokens"] for line in lines}
    assert all(recorded[a.id] == a.usage.prompt_tokens_details.cached_tokens for a in answers)


def test_the_record_replays_to_the_same_answers(server, capsys):
    """`kvsim simulate RECORD --replay timed` with the same settings gives each request's cached tokens."""
    srv, tmp = server
    lines = read_record(tmp / "rec.jsonl")
    out = tmp / "replay.jsonl"
    assert run(["simulate", str(tmp / "rec.jsonl"), "--replay", "timed", "--calibration", str(tmp / "calib.json"),
                "--capacity", "8192", "--no-async-scheduling", "--max-num-seqs", "1", "--per-request", str(out)]) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["cached_tokens"] for r in rows] == [line["kvsim"]["cached_tokens"] for line in lines]
    assert [r["e2e_s"] for r in rows][0] == pytest.approx(4 * STEP)


@pytest.mark.parametrize("args,needle", [
    (["--replay", "steps"], "choose sequential or timed"),
    (["--replay", "timed", "--calibration", "c.json"], "needs a capacity"),
    (["--replay", "timed", "--capacity", "4096"], "needs --model and --gpu"),
    (["--calibration", "c.json"], "--calibration needs --replay timed"),
])
def test_bad_timed_options_exit_2(args, needle, capsys):
    assert run(["serve", "--port", "0", "--tokenizer", "bytes", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
