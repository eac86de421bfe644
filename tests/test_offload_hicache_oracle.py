"""kvsim's WHOLE SGLang replay with HiCache against the REAL SGLang 0.5.23 scheduler + UnifiedRadixCache.

The tier oracle process (``offload_runs.all_systems``) runs the acceptance workloads of
``docs/engines/offload.md §3.7``, the tier models' random workloads and the engine workloads
of ``oracle/offload_engine_jobs.py`` (shared prefixes, multi-turn sessions, repeats, tenants;
device pools of 256-512 tokens, pages of 1-16, host pools of 0.5-2x the device, every write
policy) through SGLang's real scheduler with the hierarchical cache on. kvsim replays the
requests SGLang admitted through its own engine with HiCache, resolved from the options as
``kvsim simulate --policy radix --offload hicache`` resolves them: per request the reported
``cached_tokens`` and its device / host split must be equal.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "oracle"))
import offload_runs  # noqa: E402
from offload_engine_jobs import kvsim_workload, step_replay  # noqa: E402

from kvsim.engines.options import SimOptions  # noqa: E402
from kvsim.engines.sglang.sequential import RadixFast, RadixReference  # noqa: E402
from kvsim.engines.sglang.settings import RadixSettings  # noqa: E402

pytestmark = pytest.mark.oracle


@pytest.fixture(scope="module")
def real():
    runs = offload_runs.all_systems()
    if "skip" in runs:
        pytest.skip(runs["skip"])
    if not runs["hicache"]:
        pytest.skip(runs["hicache_skip"])
    return runs


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """The driver's pool shape as a config.json: 2 layers, 1 KV head of 4, fp32 (64 bytes per token)."""
    path = tmp_path_factory.mktemp("model") / "config.json"
    path.write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 1, "num_key_value_heads": 1,
                                "hidden_size": 4, "torch_dtype": "float32"}))
    return str(path)


def options(job: dict, model: str) -> SimOptions:
    """The options of a driver job as the CLI builds them (the driver's loop is the overlap
    scheduler's, ``sglang_sched_driver.Replay``, with 8192-token chunks)."""
    extra = {"offload": "hicache", "hicache_write_policy": job.get("hicache_write_policy", "write_through"),
             "hicache_ratio": job.get("hicache_ratio", 2.0), "overlap": True, "chunked_prefill_size": 8192}
    if job.get("hicache_size"):
        extra["hicache_size"] = job["hicache_size"]
    return SimOptions(max_total_tokens=job["capacity"], page_size=job.get("page_size", 1), model=model, extra=extra)


def settings(job: dict, model: str) -> RadixSettings:
    return RadixSettings.from_options(options(job, model))


def test_host_pool_from_the_options_is_the_real_pool(real, model):
    """--hicache-ratio / --hicache-size give the real host pool's size."""
    for name, (job, res) in real["hicache"].items():
        if name.startswith("pool") and job["capacity"] % job["page_size"] == 0:
            assert settings(job, model).hicache.host_tokens == res["info"]["host_tokens"], name


def test_sequential_replay_equals_the_real_engine_per_request(real, model):
    """Per request of every sequential run: cached_tokens and its (device, host) split as
    split_cached_prefix_by_tier reports them; kvsim replays the requests SGLang admitted."""
    runs = [(j, r) for j, r in [*real["hicache"].values(), *real["engine_hicache"]]
            if j.get("mode", "sequential") == "sequential" and j["capacity"] % j.get("page_size", 1) == 0
            and len(r["cached"]) > 1]
    assert len(runs) >= 12
    host_hits = {}
    for job, res in runs:
        admitted = res["cached"] >= 0
        work = kvsim_workload(job["workload"], admitted)
        s = settings(job, model)
        for cls in (RadixFast, RadixReference):
            engine = cls.for_workload(s, work)
            cols = engine.replay(work)
            run = engine.tier_run()
            name = f"{Path(job['workload']).name} {cls.__name__}"
            assert not cols.rejected.any(), name
            np.testing.assert_array_equal(cols.cached_tokens, res["cached"][admitted], err_msg=name)
            np.testing.assert_array_equal(run.by_tier["cpu"], res["host"][admitted], err_msg=name)
            np.testing.assert_array_equal(run.by_tier["gpu"], res["device"][admitted], err_msg=name)
            engine.tree.check()
        policy = job.get("hicache_write_policy", "write_through")
        host_hits[policy] = host_hits.get(policy, 0) + int(res["host"][admitted].sum())
    # every write policy serves hits from host under pressure
    assert all(host_hits.get(p, 0) > 500 for p in ("write_through", "write_through_selective", "write_back")), \
        host_hits


def test_step_clock_replay_equals_the_real_scheduler_per_request(real, model):
    """On the step clock (bursts of arrivals sharing batches, backups and load-backs acknowledged a
    step later, every write policy): per request cached_tokens, its host part and the first-token
    and finishing steps equal the real scheduler's."""
    from kvsim.engines.sglang.hicache import HiCacheSchedSettings
    from kvsim.engines.sglang.scheduler import scheduler_settings

    runs = [(j, r) for j, r in [*real["hicache"].values(), *real["engine_hicache"]] if j.get("mode") == "steps"]
    assert len(runs) >= 6
    host_hits = {}
    for job, res in runs:
        s, _ = scheduler_settings(options(job, model), {"max_running_requests": job["max_running_requests"]})
        assert isinstance(s, HiCacheSchedSettings)
        got, name = step_replay(s, job["workload"]), Path(job["workload"]).name
        served = res["cached"] >= 0
        np.testing.assert_array_equal(got.rejected, ~served, err_msg=name)
        np.testing.assert_array_equal(got.cached_tokens[served], res["cached"][served], err_msg=name)
        np.testing.assert_array_equal(got.extra["offload"].by_tier["cpu"][served], res["host"][served], err_msg=name)
        for key in ("first_token_step", "finish_step"):
            np.testing.assert_array_equal(getattr(got, key)[served], res[key][served], err_msg=f"{name} {key}")
        policy = job.get("hicache_write_policy", "write_through")
        host_hits[policy] = host_hits.get(policy, 0) + int(res["host"][served].sum())
    assert all(host_hits.get(p, 0) > 100 for p in ("write_through", "write_through_selective", "write_back")), \
        host_hits
