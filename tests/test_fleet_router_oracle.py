"""kvsim's routers against the REAL router code (``make oracle``; skipped with the reason without it).

Dynamo (ai-dynamo-runtime 1.6.1): every kvsim decision on randomized fleets is in the real
router's min-cost set, and kvsim's tie set is that set exactly (``docs/engines/routers.md §9.1``).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "oracle"))
from router_client import oracle_python, run_driver  # noqa: E402
import router_dynamo_script  # noqa: E402

pytestmark = pytest.mark.oracle

DYNAMO, DYNAMO_WHY = oracle_python("import dynamo._core; from dynamo._core import KvRouter")

CASES = [(seed, mode, seq) for mode in ("events", "approx") for seq in (True, False)
         for seed in range(3)]


@pytest.fixture(scope="module")
def dynamo_runs():
    if DYNAMO is None:
        pytest.skip(DYNAMO_WHY)
    scripts = [router_dynamo_script.build(100 + seed, mode, sequential=seq) for seed, mode, seq in CASES]
    results = run_driver("router_dynamo_driver.py", [s["job"] for s in scripts], DYNAMO, timeout=600)
    return list(zip(CASES, scripts, results))


def test_dynamo_every_decision_is_in_the_real_min_cost_set(dynamo_runs):
    """Events and approx, one at a time and with requests overlapping: kvsim's pick is one the real router could make."""
    for case, script, real in dynamo_runs:
        assert len(real) == len(script["decisions"])
        for mine, theirs in zip(script["decisions"], real):
            assert mine["rid"] == theirs["rid"]
            where = f"{case} {mine['rid']}: kvsim {mine['choice']} {mine['costs']}, real {theirs}"
            assert mine["choice"] in theirs["min_set"], where
            assert set(mine["candidates"]) == set(theirs["min_set"]), where
            assert theirs["best"] in theirs["min_set"], f"the real best_worker left its own min-cost set: {where}"


def test_dynamo_runs_exercise_overlap_load_and_ties(dynamo_runs):
    """The randomized fleets reach the rule's branches: cached prefixes, loaded replicas, ties and unique minima."""
    overlap = ties = unique = loaded = 0
    for _, script, real in dynamo_runs:
        for mine, theirs in zip(script["decisions"], real):
            overlap += theirs["overlap"] > 0
            ties += len(theirs["min_set"]) > 1
            unique += len(theirs["min_set"]) == 1
            loaded += len(set(theirs["costs"])) > 1 and theirs["overlap"] == 0
    assert overlap > 20 and ties > 10 and unique > 40 and loaded > 10, (overlap, ties, unique, loaded)


import router_smg_script  # noqa: E402

SMG, SMG_WHY = oracle_python("import pathlib, sys; p = pathlib.Path(sys.prefix) / 'routers' / 'smg' / 'smg'; "
                             "assert (p / 'smg_rs.abi3.so').exists(), p")
OLD, OLD_WHY = oracle_python("import pathlib, sys; p = pathlib.Path(sys.prefix) / 'routers' / 'sglang_router'; "
                             "assert (p / 'sglang_router' / 'sglang_router_rs.abi3.so').exists(), p")


@pytest.fixture(scope="module")
def smg_runs():
    if SMG is None:
        pytest.skip(SMG_WHY)
    jobs = [router_smg_script.sequential(200 + s) for s in range(3)] + \
           [router_smg_script.loaded(300 + s) for s in range(2)] + \
           [router_smg_script.hot(500 + s) for s in range(2)]
    results = run_driver("router_smg_driver.py", [router_smg_script.for_driver(j) for j in jobs], SMG,
                         timeout=600)
    return list(zip(jobs, results))


def test_smg_follows_prefix_owners_above_the_threshold(smg_runs):
    """smg 1.13.0 over HTTP: every request matched above cache_threshold in kvsim's token tree went
    to a holder of the matched node in the real gateway, kept there wherever the spill gate holds
    under both of its readings; one at a time, with requests held open, and with one hot prefix
    piling up on its owner (docs/engines/routers.md §2.4 item 1: the gate's band is not settled)."""
    totals = {"affinity": 0, "miss": 0, "shared_node": 0, "owner_loaded": 0, "spill": 0, "band": 0,
              "band_spilled": 0}
    for job, result in smg_runs:
        for k, v in router_smg_script.check(job, result).items():
            totals[k] += v
    # the runs reach the branches: affinity, misses, nodes held by several workers, a loaded owner
    # kept, and the gate's band, where the real gateway both spilled and kept
    assert totals["affinity"] > 60 and totals["miss"] > 20, totals
    assert totals["shared_node"] > 2 and totals["owner_loaded"] > 10, totals
    assert totals["band"] >= 10 and 1 <= totals["band_spilled"] < totals["band"], totals


@pytest.fixture(scope="module")
def old_run():
    if OLD is None:
        pytest.skip(OLD_WHY)
    jobs = [{**router_smg_script.sequential(400 + s, package="sglang_router"),
             "args": ["--policy", "cache_aware"]} for s in range(2)]
    return list(zip(jobs, run_driver("router_smg_driver.py",
                                     [router_smg_script.for_driver(j) for j in jobs], OLD, timeout=240)))


def test_sglang_router_0_3_2_sends_a_sequential_replay_to_one_worker(old_run):
    """sglang-router 0.3.2 (docs/engines/routers.md §2.7, SG3): with every load 0 the whole log lands on one worker,
    as kvsim's version=0.3.2 puts it on its lowest index."""
    for job, result in old_run:
        assert len(set(result["workers"])) == 1, result["workers"]
        router = router_smg_script.make_router("cache_aware", job["workers"], {"version": "0.3.2"})
        mine = []
        for i, op in enumerate(job["ops"]):
            req = router_smg_script.RouteRequest(i, op["rid"], router_smg_script.np.asarray(op["tokens"]), 0.0)
            mine.append(router.route(req, [router_smg_script.IDLE] * job["workers"], 0.0))
            router.finished(req, mine[-1], 0.0)
        assert set(mine) == {0}
