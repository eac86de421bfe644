"""gpu-validate: a real prefill driven by the cache model's block tables.

For each request of a trace slice, in order (the sequential replay):

1. the stepwise cache model admits it and returns ``cached_tokens`` and its block table;
2. the model computes only the prompt tokens after ``cached_tokens``, reading the cached
   prefix's K/V from the pages of the pool named by the block table (pages an earlier
   request wrote; the pool starts NaN-poisoned) and writing the new tokens' K/V into the
   new pages;
3. a full prefill of the same prompt into a separate scratch pool gives the reference:
   last-position logits and the K/V of every position must agree within the dtype's
   tolerance;
4. both prefills are timed and compared with the simulator's predicted cached tokens and
   its prefill-time model (FLOPs/bytes roofline);
5. the decode steps run through the cache model; the output tokens' K/V is written where
   the engine keeps it (later turns of a chat reuse it), then the request is finished.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import numpy as np

from kvsim.engines.base import Request
from kvsim.errors import ConfigError, KvsimError
from kvsim.costs import roofline
from kvsim.costs.calibration import Calibration, fit_calibration
from kvsim.gpu.configs import LlamaConfig, get_config
from kvsim.io.trace.columns import Trace
from kvsim.engines.options import SimOptions

# Relative L2 error allowed between reuse and full prefill (logits and K/V), per dtype.
# fp32: summation-order noise only; 16-bit: one rounding of every activation, compounded
# over the layers. A wrong page or position gives errors of order 1 (see ``control``).
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 3e-2}


@dataclass
class ValidateOptions:
    """How to run gpu-validate."""

    policy: str = "apc"
    model: str = "tiny"
    device: str = "auto"            # auto | cuda | cpu
    dtype: str = "auto"             # auto (bf16 on cuda, fp32 on cpu) | float32 | float16 | bfloat16
    attention: str = "auto"         # auto (triton on cuda, torch on cpu) | triton | torch
    requests: int = 16
    repeats: int | None = None      # timed repeats per prefill, median kept (default 3)
    tolerance: float | None = None  # relative L2 error allowed (default: TOLERANCE[dtype])
    seed: int = 0
    sim: SimOptions = field(default_factory=SimOptions)


@dataclass
class RequestCheck:
    """The outcome for one request of the slice."""

    index: int
    request_id: str
    prompt_tokens: int
    predicted_cached: int            # the simulator's replay
    cached_tokens: int               # the stepwise model's admission (what was skipped)
    rejected: bool = False
    ok: bool = True
    problem: str | None = None
    bad_position: int | None = None
    logits_rel_err: float | None = None
    kv_cached_rel_err: float | None = None   # prefix K/V read from the pool vs recomputed
    kv_new_rel_err: float | None = None      # K/V written for the new tokens vs full prefill
    prefix_writers: list[int] = field(default_factory=list)   # requests that wrote the reused pages
    t_reuse_s: float | None = None
    t_full_s: float | None = None
    flops_reuse: float | None = None
    flops_full: float | None = None
    bytes_reuse: float | None = None
    bytes_full: float | None = None
    roofline_reuse_s: float | None = None
    roofline_full_s: float | None = None
    kernel_s: float | None = None            # attention kernel alone, one layer, reuse shape
    kernel_flops: float | None = None
    kernel_bytes: float | None = None
    decode_kv_written: int = 0


@dataclass
class ValidationResult:
    """Everything gpu-validate measured (no prompt text)."""

    config: dict[str, Any]
    checks: list[RequestCheck]
    tolerance: float
    control: dict[str, Any] | None
    calibration: Calibration | None
    peak: roofline.DevicePeak | None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks) and (self.control is None or self.control["detected"])

    def summary(self) -> dict[str, Any]:
        """Totals: correctness, predicted vs measured saving, kernel rates."""
        done = [c for c in self.checks if not c.rejected and c.t_full_s is not None]
        s: dict[str, Any] = {
            "requests": len(self.checks), "validated": len(done),
            "rejected": sum(c.rejected for c in self.checks),
            "mismatches": sum(not c.ok for c in self.checks),
            "cached_tokens_differ_from_simulator": sum(c.cached_tokens != c.predicted_cached
                                                       for c in self.checks if not c.rejected),
            "prompt_tokens": sum(c.prompt_tokens for c in done),
            "cached_tokens": sum(c.cached_tokens for c in done),
            "max_logits_rel_err": max((c.logits_rel_err for c in done if c.logits_rel_err is not None), default=None),
            "max_kv_rel_err": max((max(c.kv_cached_rel_err or 0.0, c.kv_new_rel_err or 0.0) for c in done),
                                  default=None),
            "tolerance": self.tolerance,
        }
        if not done:
            return s
        t_full = sum(c.t_full_s for c in done)
        t_reuse = sum(c.t_reuse_s for c in done)
        f_full = sum(c.flops_full for c in done)
        f_reuse = sum(c.flops_reuse for c in done)
        s.update({
            "measured_full_s": t_full, "measured_reuse_s": t_reuse,
            "measured_saving_s": t_full - t_reuse,
            "measured_saving_share": (t_full - t_reuse) / t_full if t_full > 0 else None,
            "flops_saving_share": (f_full - f_reuse) / f_full,
        })
        if self.peak is not None:
            r_full = sum(c.roofline_full_s for c in done)
            r_reuse = sum(c.roofline_reuse_s for c in done)
            s.update({"roofline_full_s": r_full, "roofline_reuse_s": r_reuse,
                      "roofline_saving_s": r_full - r_reuse,
                      "roofline_saving_share": (r_full - r_reuse) / r_full})
            s["predicted_saving_model"] = f"roofline ({self.peak.name})"
            s["predicted_saving_share"] = s["roofline_saving_share"]
        else:
            s["predicted_saving_model"] = "FLOPs (no device peaks for this device)"
            s["predicted_saving_share"] = s["flops_saving_share"]
        meas = s["measured_saving_share"]
        if meas:
            s["predicted_saving_rel_err"] = (s["predicted_saving_share"] - meas) / meas
        if self.calibration is not None:
            cal = sum(self.calibration.saved_seconds(c.prompt_tokens, c.cached_tokens) for c in done)
            s["calibrated_saving_s"] = cal
            if t_full - t_reuse > 0:
                s["calibrated_saving_rel_err"] = (cal - (t_full - t_reuse)) / (t_full - t_reuse)
        timed = [c for c in done if c.kernel_s]
        if timed:
            kt = sum(c.kernel_s for c in timed)
            s["kernel_flops_per_s"] = sum(c.kernel_flops for c in timed) / kt
            s["kernel_bytes_per_s"] = sum(c.kernel_bytes for c in timed) / kt
            if self.peak is not None:
                dtype_bytes = 4 if self.config["dtype"] == "float32" else 2
                s["kernel_flops_share_of_peak"] = s["kernel_flops_per_s"] / self.peak.flops(dtype_bytes)
                s["kernel_bandwidth_share_of_peak"] = s["kernel_bytes_per_s"] / self.peak.mem_bandwidth
        return s

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config, "ok": self.ok, "summary": self.summary(), "control": self.control,
            "device_peak": None if self.peak is None else asdict(self.peak),
            "calibration": None if self.calibration is None else self.calibration.to_json(),
            "requests": [asdict(c) for c in self.checks],
        }


# -- helpers -----------------------------------------------------------------------------

def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in fp32 (inf when a has NaN: an unwritten, poisoned slot was read)."""
    a, b = a.float(), b.float()
    if not bool(a.isfinite().all()):
        return math.inf
    denom = float(b.norm())
    return float((a - b).norm()) / denom if denom > 0 else float((a - b).norm())


def _resolve(opts: ValidateOptions):
    import torch

    device = opts.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cuda", "cpu"):
        raise ConfigError(f"--device must be auto, cuda or cpu, got {opts.device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise KvsimError("--device cuda: no CUDA device is visible to torch "
                         f"(torch {torch.__version__}); use --device cpu")
    names = {"auto": None, "float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
             "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if opts.dtype not in names:
        raise ConfigError(f"--dtype must be auto, float32, float16 or bfloat16, got {opts.dtype!r}")
    dtype = names[opts.dtype] or (torch.bfloat16 if device == "cuda" else torch.float32)
    attention = opts.attention
    if attention == "auto":
        attention = "triton" if device == "cuda" else "torch"
    if attention not in ("triton", "torch"):
        raise ConfigError(f"--attention must be auto, triton or torch, got {opts.attention!r}")
    repeats = 3 if opts.repeats is None else opts.repeats
    if repeats < 1:
        raise ConfigError("--repeats must be at least 1")
    return torch.device(device), dtype, attention, repeats


class _Timer:
    """Median wall time of a callable on the device (CUDA events on a GPU)."""

    def __init__(self, device) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def __call__(self, fn: Callable[[], Any], repeats: int) -> float:
        from kvsim.gpu.timing import median_seconds

        return median_seconds(fn, self.device, repeats)


# -- the flow ----------------------------------------------------------------------------

def run_validation(trace: Trace, opts: ValidateOptions,
                   progress: Callable[[int, int], None] | None = None) -> ValidationResult:
    """Validate the cache model's reuse on a real prefill for the first ``opts.requests`` requests."""
    import torch

    if opts.requests < 1:
        raise ConfigError("--requests must be at least 1")
    if opts.tolerance is not None and not 0 < opts.tolerance < 1:
        raise ConfigError(f"--tolerance must be between 0 and 1, got {opts.tolerance}")
    trace.require_tokens("gpu-validate")
    cfg = get_config(opts.model)
    device, dtype, attention, repeats = _resolve(opts)
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)   # CPU timings: no thread oversubscription on shared machines
    try:
        return _run(trace, opts, cfg, device, dtype, attention, repeats, progress)
    finally:
        torch.set_num_threads(threads)


def _run(trace: Trace, opts: ValidateOptions, cfg: LlamaConfig, device, dtype, attention: str, repeats: int,
         progress) -> ValidationResult:
    import torch

    from kvsim.drive.sequential import replay
    from kvsim.gpu.block_tables import SlotLedger
    from kvsim.gpu.cache_models import build_cache_model
    from kvsim.gpu.llama import LlamaModel
    from kvsim.drive.requests import iter_requests

    dtype_name = str(dtype).removeprefix("torch.")
    dtype_bytes = torch.tensor([], dtype=dtype).element_size()
    sl = trace.head(min(opts.requests, len(trace)))
    if len(sl) == 0:
        raise KvsimError("the trace holds no requests")

    predicted = replay(opts.policy, sl, opts.sim)          # the simulator's prediction
    cm = build_cache_model(opts.policy, sl, opts.sim)            # the stepwise model, driven here
    model = LlamaModel(cfg, device, dtype, seed=opts.seed, attention=attention)
    pool = model.new_cache(cm.num_pages, cm.page_size)
    ledger = SlotLedger(cm.num_pages, cm.page_size)
    max_prompt = int(sl.prompt_lengths.max())
    scratch_pages = -(-max_prompt // cm.page_size)
    scratch = model.new_cache(scratch_pages, cm.page_size)
    scratch_table = torch.arange(scratch_pages, dtype=torch.int32, device=device)
    timer = _Timer(device)
    peak = roofline.device_peak(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    tol = TOLERANCE[dtype_name] if opts.tolerance is None else float(opts.tolerance)
    control: dict[str, Any] | None = None

    # warm up (Triton compilation, allocator) on a throwaway prompt
    warm = np.arange(min(max_prompt, 64))
    model.prefill(warm, 0, scratch, scratch_table)
    timer.sync()

    checks: list[RequestCheck] = []
    for i, req in enumerate(iter_requests(sl)):
        prompt = np.asarray(req.prompt, np.int64)
        L = len(prompt)
        chk = RequestCheck(i, req.request_id, L, int(predicted.cached_tokens[i]), 0)
        checks.append(chk)
        fits = getattr(cm.cache, "fits_ever", None)
        adm = cm.cache.admit(req) if fits is None or fits(req) else None
        if adm is None:
            chk.rejected = True
            if not predicted.rejected[i]:
                chk.ok, chk.problem = False, "the cache model refused a request the simulator admitted"
            _progress(progress, i, len(sl))
            continue
        c = int(adm.cached_tokens)
        chk.cached_tokens = c
        try:
            if not 0 <= c < L:
                raise _TableError(f"{c} cached tokens of a {L}-token prompt")
            pages = _pages(adm.block_table, cm, L)
        except _TableError as e:   # nothing can be computed for this request: record, go on
            chk.ok, chk.problem = False, f"unusable admission from the cache model: {e}"
            _decode(cm, req, model, pool, ledger, i, device, L, chk)
            cm.cache.finish(req)
            _progress(progress, i, len(sl))
            continue
        table = torch.as_tensor(pages, dtype=torch.int32, device=device)

        # what the pool must hold before reuse: the same tokens at the same positions
        bad = ledger.first_mismatch(pages, prompt, c)
        if bad is not None:
            chk.ok, chk.bad_position, chk.problem = False, bad[0], f"cached position {bad[0]}: {bad[1]}"
        chk.prefix_writers = [int(w) for w in ledger.writers(pages, c)]

        logits = model.prefill(prompt[c:], c, pool, table)               # the reuse prefill
        ledger.record(pages, c, prompt[c:], i)
        full_logits = model.prefill(prompt, 0, scratch, scratch_table)   # the reference
        if control is None and c >= max(2, cm.page_size):
            control = _control(model, prompt, c, cm.page_size, full_logits, scratch, scratch_table, tol)
            control["request"] = i
            model.prefill(prompt, 0, scratch, scratch_table)              # restore the reference K/V
        _compare(chk, logits, full_logits, pool, table, scratch, scratch_table, c, L, tol)

        chk.t_reuse_s = timer(partial(model.prefill, prompt[c:], c, pool, table), repeats)
        chk.t_full_s = timer(partial(model.prefill, prompt, 0, scratch, scratch_table), repeats)
        _predict(chk, cfg, L, c, dtype_bytes, peak)
        _time_kernel(chk, model, pool, table, c, L, timer, repeats, cfg, dtype_bytes)

        chk.decode_kv_written = _decode(cm, req, model, pool, ledger, i, device, L, chk)
        cm.cache.finish(req)
        _progress(progress, i, len(sl))

    done = [c for c in checks if c.t_full_s is not None]
    calibration = None
    if done:
        n = [c.prompt_tokens - c.cached_tokens for c in done] + [c.prompt_tokens for c in done]
        ctx = [c.cached_tokens for c in done] + [0] * len(done)
        secs = [c.t_reuse_s for c in done] + [c.t_full_s for c in done]
        device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        calibration = fit_calibration(n, ctx, secs, device_name, cfg.name, dtype_name,
                                      source={"trace": list(trace.meta.sources), "policy": opts.policy,
                                              "requests": len(done), "attention": attention})
    config = {
        "policy": opts.policy, "model": cfg.name, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": dtype_name, "attention": attention, "repeats": repeats, "seed": opts.seed,
        "page_size": cm.page_size, "pool_pages": cm.num_pages, "pool_bytes": pool.nbytes,
        "requests": len(sl), "trace_sources": list(trace.meta.sources),
        "sim_options": opts.sim.as_dict(), "torch": torch.__version__,
    }
    return ValidationResult(config, checks, tol, control, calibration, peak)


def _progress(progress, i: int, n: int) -> None:
    if progress is not None:
        progress(i + 1, n)


class _TableError(Exception):
    """A block table (or cached count) from the cache model that cannot address the pool."""


def _pages(block_table, cm, num_tokens: int) -> np.ndarray:
    from kvsim.gpu.block_tables import pages_from_block_table

    try:
        pages = pages_from_block_table(block_table, cm.page_size, num_tokens, cm.token_slots)
    except ValueError as e:
        raise _TableError(str(e)) from None
    return _in_pool(pages, cm)


def _in_pool(pages: np.ndarray, cm) -> np.ndarray:
    if len(pages) and (pages.min() < 0 or pages.max() >= cm.num_pages):
        raise _TableError(f"page {int(pages.max())} is outside the pool of {cm.num_pages} pages")
    return pages


def _compare(chk: RequestCheck, logits, full_logits, pool, table, scratch, scratch_table,
             c: int, L: int, tol: float) -> None:
    """Logits and K/V of the reuse prefill against the full prefill of the same prompt."""
    chk.logits_rel_err = rel_err(logits, full_logits)
    k, v = pool.read(table, 0, L)
    kf, vf = scratch.read(scratch_table, 0, L)
    import torch

    if c:
        chk.kv_cached_rel_err = max(rel_err(k[:, :c], kf[:, :c]), rel_err(v[:, :c], vf[:, :c]))
    chk.kv_new_rel_err = max(rel_err(k[:, c:], kf[:, c:]), rel_err(v[:, c:], vf[:, c:]))
    worst = max(chk.logits_rel_err, chk.kv_cached_rel_err or 0.0, chk.kv_new_rel_err)
    if worst > tol and chk.ok:
        chk.ok = False
        # first position whose K/V (any layer) is off by more than the tolerance
        diff = ((k.float() - kf.float()).norm(dim=(0, 2, 3)) /
                kf.float().norm(dim=(0, 2, 3)).clamp_min(1e-30))
        diff = torch.nan_to_num(diff, nan=math.inf)
        over = torch.nonzero(diff > tol)
        chk.bad_position = int(over[0]) if len(over) else L - 1
        where = "cached prefix" if chk.bad_position < c else "new tokens"
        chk.problem = (f"reuse differs from full prefill: logits rel err {chk.logits_rel_err:.3g}, "
                       f"first bad K/V at position {chk.bad_position} ({where}), tolerance {tol:g}")


def _predict(chk: RequestCheck, cfg: LlamaConfig, L: int, c: int, dtype_bytes: int, peak) -> None:
    n = L - c
    chk.flops_full = float(roofline.prefill_flops(cfg, L, 0))
    chk.flops_reuse = float(roofline.prefill_flops(cfg, n, c))
    chk.bytes_full = float(roofline.prefill_bytes(cfg, L, 0, dtype_bytes))
    chk.bytes_reuse = float(roofline.prefill_bytes(cfg, n, c, dtype_bytes))
    if peak is not None:
        chk.roofline_full_s = float(roofline.roofline_seconds(chk.flops_full, chk.bytes_full, peak, dtype_bytes))
        chk.roofline_reuse_s = float(roofline.roofline_seconds(chk.flops_reuse, chk.bytes_reuse, peak, dtype_bytes))


def _time_kernel(chk: RequestCheck, model, pool, table, c: int, L: int, timer, repeats: int,
                 cfg: LlamaConfig, dtype_bytes: int) -> None:
    """The attention kernel alone on this request's reuse shape (layer 0, random q/k/v)."""
    import torch

    n = L - c
    gen = torch.Generator(device=model.device).manual_seed(chk.index)
    q = torch.randn(n, cfg.num_heads, cfg.head_dim, generator=gen, device=model.device).to(model.dtype)
    kv = torch.randn(2, n, cfg.num_kv_heads, cfg.head_dim, generator=gen, device=model.device).to(model.dtype)
    k_cache, v_cache = pool.layer(0)
    out = torch.empty_like(q)
    if model.attention == "triton":
        from kvsim.gpu.kernels import prefill_attention

        def run():
            prefill_attention(q, kv[0], kv[1], k_cache, v_cache, table, c, out=out)
    else:
        from kvsim.gpu.reference import prefill_attention_ref

        def run():
            prefill_attention_ref(q, kv[0], kv[1], k_cache, v_cache, table, c)
    run()
    chk.kernel_s = timer(run, repeats)
    chk.kernel_flops = float(roofline.attention_flops(cfg, n, c))
    chk.kernel_bytes = float(roofline.attention_bytes(cfg, n, c, dtype_bytes))


def _decode(cm, req: Request, model, pool, ledger, i: int, device, L: int, chk: RequestCheck) -> int:
    """Run the decode steps through the cache model and write the output tokens' K/V.

    After ``d`` decode steps the engine has computed outputs ``0..d-1`` (the last sampled
    token never is); their K/V lands in the request's pages, where a later turn may reuse
    it. Synthesized output ids (negative: unknown outputs) match nothing, so K/V is written
    up to the first of them.
    """
    import torch

    d = cm.num_decodes(req)
    for _ in range(d):
        cm.cache.decode(req)
    computed = np.asarray(req.output[:d], np.int64)
    known = int(np.argmax(computed < 0)) if (computed < 0).any() else len(computed)
    if known == 0:
        return 0
    try:
        pages = cm.running_pages(req, L + known)
        if pages is None:
            return 0
        _in_pool(pages, cm)
    except (ValueError, _TableError) as e:
        chk.ok = False
        chk.problem = "; ".join(filter(None, [chk.problem, f"unusable running block table after decode: {e}"]))
        return 0
    t = torch.as_tensor(pages, dtype=torch.int32, device=device)
    model.prefill(computed[:known], L, pool, t)
    ledger.record(pages, L, computed[:known], i)
    return known


def _control(model, prompt: np.ndarray, c: int, page_size: int, full_logits, scratch, scratch_table,
             tol: float) -> dict[str, Any]:
    """Negative controls: the two bugs a reuse path can have must miss the full prefill by more
    than the tolerance (the check must be able to fail), or the comparison proves nothing.

    - stale page: the first cached page holds K/V computed for other tokens (a page reused
      without its hash being dropped, or a hash collision);
    - RoPE offset: the new tokens are rotated as if they started at position 0.

    Both run in the scratch pool; the pool the cache model addresses is not touched.
    """
    other = prompt.copy()
    other[:page_size] = prompt[:page_size] + 1
    model.prefill(other[:c], 0, scratch, scratch_table)
    stale = rel_err(model.prefill(prompt[c:], c, scratch, scratch_table), full_logits)
    model.prefill(prompt[:c], 0, scratch, scratch_table)
    rope = rel_err(model.prefill(prompt[c:], c, scratch, scratch_table, rope_offset=0), full_logits)
    return {"stale_page_rel_err": stale, "rope_offset_rel_err": rope, "tolerance": tol,
            "detected": bool(min(stale, rope) > tol)}   # the check would have failed both bugs
