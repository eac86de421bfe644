"""The engine specs' scheduler scenarios, with their exact numbers, on kvsim's models.

vLLM: ``vllm_apc.md`` scenarios X1-X6 (scheduler level). SGLang: ``sglang_radix.md``
scenarios 15-16 (concurrent identical prompts, the next turn), 20-23 (the waiting-queue
policies) and 24 (``PrefillAdder`` arithmetic), and a designed workload on which ``lpm``
beats ``fcfs`` on hits. The numbers are the specs'; the oracle tests run the
step-level scenarios through the real schedulers (``test_sched_*_oracle.py``).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "oracle"))
from sched_scenarios import LPM_HITS, MODES, VLLM_EXPECTED, distinct, lpm_workload, sglang_15_16, vllm_scenarios

from kvsim.engines.sglang.adder import CONTINUE, NO_TOKEN, OTHER, PrefillAdder
from kvsim.engines.sglang.request import make_cache
from kvsim.engines.sglang.settings import RadixSettings
from kvsim.engines.sglang.policy import SchedulePolicy
from kvsim.engines.sglang.scheduler import SglangEngine, SglangRequest, SglangSchedSettings
from kvsim.engines.vllm.scheduler import VllmRequest, VllmSchedSettings, VllmScheduler
from tests.steps import replay_sglang_steps, replay_vllm_steps


# -- vLLM X1-X6 ----------------------------------------------------------------------------
def run_vllm(name: str, async_scheduling: bool):
    prompts, outputs, arrival, knobs = vllm_scenarios()[name]
    return replay_vllm_steps(prompts, outputs, arrival, VllmSchedSettings(async_scheduling=async_scheduling, **knobs))


@pytest.mark.parametrize("asynchronous", MODES, ids=["sync", "async"])
@pytest.mark.parametrize("name", sorted(VLLM_EXPECTED))
def test_vllm_scenario_cached_tokens(name, asynchronous):
    """X1-X6: each request's num_cached_tokens is the spec's number, with and without async scheduling."""
    assert run_vllm(name, asynchronous).cached_tokens.tolist() == VLLM_EXPECTED[name]


def test_x2_second_identical_prompt_hits_blocks_cached_in_the_same_step():
    """X2: both admitted in step 0; the second schedules only the 4 tokens after its 96 hits."""
    prompts, outputs, _, knobs = vllm_scenarios()["X2"]
    sched = VllmScheduler(VllmSchedSettings(**knobs))
    reqs = [VllmRequest(i, sched.cache.new_sequence(str(i), p), np.array(o), 0)
            for i, (p, o) in enumerate(zip(prompts, outputs))]
    for r in reqs:
        sched.add_request(r)
    plan = sched.schedule(0)
    assert [plan.scheduled[r] for r in reqs] == [100, 4]


@pytest.mark.parametrize("asynchronous", MODES, ids=["sync", "async"])
def test_x5_preemption_and_recompute(asynchronous):
    """X5: r1 preempts itself once, keeps cached 0 from its first admission, resumes after r0 ends."""
    r = run_vllm("X5", asynchronous)
    assert r.preemptions.tolist() == [0, 1]
    assert r.first_token_step.tolist() == [0, 0]
    assert r.finish_step[0] == 3            # r0: prefill, then three decodes
    assert r.finish_step[1] > r.finish_step[0]


def test_x5_resumed_request_relooks_up_its_surviving_block():
    """X5 step 5 (0-based 4): r1 comes back with 16 hit tokens and computes the other 17."""
    prompts, outputs, _, knobs = vllm_scenarios()["X5"]
    sched = VllmScheduler(VllmSchedSettings(async_scheduling=False, **knobs))
    r0, r1 = (VllmRequest(i, sched.cache.new_sequence(str(i), p), np.array(o), 0)
              for i, (p, o) in enumerate(zip(prompts, outputs)))
    sched.add_request(r0)
    sched.add_request(r1)
    from kvsim.engines.base import StepResult
    result = StepResult.empty("vllm", 2)
    plans = []
    for step in range(5):
        plan = sched.schedule(step)
        plans.append({r.index: n for r, n in plan.scheduled.items()})
        sched.update_from_output(plan, result)
    assert plans[1] == {0: 1}                        # step 1: r1 preempted itself
    assert plans[4] == {1: 17}                       # 33 tokens, 16 of them hit
    assert r1.num_computed_tokens == 33 and r1.num_preemptions == 1


def test_x6_chunked_prefill_blocks_visible_to_a_later_admission():
    """X6: r1 is admitted in step 2 behind r0's last 20-token chunk, with 96 hits."""
    r = run_vllm("X6", False)
    assert r.cached_tokens.tolist() == [0, 96]
    assert r.first_token_step.tolist() == [2, 5]     # r1: 104 tokens at 20 + 40 + 40 + 4


# -- SGLang 15-16 ----------------------------------------------------------------------------
def test_sglang_15_identical_prompts_together_share_nothing_then_dedup():
    """15: cold R1, R2 = [1..10] in one batch get 0 and 0; afterwards 86 free, tree 14 evictable."""
    prompts, outputs, _, knobs = sglang_15_16()
    engine = SglangEngine(SglangSchedSettings(**knobs), prompts[:2], outputs[:2])
    from kvsim.drive.clock import run_steps
    run_steps(engine, np.array([0, 0]))
    assert engine.result.cached_tokens.tolist() == [0, 0]
    assert engine.cache.available_size == 86
    assert engine.cache.tree.total_size == 14 and engine.cache.evictable_size == 14


def test_sglang_16_next_turn_matches_len_minus_one():
    """16: after 15, [1..10] gets 9 and [1..10] + reply + 3 new tokens gets 14."""
    prompts, outputs, arrival, knobs = sglang_15_16()
    r = replay_sglang_steps(prompts, outputs, arrival, SglangSchedSettings(**knobs))
    assert r.cached_tokens.tolist() == [0, 0, 9, 14]


# -- SGLang 20-23: the waiting-queue policies --------------------------------------------------
class Queue:
    """A tree cache and waiting requests built from token lists, for calc_priority."""

    def __init__(self) -> None:
        self.cache = make_cache(RadixSettings(capacity=100_000))
        self.reqs: dict[str, SglangRequest] = {}

    def cached(self, tokens) -> None:
        tokens = np.asarray(tokens, np.int64)
        self.cache.tree.insert(tokens, self.cache.pool.alloc_pages(len(tokens)))

    def wait(self, name: str, tokens, max_new: int = 10) -> SglangRequest:
        kv = self.cache.new_state(np.asarray(tokens), np.zeros(max_new, np.int64), max_new)
        self.reqs[name] = SglangRequest(len(self.reqs), kv, max_new, True)
        return self.reqs[name]

    def order(self, policy: str, names: list[str]) -> list[str]:
        queue = [self.reqs[n] for n in names]
        SchedulePolicy(policy, self.cache).calc_priority(queue)
        back = {id(r): n for n, r in self.reqs.items()}
        return [back[id(r)] for r in queue]


def test_sglang_20a_lpm_deprioritizes_in_batch_duplicates():
    """20(a): [x, r1, r2, r3, y] -> [x, r1, y, r2, r3]; x matches 50, the others 0."""
    q = Queue()
    x = distinct(1000, 60)
    q.cached(x[:50])
    shared = distinct(2000, 40)
    q.wait("x", x)
    for k in (1, 2, 3):
        q.wait(f"r{k}", shared + distinct(3000 + 10 * k, 3))
    q.wait("y", distinct(4000, 10))
    assert q.order("lpm", ["x", "r1", "r2", "r3", "y"]) == ["x", "r1", "y", "r2", "r3"]
    assert q.reqs["x"].kv.prefix_len == 50
    assert all(q.reqs[n].kv.prefix_len == 0 for n in ("r1", "r2", "r3", "y"))


@pytest.mark.parametrize("n, expected", [(31, ["a", "b", "z"]), (32, ["a", "z", "b"])])
def test_sglang_20b_deprioritize_threshold(n, expected):
    """20(b): two requests sharing n uncached tokens; at 32 the second one waits."""
    q = Queue()
    q.wait("a", distinct(100, n) + [7001])
    q.wait("b", distinct(100, n) + [7002])
    q.wait("z", distinct(5000, 20))
    assert q.order("lpm", ["a", "b", "z"]) == expected


@pytest.mark.parametrize("h, expected", [(32, ["a", "z", "b"]), (33, ["a", "b", "z"])])
def test_sglang_20c_in_batch_check_only_for_short_real_hits(h, expected):
    """20(c): a and b share 100 tokens, h of them cached; above 32 cached no in-batch check."""
    q = Queue()
    shared = distinct(100, 100)
    q.cached(shared[:h])
    q.wait("a", shared + [7001])
    q.wait("b", shared + [7002])
    q.wait("z", distinct(5000, 20))
    assert q.order("lpm", ["a", "b", "z"]) == expected


def test_sglang_21_lpm_sort_is_stable():
    """21: [n1(0), h50, h100, n2(0), h20] -> [h100, h50, h20, n1, n2]."""
    q = Queue()
    for name, hit, base in (("h50", 50, 1000), ("h100", 100, 2000), ("h20", 20, 3000)):
        q.cached(distinct(base, hit))
        q.wait(name, distinct(base, hit + 10))
    q.wait("n1", distinct(5000, 30))
    q.wait("n2", distinct(6000, 30))
    assert q.order("lpm", ["n1", "h50", "h100", "n2", "h20"]) == ["h100", "h50", "h20", "n1", "n2"]


def test_sglang_22_dfs_weight_visits_heavier_subtrees_first():
    """22: cache [1,2,3], [7,8,9]; [q1..q4] -> [q2, q3, q1, q4]; q3's match splits [7,8,9]."""
    q = Queue()
    q.cached([1, 2, 3])
    q.cached([7, 8, 9])
    q.wait("q1", [1, 2, 3, 4])
    q.wait("q2", [7, 8, 9, 10])
    q.wait("q3", [7, 8, 5])
    q.wait("q4", [42, 43])
    assert q.order("dfs-weight", ["q1", "q2", "q3", "q4"]) == ["q2", "q3", "q1", "q4"]
    assert q.cache.tree.paths() == [(2,), (2, 1), (3,)]


@pytest.mark.parametrize("misses, hit_first", [(128, False), (127, True)])
def test_sglang_23_lpm_falls_back_to_fcfs_above_128(misses, hit_first):
    """23: 128 misses + one 100-token hit stay in order, unmatched; 127 + 1 sort the hit first."""
    q = Queue()
    names = [f"m{k}" for k in range(misses)]
    for k, name in enumerate(names):
        q.wait(name, distinct(10_000 + 100 * k, 20))
    q.cached(distinct(1, 100))
    q.wait("hit", distinct(1, 110))
    order = q.order("lpm", names + ["hit"])
    assert order == (["hit"] + names if hit_first else names + ["hit"])
    assert q.reqs["hit"].num_matched_prefix_tokens == (100 if hit_first else 0)


# -- SGLang 24: PrefillAdder arithmetic -----------------------------------------------------------
def adder_case(chunk: int | None, cached: int = 0):
    cache = make_cache(RadixSettings(capacity=1000 + cached))
    if cached:
        cache.tree.insert(np.arange(cached, dtype=np.int64), cache.pool.alloc_pages(cached))
    return cache, PrefillAdder(cache, [], 0.7, 16384, chunk)


def add(cache, adder, tokens, max_new: int = 100) -> str:
    kv = cache.new_state(np.asarray(tokens, np.int64), np.zeros(max_new, np.int64), max_new)
    req = SglangRequest(0, kv, max_new, False)
    cache.match(kv, req.seq_len, limit=req.seq_len - 1)
    kv.protected = kv.prefix_len
    return adder.add_one_req(req)


def test_sglang_24_no_token_when_the_third_prompt_does_not_fit():
    """24: 1000 free, three disjoint 300-token prompts, max_new 100: CONTINUE, CONTINUE, NO_TOKEN."""
    cache, adder = adder_case(8192)
    assert [add(cache, adder, distinct(k * 1000, 300)) for k in range(3)] == [CONTINUE, CONTINUE, NO_TOKEN]


def test_sglang_24_second_prompt_chunked_to_the_rest_of_the_chunk():
    """24: chunk 512: R1 whole (300), R2 chunked to 212 tokens, then OTHER."""
    cache, adder = adder_case(512)
    assert add(cache, adder, distinct(0, 300)) == CONTINUE
    assert add(cache, adder, distinct(1000, 300)) == OTHER
    r2 = adder.can_run[1]
    assert adder.new_chunked_req is r2 and r2.kv.extend_end - r2.kv.prefix_len == 212


def test_sglang_24_cached_prefix_admits_all_three():
    """24: 300 cached (evictable): R1 = those + 50, R2 = 300 new, R3 = 100 new all admitted."""
    cache, adder = adder_case(8192, cached=300)
    results = [add(cache, adder, list(range(300)) + distinct(5000, 50)),
               add(cache, adder, distinct(6000, 300)), add(cache, adder, distinct(7000, 100))]
    assert results == [CONTINUE] * 3
    assert sum(r.kv.prefix_len for r in adder.can_run) == 300                          # #cached-token
    assert sum(r.kv.extend_end - r.kv.prefix_len for r in adder.can_run) == 450        # #new-token
    assert cache.tree.protected_size == 300


# -- lpm beats fcfs ------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", sorted(LPM_HITS))
def test_lpm_beats_fcfs_on_a_designed_workload(policy):
    """Longest-prefix-first groups same-prompt requests; fcfs interleaves them and evicts."""
    prompts, outputs, arrival, knobs = lpm_workload()
    r = replay_sglang_steps(prompts, outputs, arrival, SglangSchedSettings(schedule_policy=policy, **knobs))
    assert int(r.cached_tokens.sum()) == LPM_HITS[policy]
    assert LPM_HITS["lpm"] > 1.5 * LPM_HITS["fcfs"]
