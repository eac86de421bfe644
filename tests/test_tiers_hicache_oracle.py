"""The real SGLang 0.5.23 HiCache on a CPU (``offload_hicache_driver.py``), and kvsim's host-pool
arithmetic against it (``docs/engines/offload.md §3``, §5).

The shared tier oracle process (``offload_runs.all_systems``): the acceptance workloads of
offload.md §3.7 through the real scheduler
with ``UnifiedRadixCache.init_hicache`` (exact per-request ``cached_tokens`` and its
device / host split), host pools of several device sizes, pages, ratios and a fixed
``hicache_size`` (kvsim's :func:`host_pool_tokens` gives the real pool's size), and random
multi-turn workloads under device pressure for each write policy, sequential and on the
step clock (the driver is ready for the per-request engine differential).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "oracle"))
import offload_runs  # noqa: E402
from offload_runs import HICACHE_POLICIES as POLICIES, HICACHE_POOLS as POOLS  # noqa: E402

from kvsim.tiers.hicache import host_pool_tokens, mha_host_bytes_per_token, split_cached_prefix  # noqa: E402

pytestmark = pytest.mark.oracle


@pytest.fixture(scope="module")
def real():
    """The HiCache jobs (offload_runs.hicache_jobs) through the real SGLang code."""
    runs = offload_runs.all_systems()
    if "skip" in runs:
        pytest.skip(runs["skip"])
    if not runs["hicache"]:
        pytest.skip(runs["hicache_skip"])
    return {name: res for name, (_, res) in runs["hicache"].items()}


def split(res) -> tuple[list, list, list]:
    return res["cached"].tolist(), res["device"].tolist(), res["host"].tolist()


def test_acceptance_scenarios(real):
    """offload.md §3.7 H1-H5: cached_tokens and its (device, host) split per request."""
    r = real
    assert split(r["H-write_through"]) == ([0, 0, 0, 48], [0, 0, 0, 0], [0, 0, 0, 48])            # H1
    assert split(r["H-write_through_selective"]) == ([0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0])    # H2
    assert split(r["H-write_back"]) == ([0, 0, 0, 48], [0, 0, 0, 0], [0, 0, 0, 48])               # H3
    assert split(r["H4"]) == ([0, 0, 0, 48], [0, 0, 0, 48], [0, 0, 0, 0])                         # H4
    assert r["H-write_through"]["info"]["host_tokens"] == 336
    # H5 (page 1): a 9-token host continuation is not loaded; request 3 finds the 9 tokens
    # request 2 recomputed on the device and loads the 21 after them from host
    assert split(r["H5"]) == ([0, 0, 0, 30], [0, 0, 0, 9], [0, 0, 0, 21])


def test_host_pool_size_is_kvsims_formula(real):
    """The real host pool's size (tokens) for each device size, page, ratio and hicache_size."""
    r = real
    per_token = mha_host_bytes_per_token(layers=2, kv_heads=1, head_dim=4, dtype_bytes=4)
    for k, (dev, page, ratio, size) in enumerate(POOLS):
        info = r[f"pool{k}"]["info"]
        assert info["device_tokens"] == dev and info["controller"] == "HybridCacheController"
        assert info["host_tokens"] == host_pool_tokens(dev, page, ratio, size, per_token), (dev, page, ratio, size)


def test_random_workloads_under_pressure_report_a_consistent_split(real):
    """Every write policy, sequential and on the step clock: cached = device + host per
    request, as split_cached_prefix gives it; the host tier serves hits under pressure."""
    r = real
    host_hits = {}
    for policy in POLICIES:
        for mode in ("sequential", "steps"):
            cached, device, host = split(r[f"random-{policy}-{mode}"])
            served = [i for i, c in enumerate(cached) if c >= 0]
            assert len(served) > 50
            for i in served:
                assert (device[i], host[i]) == split_cached_prefix(cached[i], host[i])
            host_hits[policy, mode] = sum(host[i] for i in served)
    assert all(v > 0 for (policy, _), v in host_hits.items() if policy != "write_through_selective"), host_hits
