"""gpu-validate end to end on CPU: the cache models' block tables drive a real paged prefill."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (kernels on CPU tensors)
torch = pytest.importorskip("torch", reason="gpu extra not installed (pip install 'kvsim[gpu]')")

from kvsim.engines.base import Admission
from kvsim.engines.registry import names as policy_names
from kvsim.gpu import cache_models
from kvsim.costs.calibration import Calibration
from kvsim.gpu.validate import ValidateOptions, run_validation
from kvsim.io.trace.columns import Trace
from kvsim.engines.options import SimOptions

BUNDLED = Path(__file__).resolve().parents[1] / "traces" / "support_chat.jsonl"


def chat_trace(sessions: int = 3, turns: int = 3, seed: int = 0) -> Trace:
    """Multi-turn chats: a shared system prompt; each turn resends the history with the logged replies."""
    rng = np.random.default_rng(seed)
    system = rng.integers(0, 50_000, 70).tolist()
    history = {s: system + rng.integers(0, 50_000, 10).tolist() for s in range(sessions)}
    prompts, outputs = [], []
    for _ in range(turns):
        for s in range(sessions):
            history[s] += rng.integers(0, 50_000, 9 + 4 * s).tolist()
            prompts.append(list(history[s]))
            reply = rng.integers(0, 50_000, 20).tolist()
            outputs.append(reply)
            history[s] += reply
    return Trace.from_prompts(prompts, outputs=outputs)


def validate(trace: Trace, policy: str = "apc", **sim) -> object:
    return run_validation(trace, ValidateOptions(policy=policy, requests=len(trace), repeats=1,
                                                 sim=SimOptions(**sim)))


def test_apc_reuse_equals_full_prefill_on_a_chat():
    """Every request matches its full prefill; cached tokens equal the simulator's; the replies' K/V is reused."""
    trace = chat_trace()
    result = validate(trace)
    assert result.ok, [c.problem for c in result.checks if c.problem]
    assert all(c.cached_tokens == c.predicted_cached for c in result.checks)
    assert sum(c.cached_tokens for c in result.checks) > 0.5 * trace.num_prompt_tokens
    # a later turn reads blocks that hold the previous turn's reply, written by its decode steps
    first_turn_len = {i: int(trace.prompt_lengths[i]) for i in range(3)}
    assert any(result.checks[i + 3].cached_tokens > first_turn_len[i] for i in range(3))
    assert all(c.decode_kv_written == 19 for c in result.checks)      # 20 outputs: 19 computed
    assert result.control is not None and result.control["detected"]
    assert result.calibration is not None and result.calibration.fit["points"] == 2 * len(trace)


@pytest.mark.parametrize("block_size", [1, 16, 32, 64])
def test_apc_with_evictions_and_block_sizes(block_size):
    """A capacity that forces evictions and page reuse still gives a full-prefill match at every block size."""
    trace = chat_trace(seed=block_size)
    unlimited = validate(trace, block_size=block_size)
    tight = validate(trace, block_size=block_size, capacity_tokens=260)
    assert tight.ok, [c.problem for c in tight.checks if c.problem]
    assert sum(c.cached_tokens for c in tight.checks) < sum(c.cached_tokens for c in unlimited.checks)
    assert all(c.cached_tokens == c.predicted_cached for c in tight.checks)


def _broken_apc(corrupt):
    """The real APC model whose admissions pass through ``corrupt(admission) -> admission``."""
    real = cache_models.build_cache_model

    def build(policy, trace, options):
        cm = real(policy, trace, options)
        admit = cm.cache.admit

        def bad_admit(req):
            adm = admit(req)
            return None if adm is None else corrupt(adm)

        cm.cache.admit = bad_admit
        return cm
    return build


def test_a_wrong_page_in_the_block_table_is_caught(monkeypatch):
    """A block table naming another request's page for a cached block fails, with request and position."""
    def swap(adm: Admission) -> Admission:
        if adm.cached_tokens < 32:
            return adm
        table = adm.block_table.copy()
        table[1] = table[-1]          # a new page of this request (not yet written) instead of a cached one
        return adm._replace(block_table=table)

    monkeypatch.setattr(cache_models, "build_cache_model", _broken_apc(swap))
    result = validate(chat_trace())
    bad = [c for c in result.checks if not c.ok]
    assert bad and not result.ok
    assert all(c.bad_position == 16 for c in bad)          # the first position of block 1
    assert all("cached position 16" in c.problem for c in bad)


def test_overclaimed_cached_tokens_are_caught(monkeypatch):
    """Claiming one block more than the pool holds reads unwritten (NaN-poisoned) slots: detected."""
    def overclaim(adm: Admission) -> Admission:
        if adm.cached_tokens and adm.cached_tokens + 16 < 16 * len(adm.block_table) - 16:
            return adm._replace(cached_tokens=adm.cached_tokens + 16)
        return adm

    monkeypatch.setattr(cache_models, "build_cache_model", _broken_apc(overclaim))
    result = validate(chat_trace())
    over = [c for c in result.checks if c.cached_tokens != c.predicted_cached]
    assert over and not result.ok
    assert all(not c.ok and c.logits_rel_err > result.tolerance for c in over)
    assert result.summary()["cached_tokens_differ_from_simulator"] == len(over)


@pytest.mark.skipif("radix" not in policy_names(), reason="the radix design is not in this build")
def test_radix_admission_table_holds_the_cached_prefix_slots():
    """A radix admission's block table starts with the slots of the matched prefix (SGLang's
    prefix_indices), never the padding slot 0 — the bug gpu-validate first found."""
    from kvsim.engines.base import Request
    from kvsim.engines.sglang.sequential import RadixReference
    from kvsim.engines.sglang.settings import RadixSettings

    model = RadixReference(RadixSettings(page_size=1))
    prompt = np.arange(10)
    for rid in ("a", "b"):
        adm = model.admit(Request(rid, prompt, np.array([99])))
        model.finish(Request(rid, prompt, np.array([99])))
    assert adm.cached_tokens == 9
    assert (adm.block_table[:adm.cached_tokens] > 0).all()


@pytest.mark.skipif("radix" not in policy_names(), reason="the radix design is not in this build")
@pytest.mark.parametrize("page_size", [1, 16])
def test_radix_reuse_equals_full_prefill(page_size):
    """SGLang radix slot tables (token level at page 1, pages above) drive the pool correctly,
    also when a small pool evicts leaves and hands their slots out again."""
    trace = chat_trace(seed=3)
    unlimited = validate(trace, "radix", page_size=page_size)
    tight = validate(trace, "radix", page_size=page_size, capacity_tokens=260)
    for result in (unlimited, tight):
        assert result.ok, [c.problem for c in result.checks if c.problem]
        assert all(c.cached_tokens == c.predicted_cached for c in result.checks)
    assert 0 < sum(c.cached_tokens for c in tight.checks) < sum(c.cached_tokens for c in unlimited.checks)


def test_triton_kernels_drive_the_validation():
    """The same flow through the Triton kernels (interpreter on CPU) passes on a few requests."""
    pytest.importorskip("triton", reason="gpu extra not installed (pip install 'kvsim[gpu]')")
    from kvsim.gpu import kernels

    if not kernels.interpreting():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 was set")
    trace = chat_trace(sessions=1, turns=3, seed=5)
    result = run_validation(trace, ValidateOptions(attention="triton", requests=3, repeats=1))
    assert result.config["attention"] == "triton"
    assert result.ok, [c.problem for c in result.checks if c.problem]
    assert result.checks[2].cached_tokens > 0


@pytest.mark.skipif(not BUNDLED.exists(), reason="bundled trace traces/support_chat.jsonl is missing")
def test_cli_on_the_bundled_trace(tmp_path, capsys):
    """`kvsim gpu-validate --device cpu --model tiny` passes, writes results, report and a calibration simulate reads."""
    from kvsim.cli import run

    out = tmp_path / "gv"
    code = run(["gpu-validate", str(BUNDLED), "--device", "cpu", "--model", "tiny", "--requests", "12",
                "--repeats", "1", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "PASS" in printed and "12/12 requests match" in printed
    for name in ("gpu_validate.json", "calibration.json", "gpu_validate.html", "gpu_saving.png",
                 "gpu_errors.png", "gpu_kernel.png"):
        assert (out / name).stat().st_size > 0
    cal = Calibration.load(out / "calibration.json")
    assert cal.model == "tiny" and cal.device == "cpu" and cal.fit["points"] == 24
    assert run(["simulate", str(BUNDLED), "--calibration", str(out / "calibration.json"), "--limit", "12"]) == 0
    assert "prefill gpu-s saved (est.)" in capsys.readouterr().out.lower()


def test_cli_refuses_to_overwrite_the_input(tmp_path, capsys):
    from kvsim.cli import run

    log = tmp_path / "log.jsonl"
    log.write_text('{"prompt_token_ids": [1, 2, 3], "output_length": 1}\n')
    code = run(["gpu-validate", str(log), "--device", "cpu", "--out", str(tmp_path / "o"),
                "--calibration-out", str(log)])
    assert code == 2
    assert "input file" in capsys.readouterr().err
    assert log.read_text().startswith('{"prompt_token_ids"')


def test_cli_without_torch_says_how_to_install(monkeypatch, capsys):
    """Without the gpu extra: exit 2 and one line naming pip install 'kvsim[gpu]'."""
    import importlib.util

    from kvsim.cli import gpu_validate, run

    real = importlib.util.find_spec
    monkeypatch.setattr(gpu_validate.importlib.util, "find_spec",
                        lambda name, *a: None if name == "torch" else real(name, *a))
    code = run(["gpu-validate", str(BUNDLED), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2
    assert "pip install 'kvsim[gpu]'" in err and len(err.strip().splitlines()) == 1
