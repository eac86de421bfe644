"""scripts/gpu_check.sh and its Python steps, exercised on CPU (dry run: tiny shapes, interpreter).

These tests check the script's code path only; they produce no GPU numbers."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (kernels on CPU tensors)
torch = pytest.importorskip("torch", reason="gpu extra not installed (pip install 'kvsim[gpu]')")
pytest.importorskip("triton", reason="gpu extra not installed (pip install 'kvsim[gpu]')")

from kvsim.gpu import cuda_check, kernels

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"


def test_script_is_valid_bash():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], check=False).returncode == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: run scripts/gpu_check.sh")
def test_without_a_gpu_the_checks_refuse_to_run(tmp_path, capsys):
    assert cuda_check.main(["--out", str(tmp_path)]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_dry_run_checks_and_summary(tmp_path, capsys):
    """The kernel checks and the SDPA comparison run end to end on tiny CPU shapes, and the summary reads them."""
    if not kernels.interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set")
    assert cuda_check.main(["--dry-run", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "kernel_check.json").read_text())
    assert all(r["ok"] for r in result["correctness"]) and len(result["correctness"]) == 12
    # the paged kernel and SDPA (lower-right causal, GQA) compute the same attention
    assert all(r["rel_err_vs_sdpa"] < cuda_check.TOL["bfloat16"] for r in result["speed"])
    capsys.readouterr()
    assert cuda_check.main(["--summary", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "12/12 ok" in printed and "ours/SDPA" in printed
