"""`kvsim simulate --replay steps|timed` as users meet it: exit codes, the summary, and the
per-request columns read back with pandas."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent / "oracle"))
from sched_workloads import SchedMix, random_workload

from kvsim.cli import run
from kvsim.costs.calibration import Calibration

DEMO = Path(__file__).resolve().parents[1] / "traces" / "demo_mixture.jsonl"
FAR = 100_000   # steps between arrivals: each request finishes long before the next arrives


def token_log(path: Path, prompts, outputs, **columns) -> Path:
    """A token-id log; ``columns`` are per-request field values (None: left out)."""
    with path.open("w") as f:
        for i, (p, o) in enumerate(zip(prompts, outputs)):
            rec = {"prompt_token_ids": [int(t) for t in p], "output_token_ids": [int(t) for t in o]}
            rec.update({k: v[i] for k, v in columns.items() if v[i] is not None})
            f.write(json.dumps(rec) + "\n")
    return path


def per_request(path: Path) -> pd.DataFrame:
    return pd.read_json(path, lines=True)


def test_steps_equal_sequential_when_arrivals_are_far_apart(tmp_path, capsys):
    """With arrivals far apart, --replay steps serves requests one at a time: both engines give
    the sequential replay's cached tokens and rejections, request for request."""
    w = random_workload(4, SchedMix(n=120, output_len=(1, 30)))
    log = token_log(tmp_path / "far.jsonl", w.prompts, w.outputs, arrival_step=[i * FAR for i in range(w.n)])
    cap = str(int(w.peak_tokens().max()) * 2)      # tight: the caches evict
    common = ["--policy", "all", "--capacity", cap, "--chunked-prefill-size", "128"]
    assert run(["simulate", str(log), *common, "--per-request", str(tmp_path / "seq.jsonl")]) == 0
    assert "Replay: sequential" in capsys.readouterr().out
    assert run(["simulate", str(log), *common, "--replay", "steps", "--json", str(tmp_path / "s.json"),
                "--per-request", str(tmp_path / "steps.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "Concurrent replay (steps)" in out and "arrival_step" in out
    seq, steps = per_request(tmp_path / "seq.jsonl"), per_request(tmp_path / "steps.jsonl")
    assert len(seq) == len(steps) == 2 * w.n
    for col in ("policy", "index", "cached_tokens", "rejected"):
        assert seq[col].tolist() == steps[col].tolist(), col
    assert seq["cached_tokens"].sum() > 0 and not steps["rejected"].all()
    served = steps[~steps["rejected"]]
    assert (served["arrival_step"] == served["index"] * FAR).all()
    assert (served["first_token_step"] >= served["arrival_step"]).all()
    assert (served["finish_step"] >= served["first_token_step"]).all() and (served["preemptions"] == 0).all()
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["mode"] == "steps"
    assert summary["policies"]["radix"]["scheduler"]["schedule_policy"] == "fcfs"  # SGLang 0.5.23's default
    assert "defaults" in summary["policies"]["apc"]["defaults"]
    assert summary["policies"]["apc"]["summary"]["steps"] > (w.n - 1) * FAR


def test_closed_loop_releases_a_turn_after_the_previous_reply(tmp_path):
    """--arrivals closed-loop: turn 2 (logged at step 0, the same session) waits for turn 1's
    reply and the logged gap; a request of another session is released as logged."""
    prompts = [list(range(40)), list(range(40)) + [5] * 10 + [7, 8, 9], list(range(100, 130))]
    outputs = [[5] * 10, [6] * 3, [4] * 3]
    log = token_log(tmp_path / "s.jsonl", prompts, outputs, arrival_step=[0, 2, 0],
                    session_id=["a", "a", "b"])
    for arrivals in ("logged", "closed-loop"):
        out = tmp_path / f"{arrivals}.jsonl"
        assert run(["simulate", str(log), "--replay", "steps", "--arrivals", arrivals, "--policy", "apc",
                    "--no-async-scheduling", "--per-request", str(out)]) == 0
    logged, closed = per_request(tmp_path / "logged.jsonl"), per_request(tmp_path / "closed-loop.jsonl")
    assert logged["arrival_step"].tolist() == [0, 2, 0]
    finish = int(closed["finish_step"][0])
    assert closed["arrival_step"].tolist() == [0, finish + 1 + 2, 0]
    assert closed["first_token_step"][1] > finish
    assert logged["first_token_step"][1] < logged["finish_step"][0]       # overlapped with turn 1
    # closed loop: turn 1's reply is cached by then (3 blocks); logged: only its prompt (2 blocks)
    assert closed["cached_tokens"][1] == 48 and logged["cached_tokens"][1] == 32


def test_timed_hand_case(tmp_path, capsys):
    """A calibration where every step costs 1 s: a lone request (20-token prompt, 3 output
    tokens) has TTFT 1 s and E2E 3 s; one arriving with it behind a single slot queues 3 s."""
    calib = tmp_path / "calib.json"
    Calibration(device="hand", model="hand", dtype="bf16", fixed_s=1.0, per_token_s=0.0,
                per_context_token_s=0.0).save(calib)
    prompts = [list(range(k * 100, k * 100 + 20)) for k in range(3)]
    log = token_log(tmp_path / "t.jsonl", prompts, [[1, 2, 3]] * 3, timestamp=[5.0, 5.0, 20.0])
    for policy, flags in (("apc", ["--no-async-scheduling", "--max-num-seqs", "1"]),
                          ("radix", ["--disable-overlap-schedule", "--max-running-requests", "1"])):
        out = tmp_path / f"{policy}.jsonl"
        assert run(["simulate", str(log), "--replay", "timed", "--calibration", str(calib), "--policy", policy,
                    *flags, "--per-request", str(out), "--json", str(tmp_path / "t.json")]) == 0
        rows = per_request(out)
        assert rows["arrival_s"].tolist() == [0.0, 0.0, 15.0]
        assert rows["ttft_s"].tolist() == [1.0, 4.0, 1.0]
        assert rows["e2e_s"].tolist() == [3.0, 6.0, 3.0]
        assert rows["queueing_delay_s"].tolist() == [0.0, 3.0, 0.0]
        assert rows["prefill_tokens_computed"].tolist() == [20, 20, 20]
        summary = json.loads((tmp_path / "t.json").read_text())["policies"][policy]["summary"]
        assert summary["gpu_busy_s"] == 9.0 and summary["makespan_s"] == 18.0
        assert summary["ttft_p50_s"] == 1.0 and summary["without_prefix_caching"]["ttft_p50_s"] == 1.0
    out = capsys.readouterr().out
    assert "TTFT p99" in out and "Prefix caching on vs off" in out and "calibration of hand" in out


def test_timed_roofline_on_a_bundled_trace_shows_the_saving(tmp_path, capsys):
    """Both engines on the demo log's timestamps: prefix caching cuts prefill work and TTFT."""
    assert run(["simulate", str(DEMO), "--limit", "60", "--replay", "timed", "--policy", "all", "--model",
                "llama-3-8b", "--gpu", "H100-80GB", "--speedup", "20", "--json", str(tmp_path / "d.json")]) == 0
    out = " ".join(capsys.readouterr().out.split())      # rich wraps long lines
    assert "vLLM's defaults for H100-80GB" in out and "SGLang's defaults for H100-80GB" in out
    for s in json.loads((tmp_path / "d.json").read_text())["policies"].values():
        s = s["summary"]
        assert s["saved"]["prefill_tokens_computed"] == s["cached_tokens"] > 0
        assert s["ttft_p50_s"] < s["without_prefix_caching"]["ttft_p50_s"]


@pytest.mark.parametrize("args,needle", [
    (["--replay", "steps"], "needs arrival_step on every request"),
    (["--replay", "steps", "--arrival-from", "timestamp"], "needs --step-seconds"),
    (["--replay", "timed"], "needs --model and --gpu"),
    (["--replay", "steps", "--calibration", "x.json"], "no time model"),
    (["--replay", "parallel"], "unknown --replay"),
    (["--max-num-seqs", "8"], "--max-num-seqs need(s) --replay steps"),
    (["--schedule-policy", "lpm", "--speedup", "2"], "--speedup, --schedule-policy need(s)"),
    (["--replay", "steps", "--arrival-from", "timestamp", "--step-seconds", "1", "--scheduling-policy", "lifo"],
     "unknown --scheduling-policy"),
    (["--replay", "steps", "--arrival-from", "timestamp", "--step-seconds", "1", "--policy", "radix",
      "--schedule-policy", "best"], "unknown --schedule-policy"),
    (["--replay", "steps", "--arrival-from", "timestamp", "--step-seconds", "1", "--max-num-batched-tokens",
      "16"], "must be at least --max-num-seqs"),
    (["--replay", "steps", "--arrival-from", "timestamp", "--step-seconds", "1", "--warmup", "10"], "--warmup"),
    (["--concurrency", "4"], "--concurrency is retired"),
])
def test_bad_combinations_exit_2_with_one_line(args, needle, capsys):
    assert run(["simulate", str(DEMO), "--limit", "5", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_prompt_logprob_requests_in_the_step_replay(tmp_path):
    """vLLM: a prompt-logprob request reads nothing from the cache; SGLang: its
    logprob_start_len caps the match, here at 8 tokens."""
    prefix = list(range(64))
    prompts = [prefix + [100], prefix + [101], prefix + [102]]
    log = token_log(tmp_path / "l.jsonl", prompts, [[1, 2]] * 3, arrival_step=[0, 50, 100],
                    prompt_logprobs=[None, True, None], logprob_start_len=[None, None, 8])
    out = tmp_path / "r.jsonl"
    assert run(["simulate", str(log), "--replay", "steps", "--policy", "all", "--per-request", str(out)]) == 0
    rows = per_request(out)
    apc, radix = rows[rows.policy == "apc"], rows[rows.policy == "radix"]
    assert apc["cached_tokens"].tolist() == [0, 0, 64]
    assert radix["cached_tokens"].tolist() == [0, 0, 8]
    assert np.all(rows["finish_step"] >= 0)
