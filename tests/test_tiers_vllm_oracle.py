"""kvsim's vLLM CPU-tier model against the REAL vLLM 0.33.0 code (``docs/engines/offload.md §5``).

One subprocess runs every job (``offload_vllm_driver.py``):

- random operation scripts on the real ``CPUOffloadingManager`` (lru, arc, store_threshold
  with a small reuse tracker, several capacities) and on kvsim's ``CPUOffloadManager``:
  every answer equal (lookups, kept / evicted / refused stores, loads);
- the real v1 ``Scheduler`` with the ``OffloadingConnector`` on the acceptance workloads
  (exact per-request numbers) and on random workloads under GPU and CPU pressure
  (shared prefixes, multi-turn, tenants; sequential and step-clock arrivals; lru / arc,
  a store threshold, offload blocks of 1, 2 and 4 GPU blocks): the connector calls it made
  replayed through kvsim's connector give the same answers and the same jobs, and for the
  sequential runs kvsim's :class:`SequentialOffload`, given each request's real GPU hit,
  reports the same external tokens.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "oracle"))
import offload_runs  # noqa: E402
from offload_manager_ops import interpret  # noqa: E402
from offload_replay import replay_calls, settings_of  # noqa: E402
from offload_runs import PAGE  # noqa: E402

from kvsim.tiers.vllm_connector import OffloadConnector  # noqa: E402
from kvsim.tiers.vllm_offload import CPUOffloadManager, num_cpu_chunks  # noqa: E402
from kvsim.tiers.vllm_policies import RequestContext  # noqa: E402
from kvsim.tiers.vllm_sequential import SequentialOffload  # noqa: E402

pytestmark = pytest.mark.oracle


@pytest.fixture(scope="module")
def real():
    """Every job through the real vLLM code, in one subprocess (shared with LMCache's jobs)."""
    runs = offload_runs.all_systems()
    if "skip" in runs:
        pytest.skip(runs["skip"])
    return runs


class KvsimManager:
    """The script adapter over kvsim's manager (the real one is in the driver)."""

    ANSWER = {"hit": "hit", "hit_pending": "pending", "miss": "miss"}

    def __init__(self, job: dict) -> None:
        self.m = CPUOffloadManager(job["capacity"], job["policy"], job["store_threshold"], job["tracker_size"])
        self.ctx: dict[str, RequestContext] = {}

    def new(self, rid, positions):
        self.ctx[rid] = RequestContext(rid, dict(positions))

    def lookup(self, rid, key):
        return self.ANSWER[self.m.lookup(key).value]

    def prepare_load(self, rid, keys):
        self.m.prepare_load(keys, self.ctx[rid])

    def complete_load(self, rid, keys):
        self.m.complete_load(keys)

    def prepare_store(self, rid, keys):
        plan = self.m.prepare_store(keys, self.ctx[rid])
        return None if plan is None else [plan.keys_to_store, plan.evicted]

    def complete_store(self, rid, keys):
        self.m.complete_store(keys)

    def finished(self, rid):
        self.m.on_request_finished(self.ctx[rid])


def test_manager_answers_equal_the_real_manager(real):
    """24 random scripts: kvsim's manager answers every call as vLLM's CPUOffloadingManager."""
    totals = {"evicted": 0, "refused": 0, "loaded": 0, "pending": 0}
    for job, want in real["managers"]:
        got = json.loads(json.dumps(interpret(job["script"], KvsimManager(job))))
        first = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), len(want) - 1)
        assert got == want, f"{job['policy']} thr={job['store_threshold']} cap={job['capacity']}: op {first}: " \
                            f"kvsim {got[first:first + 1]}, vLLM {want[first:first + 1]}"
        for entry in want:
            if entry[0] == "store":
                totals["refused" if entry[2] is None else "evicted"] += 1 if entry[2] is None else len(entry[2][1])
            elif entry[0] == "load":
                totals["loaded"] += entry[2]
            elif entry[0] == "lookup":
                totals["pending"] += entry[2].count("pending")
    # the scripts reach every rule: evictions, refused stores, loads, pending chunks
    assert all(v > 50 for v in totals.values()), totals


def test_acceptance_scenarios_in_the_real_scheduler(real):
    """offload.md §1.13 V1-V7, per request (local, external) as the real scheduler reports them."""
    r = {name: res for name, (_, res) in real["scenarios"].items()}

    def pair(name):
        return r[name]["local"].tolist(), r[name]["external"].tolist()

    assert pair("V1") == ([0, 0, 0, 48, 48], [0, 0, 0, 0, 0])
    assert pair("V2") == ([0, 0, 0, 0, 48], [0, 0, 0, 48, 0])                   # V2, V3
    assert pair("V2-async") == pair("V2")
    assert r["V2"]["counters"]["resident_chunks"] == 14                          # V4
    assert pair("V5") == ([0, 0, 48, 48], [0, 0, 0, 144])
    assert pair("V6") == ([0, 0, 0], [0, 0, 48])
    matches = [c[3] for c in r["V6"]["calls"] if c[0] == "match" and c[1]["rid"] == "2"]
    assert matches[0] == [None, False] and matches[1] == [48, True]              # deferred, then hit
    assert pair("V7") == ([0, 0, 0, 0, 0], [0, 0, 0, 0, 48])
    assert r["V7"]["counters"]["resident_chunks"] == 3
    assert r["V7"]["counters"]["skipped_by_threshold"] > 0


def test_connector_replays_the_real_schedulers_calls(real):
    """Every connector call of every real run, replayed on kvsim's connector: same answers,
    same load and store jobs, same tier contents at the end."""
    runs = [*real["scenarios"].values(), *real["random"]]
    for job, res in runs:
        num_chunks = res["counters"]["num_chunks"]
        assert num_chunks == num_cpu_chunks(job["cpu_bytes_to_use"], PAGE,
                                            (job.get("offload_block_size") or 16) // 16)
        conn = OffloadConnector(settings_of(job, num_chunks))
        assert replay_calls(res["calls"], conn) is None, job
        c = conn.manager.counters
        assert len(conn.manager) == res["counters"]["resident_chunks"]
        assert c.evicted_chunks == res["counters"]["evicted_chunks"]
        assert c.store_failures == res["counters"]["store_failures"]
        assert c.skipped_by_threshold == res["counters"]["skipped_by_threshold"]
    seen = {k: sum(r["counters"][k] for _, r in real["random"]) for k in
            ("evicted_chunks", "store_failures", "loaded_chunks")}
    seen["preemptions"] = sum(int(r["preemptions"].sum()) for _, r in real["random"])
    seen["external"] = sum(int(r["external"].sum()) for _, r in real["random"])
    seen["deferred"] = sum(1 for _, r in real["random"] for c in r["calls"] if c[0] == "match" and c[3][0] is None)
    assert all(v > 0 for v in seen.values()), seen


def test_sequential_replay_reports_the_real_external_tokens(real):
    """kvsim's SequentialOffload, given each request's real GPU hit, reports the real
    num_external_cached_tokens on every request of every sequential run."""
    runs = [(j, r) for j, r in [*real["scenarios"].values(), *real["random"]]
            if j.get("mode", "sequential") == "sequential"]
    assert len(runs) >= 10
    for job, res in runs:
        tier = SequentialOffload(settings_of(job, res["counters"]["num_chunks"]),
                                 token_budget=int(job.get("max_num_batched_tokens", 8192)))
        final = {c[1]["rid"]: c[1] for c in res["calls"] if c[0] == "finished"}
        got = []
        for i in range(len(res["local"])):
            if res["rejected"][i]:
                got.append(-1)
                continue
            st = final[str(i)]
            served = tier.serve(str(i), st["hashes"], st["num_prompt_tokens"],
                                st["num_tokens"] - st["num_prompt_tokens"], int(res["local"][i]))
            got.append(served.external)
        assert got == res["external"].tolist(), job
