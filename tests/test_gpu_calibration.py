"""The prefill-time model without torch: calibration fit and file, roofline FLOPs/bytes, device
peaks, block tables and the slot ledger."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from kvsim.errors import InputError
from kvsim.costs import roofline
from kvsim.gpu.block_tables import SlotLedger, pages_from_block_table
from kvsim.costs.calibration import Calibration, fit_calibration
from kvsim.gpu.configs import CONFIGS, get_config


def test_fit_recovers_known_costs():
    """Prefill times generated from known coefficients (plus 1% noise) are fitted back within a few percent."""
    rng = np.random.default_rng(0)
    n = rng.integers(1, 4000, 60)
    c = rng.integers(0, 8000, 60)
    true = Calibration("x", "m", "bf16", 2e-3, 5e-5, 3e-9)
    t = true.prefill_seconds(n, c) * (1 + 0.01 * rng.standard_normal(60))
    fit = fit_calibration(n, c, t, "x", "m", "bf16")
    assert fit.fixed_s == pytest.approx(2e-3, rel=0.1)
    assert fit.per_token_s == pytest.approx(5e-5, rel=0.05)
    assert fit.per_context_token_s == pytest.approx(3e-9, rel=0.05)
    assert fit.fit["r2"] > 0.99 and fit.fit["points"] == 60


def test_fit_never_returns_negative_costs():
    """Data that an unconstrained fit would explain with a negative term gets a zero term instead."""
    n = np.array([10, 100, 1000, 2000])
    c = np.zeros(4)
    t = 1e-3 + 1e-5 * n - 1e-10 * n * (n + 1) / 2     # curvature downwards: negative attention term
    fit = fit_calibration(n, c, t, "x", "m", "bf16")
    assert min(fit.fixed_s, fit.per_token_s, fit.per_context_token_s) >= 0
    assert fit.per_context_token_s == 0


def test_saved_seconds_is_the_closed_form():
    """Saving c cached tokens of a p-token prompt = per_token*c + per_context*c(c+1)/2, for every split."""
    cal = Calibration("x", "m", "bf16", 1e-3, 2e-5, 4e-9)
    for p, c in [(100, 0), (100, 99), (4096, 2048), (17, 16)]:
        assert cal.saved_seconds(p, c) == pytest.approx(2e-5 * c + 4e-9 * c * (c + 1) / 2, rel=1e-9, abs=1e-15)


def test_calibration_file_round_trip(tmp_path):
    cal = Calibration("NVIDIA H200", "llama-3-8b-shape", "bfloat16", 1e-3, 2e-5, 4e-9, fit={"points": 3})
    path = tmp_path / "cal.json"
    cal.save(path)
    assert Calibration.load(path) == cal
    assert json.loads(path.read_text())["schema"] == "kvsim.calibration/1"


@pytest.mark.parametrize("content,message", [
    ("{", "not a readable"),
    ('{"fixed_s": 1}', "not a kvsim calibration"),
    ('{"schema": "kvsim.calibration/1", "fixed_s": -1, "per_token_s": 0, "per_context_token_s": 0}', "fixed_s"),
    ('{"schema": "kvsim.calibration/1", "fixed_s": 0, "per_token_s": "fast", "per_context_token_s": 0}',
     "per_token_s"),
])
def test_bad_calibration_files_are_refused(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(InputError, match=message):
        Calibration.load(path)


def test_prefill_flops_by_hand():
    """Tiny model, 10 new after 6 cached: linear, attention pairs and LM head FLOPs counted exactly."""
    cfg = get_config("tiny")
    linear = 2 * 2 * (128 * 128 * 2 + 128 * 32 * 2 + 3 * 128 * 256) * 10
    attention = 4 * 2 * 8 * 16 * (10 * 6 + 10 * 11 / 2)
    lm_head = 2 * 128 * 1024
    assert roofline.prefill_flops(cfg, 10, 6) == linear + attention + lm_head


def test_reuse_saves_flops_and_bytes_monotonically():
    """More cached tokens of the same prompt: fewer FLOPs, and the 8B full prefill of 4k tokens is ~66 TFLOP."""
    cfg = CONFIGS["llama-3-8b-shape"]
    f = [roofline.prefill_flops(cfg, 4096 - c, c) for c in (0, 1024, 2048, 4095)]
    assert all(a > b for a, b in itertools.pairwise(f))
    assert 6.0e13 < f[0] < 7.0e13
    b = [roofline.prefill_bytes(cfg, 4096 - c, c, 2) for c in (0, 2048)]
    assert b[0] > b[1]


def test_device_peaks():
    assert roofline.device_peak("NVIDIA H100 80GB HBM3").name == "H100-80GB-SXM"
    assert roofline.device_peak("NVIDIA H200").name == "H200"
    assert roofline.device_peak("NVIDIA A100-SXM4-80GB").name == "A100-80GB"
    assert roofline.device_peak("NVIDIA L4").name == "L4"
    assert roofline.device_peak("cpu") is None
    assert roofline.roofline_seconds(1e12, 1e9, None, 2) is None
    h200 = roofline.DEVICES["H200"]
    assert roofline.roofline_seconds(989.4e12, 1.0, h200, 2) == pytest.approx(1.0)      # compute-bound
    assert roofline.roofline_seconds(1.0, 4.8e12, h200, 2) == pytest.approx(1.0)        # memory-bound


def test_page_tables_and_token_slot_tables():
    """APC tables are page ids; SGLang slot rows become page ids when every token sits at its offset."""
    assert pages_from_block_table(np.array([7, 3, 9]), 16, 40).tolist() == [7, 3, 9]
    slots = np.concatenate([5 * 4 + np.arange(4), 2 * 4 + np.arange(3)])
    assert pages_from_block_table(slots, 4, 7, token_slots=True).tolist() == [5, 2]
    with pytest.raises(ValueError, match="page-aligned"):
        pages_from_block_table(np.array([20, 21, 23, 24]), 4, 4, token_slots=True)
    with pytest.raises(ValueError, match="fewer than"):
        pages_from_block_table(np.array([1]), 16, 40)


def test_slot_ledger_reports_the_first_wrong_position():
    ledger = SlotLedger(num_pages=8, page_size=4)
    pages = np.array([3, 6, 1])
    tokens = np.arange(100, 112)
    ledger.record(pages, 0, tokens[:8], request=0)
    assert ledger.first_mismatch(pages, tokens, 8) is None
    assert ledger.first_mismatch(pages, tokens, 10)[0] == 8            # never written
    swapped = np.array([6, 3, 1])
    pos, why = ledger.first_mismatch(swapped, tokens, 8)
    assert pos == 0 and "holds position 4 of request #0" in why
    assert ledger.writers(pages, 8).tolist() == [0]
