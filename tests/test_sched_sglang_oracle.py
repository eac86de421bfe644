"""Differential tests: kvsim's SGLang scheduler model against the REAL SGLang 0.5.23 scheduler.

26 seeded workloads x 300 requests arriving in bursts on a step clock, replayed through
SGLang's own ``Scheduler`` methods (``get_next_batch_to_run``, ``PrefillAdder``,
``SchedulePolicy``, ``ScheduleBatch``, the default ``UnifiedRadixCache`` with its Rust
core, the real allocator and request pool, the batch-result processor) with a fake model
(``tests/oracle/sglang_sched_driver.py``, one subprocess for all of them) and through
``kvsim.engines.sglang.scheduler``. Per request the cached tokens, the step of the first
token, the finishing step, the retraction count and the rejection must be equal.
The configurations cover every schedule policy (``lpm`` also above its 128-request
fallback), the overlap scheduler on and off, page sizes 1 and 16, chunked prefill from
64 tokens to off, ``max_running_requests`` 4-64, finishing by length and by a stop
token, unknown replies (synthesized negative ids), LoRA and cache-salt namespaces, logprob
requests (``logprob_start_len`` caps their match), and
memory tight enough for NO_TOKEN stalls and decode retraction. The specs'
scenarios 15-16 and the lpm-beats-fcfs workload run in the same subprocess.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "oracle"))
import sched_client
from sched_scenarios import LPM_HITS, lpm_workload, sglang_15_16, sglang_job
from sched_workloads import SchedMix, random_workload, with_stop_token

from kvsim.engines.sglang.scheduler import SglangSchedSettings
from tests.steps import replay_sglang_steps, replay_vllm_steps

pytestmark = pytest.mark.oracle

N = 300
BASE = dict(max_running_requests=16, chunked_prefill_size=256, max_prefill_tokens=1024)
# long replies behind short prompts, arriving in big bursts: admission over-commits once
# new_token_ratio has decayed, and decode retracts (stop-token finishes only: a request
# ignoring EOS reserves its whole remaining output)
RETRACT_MIX = dict(system_len=(4, 40), user_len=(1, 40), output_len=(200, 500), burst=(40, 80), gap=300,
                   p_session=0.0)
RETRACT = dict(max_running_requests=64, chunked_prefill_size=128, max_prefill_tokens=512, max_new_tokens=600)

# (seed, workload knobs, stop-token finish, memory (x the largest request), settings)
CONFIGS = [
    (1, {}, False, 3, dict(BASE, schedule_policy="fcfs", overlap=False)),
    (1, {}, False, 3, dict(BASE, schedule_policy="fcfs", overlap=True)),
    (2, {}, False, 3, dict(BASE, schedule_policy="lpm", overlap=False)),
    (2, dict(p_logprob=0.3), False, 3, dict(BASE, schedule_policy="lpm", overlap=True)),
    (3, {}, False, 3, dict(BASE, schedule_policy="dfs-weight", overlap=True)),
    (3, {}, False, 3, dict(BASE, schedule_policy="dfs-weight", overlap=False)),
    (4, {}, False, 2, dict(BASE, schedule_policy="lof", overlap=True)),
    (5, {}, False, 2, dict(BASE, schedule_policy="random", overlap=True, random_seed=7)),
    (5, {}, False, 2, dict(BASE, schedule_policy="random", overlap=False, random_seed=3)),
    (6, {}, False, 3, dict(BASE, page_size=16, schedule_policy="fcfs", overlap=True)),
    (7, dict(p_logprob=0.3), False, 3, dict(BASE, page_size=16, schedule_policy="lpm", overlap=False)),
    (8, {}, False, 3, dict(BASE, schedule_policy="fcfs", overlap=True, chunked_prefill_size=0,
                           max_prefill_tokens=512)),
    (9, dict(p_logprob=0.3), False, 3, dict(BASE, schedule_policy="lpm", overlap=True, chunked_prefill_size=64)),
    (10, {}, False, 3, dict(BASE, schedule_policy="fcfs", overlap=True, max_running_requests=4)),
    (11, {}, False, 1.2, dict(BASE, schedule_policy="fcfs", overlap=True)),
    (12, dict(p_session=0.7), False, 4, dict(BASE, schedule_policy="lpm", overlap=True)),
    (13, dict(burst=(150, 250), gap=250), False, 40, dict(BASE, schedule_policy="lpm", overlap=True,
                                                        max_running_requests=32)),
    (14, RETRACT_MIX, True, 8, dict(RETRACT, schedule_policy="fcfs", overlap=True, schedule_conservativeness=0.3)),
    (14, RETRACT_MIX, True, 8, dict(RETRACT, schedule_policy="fcfs", overlap=False, schedule_conservativeness=0.3)),
    (15, dict(RETRACT_MIX, p_logprob=0.3), True, 8, dict(RETRACT, schedule_policy="lpm", overlap=True)),
    (16, RETRACT_MIX, True, 12, dict(RETRACT, schedule_policy="lof", overlap=False, schedule_conservativeness=0.5)),
    (17, RETRACT_MIX, True, 8, dict(RETRACT, page_size=16, schedule_policy="fcfs", overlap=True,
                                    schedule_conservativeness=0.3)),
    (18, dict(output_len=(5, 80)), True, 3, dict(BASE, schedule_policy="dfs-weight", overlap=True,
                                                 max_new_tokens=100)),
    (19, dict(output_len=(5, 80)), True, 2, dict(BASE, page_size=16, schedule_policy="random", overlap=True,
                                                 random_seed=11)),
    (20, dict(p_synth=0.5), False, 2, dict(BASE, schedule_policy="lpm", overlap=True)),
    (21, dict(p_namespace=0.6, p_session=0.6), False, 2, dict(BASE, schedule_policy="lpm", overlap=True)),
]
RETRACTING = [k for k, c in enumerate(CONFIGS) if c[1].get("output_len") == RETRACT_MIX["output_len"]]
LOGPROBS = [k for k, c in enumerate(CONFIGS) if c[1].get("p_logprob")]


def _settings(w, stop: bool, factor: float, knobs: dict) -> SglangSchedSettings:
    p = knobs.get("page_size", 1)
    cap = int(factor * int(w.peak_tokens().max()))
    return SglangSchedSettings(capacity=cap - cap % p, finish="stop" if stop else "length", **knobs)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    python, why = sched_client.oracle_python("sglang")
    if python is None:
        pytest.skip(f"real SGLang scheduler unavailable: {why}")
    tmp = tmp_path_factory.mktemp("sglang-sched")
    out, jobs = [], []
    for k, (seed, knobs, stop, factor, settings) in enumerate(CONFIGS):
        w = random_workload(seed, SchedMix(n=N, **knobs))
        if stop:
            w = with_stop_token(w)
        s = _settings(w, stop, factor, settings)
        path = sched_client.write_workload(tmp / f"w{k}.npz", w.prompts, w.outputs, w.arrival, w.priority,
                                           loras=w.loras, salts=w.salts, logprob_starts=w.logprob_starts)
        jobs.append(sglang_job(path, s))
        out.append((w, s))
    # the spec's scenarios 15-16 and the lpm-vs-fcfs workload run in the same subprocess
    prompts, outputs, arrival, knobs = sglang_15_16()
    jobs.append(sglang_job(sched_client.write_workload(tmp / "s15.npz", prompts, outputs, arrival),
                           SglangSchedSettings(**knobs)))
    prompts, outputs, arrival, knobs = lpm_workload()
    path = sched_client.write_workload(tmp / "lpm.npz", prompts, outputs, arrival)
    for policy in sorted(LPM_HITS):
        jobs.append(sglang_job(path, SglangSchedSettings(schedule_policy=policy, **knobs)))
    results = sched_client.run_jobs("sglang", jobs, python)
    runs = [(w, s, r) for (w, s), r in zip(out, results)]
    return runs, dict(zip(["15-16", *sorted(LPM_HITS)], results[len(out):]))


def _ids(c) -> str:
    seed, _, stop, factor, s = c
    return (f"seed{seed}-{s['schedule_policy']}-p{s.get('page_size', 1)}-x{factor}-"
            f"{'overlap' if s['overlap'] else 'normal'}-{'stop' if stop else 'length'}")


@pytest.mark.parametrize("k", range(len(CONFIGS)), ids=[_ids(c) for c in CONFIGS])
def test_steps_match_sglang(runs, k):
    """Per request: cached tokens, first-token step, finish step, retractions, rejection equal SGLang's."""
    w, settings, real = runs[0][k]
    ours = replay_sglang_steps(w.prompts, w.outputs, w.arrival, settings, w.loras, w.salts, w.logprob_starts)
    np.testing.assert_array_equal(ours.rejected, real["rejected"])
    np.testing.assert_array_equal(ours.cached_tokens, real["cached"])
    np.testing.assert_array_equal(ours.first_token_step, real["first_token_step"])
    np.testing.assert_array_equal(ours.finish_step, real["finish_step"])
    np.testing.assert_array_equal(ours.preemptions, real["preemptions"])
    assert ours.steps == int(real["steps"])
    served = ~ours.rejected
    assert ours.cached_tokens[served].sum() > 0
    assert (ours.finish_step[served] - ours.first_token_step[served]).max() > 0


def test_retraction_happens(runs):
    """The over-committing workloads really retract running requests, in SGLang and in kvsim."""
    assert all(runs[0][k][2]["preemptions"].sum() > 0 for k in RETRACTING)


def test_logprob_starts_cap_matches(runs):
    """The logprob configurations hold requests whose start cuts their match short (radix.md §2.1),
    and the cap changes what they get: without it they would hit more."""
    for k in LOGPROBS:
        w, settings, real = runs[0][k]
        lengths = np.array([len(p) for p in w.prompts])
        capped = (w.logprob_starts >= 0) & (w.logprob_starts < lengths - 1) & ~real["rejected"]
        assert capped.sum() >= 20
        assert (real["cached"][capped] <= w.logprob_starts[capped]).all()
        uncapped = replay_sglang_steps(w.prompts, w.outputs, w.arrival, settings, w.loras, w.salts)
        assert uncapped.cached_tokens[capped].sum() > real["cached"][capped].sum()


def test_lpm_falls_back_above_128_waiting(runs):
    """The burst workload queues more than 128 requests at once (lpm's fcfs fallback)."""
    w = runs[0][16][0]
    assert np.bincount(w.arrival).max() > 128


def test_real_sglang_gives_the_scenario_numbers(runs):
    """Scenarios 15-16's cached tokens, and lpm's and fcfs's hits on the designed workload."""
    real = runs[1]
    assert real["15-16"]["cached"].tolist() == [0, 0, 9, 14]
    for policy, hits in LPM_HITS.items():
        assert int(real[policy]["cached"].sum()) == hits
