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
    results = run_driver("router_dynamo_driver.py", [s["job"] for s in scripts], DYNAMO)
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
