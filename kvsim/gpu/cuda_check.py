"""GPU-side checks run by ``scripts/gpu_check.sh``: the Triton kernels against the torch reference
on CUDA, and their speed against torch's scaled-dot-product attention on the same shapes.

``python -m kvsim.gpu.cuda_check --out DIR`` writes ``DIR/kernel_check.json``;
``python -m kvsim.gpu.cuda_check --summary DIR`` prints the short final table from that file
and the gpu-validate results under ``DIR``. Nothing here runs without a CUDA device.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

TOL = {"float16": 2e-3, "bfloat16": 1.6e-2}
# (new tokens, cached tokens) for a Llama-3-8B attention layer: 32 query heads, 8 KV heads, D=128.
SPEED_SHAPES = [(4096, 0), (1024, 3072), (256, 7936), (8192, 0), (512, 15872)]


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def correctness(device, heads: int = 32, d: int = 128, n: int = 200, pages=(1, 16, 32, 64),
                groups=(1, 4, 8), dtypes=("float16", "bfloat16")) -> list[dict[str, Any]]:
    """Kernel vs reference (and dense causal attention): block sizes, GQA, prefixes, dtypes,
    shuffled pages, NaN-poisoned pool and output."""
    import torch

    from kvsim.gpu import kernels
    from kvsim.gpu.reference import (
        dense_causal_attention,
        gather_kv,
        prefill_attention_ref,
    )

    rows = []
    case = 0
    for dtype in (getattr(torch, name) for name in dtypes):
        for page in pages:
            for group in groups:
                for cached in (0, 3 * page + (5 if page > 1 else 0), 8 * page if page > 1 else 300):
                    case += 1
                    g = torch.Generator(device=device).manual_seed(case)
                    kvh = heads // group
                    total = cached + n
                    used = -(-total // page)
                    num_pages = used + 7
                    k_cache = torch.full((num_pages, page, kvh, d), float("nan"), dtype=dtype, device=device)
                    v_cache = k_cache.clone()
                    table = torch.randperm(num_pages, generator=g, device=device)[:used].to(torch.int32)
                    q, k, v = (torch.randn(total, h, d, generator=g, device=device).to(dtype)
                               for h in (heads, kvh, kvh))
                    kernels.write_kv(k[:cached], v[:cached], k_cache, v_cache, table, 0)
                    kw, vw = gather_kv(k_cache, v_cache, table, 0, cached)
                    out = torch.full((n, heads, d), float("nan"), dtype=dtype, device=device)
                    kernels.prefill_attention(q[cached:], k[cached:], v[cached:], k_cache, v_cache, table,
                                              cached, out=out)
                    _sync(device)
                    ref = prefill_attention_ref(q[cached:], k[cached:], v[cached:], k_cache, v_cache, table, cached)
                    dense = dense_causal_attention(q, k, v)[cached:]
                    name = str(dtype).removeprefix("torch.")
                    err = max(_rel(out, ref), _rel(out, dense)) if torch.isfinite(out.float()).all() else math.inf
                    rows.append({"dtype": name, "page": page, "gqa": group, "cached": cached, "new": n,
                                 "rel_err": err, "tolerance": TOL[name],
                                 "write_exact": bool(torch.equal(kw, k[:cached]) and torch.equal(vw, v[:cached])),
                                 "ok": bool(err < TOL[name] and torch.equal(kw, k[:cached]))})
    return rows


def _time(fn, device, warmup: int = 3, repeats: int = 20) -> float:
    """Median seconds of ``fn`` (CUDA events on a GPU)."""
    from kvsim.gpu.timing import median_seconds

    return median_seconds(fn, device, repeats, warmup)


def speed(device, page: int = 16, shapes=tuple(SPEED_SHAPES), model: str = "llama-3-8b-shape",
          repeats: int = 20) -> list[dict[str, Any]]:
    """The paged kernel vs torch SDPA (contiguous K/V, lower-right causal) on a model's layer shapes."""
    import torch
    import torch.nn.functional as F

    from kvsim.gpu import kernels

    from kvsim.costs import roofline
    from kvsim.gpu.configs import CONFIGS
    from kvsim.gpu.reference import write_kv_ref

    cfg = CONFIGS[model]
    peak = roofline.device_peak(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    rows = []
    for n, c in shapes:
        g = torch.Generator(device=device).manual_seed(n + c)
        total = n + c
        used = -(-total // page)
        k_cache = torch.zeros((used + 8, page, cfg.num_kv_heads, cfg.head_dim), dtype=torch.bfloat16, device=device)
        v_cache = torch.zeros_like(k_cache)
        table = torch.randperm(used + 8, generator=g, device=device)[:used].to(torch.int32)
        q = torch.randn(n, cfg.num_heads, cfg.head_dim, generator=g, device=device).to(torch.bfloat16)
        k = torch.randn(total, cfg.num_kv_heads, cfg.head_dim, generator=g, device=device).to(torch.bfloat16)
        v = torch.randn(total, cfg.num_kv_heads, cfg.head_dim, generator=g, device=device).to(torch.bfloat16)
        write_kv_ref(k[:c], v[:c], k_cache, v_cache, table, 0)
        out = torch.empty_like(q)
        ours = partial(kernels.prefill_attention, q, k[c:], v[c:], k_cache, v_cache, table, c, out=out)
        t_ours = _time(ours, device, repeats=repeats)

        qs, ks, vs = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
        mask_note = "is_causal" if c == 0 else "causal_lower_right"
        if c == 0:
            kwargs: dict[str, Any] = {"is_causal": True}
        else:
            from torch.nn.attention.bias import causal_lower_right

            kwargs = {"attn_mask": causal_lower_right(n, total)}
        try:
            sdpa = partial(F.scaled_dot_product_attention, qs, ks, vs, enable_gqa=True, **kwargs)
            ref = sdpa()
            gqa_note = "enable_gqa"
        except (RuntimeError, TypeError, NotImplementedError):
            group = cfg.num_heads // cfg.num_kv_heads
            ke, ve = ks.repeat_interleave(group, dim=1), vs.repeat_interleave(group, dim=1)
            sdpa = partial(F.scaled_dot_product_attention, qs, ke, ve, **kwargs)
            ref = sdpa()
            gqa_note = "expanded heads"
        t_sdpa = _time(sdpa, device, repeats=repeats)
        err = _rel(out, ref[0].transpose(0, 1))
        flops = float(roofline.attention_flops(cfg, n, c))
        nbytes = float(roofline.attention_bytes(cfg, n, c, 2))
        rows.append({
            "new": n, "cached": c, "page": page, "ours_s": t_ours, "sdpa_s": t_sdpa, "ours_over_sdpa": t_ours / t_sdpa,
            "rel_err_vs_sdpa": err, "ours_tflops": flops / t_ours / 1e12, "sdpa_tflops": flops / t_sdpa / 1e12,
            "ours_gbps": nbytes / t_ours / 1e9,
            "ours_share_of_peak_flops": None if peak is None else flops / t_ours / peak.flops_16bit,
            "sdpa_note": f"{mask_note}, {gqa_note}",
        })
    return rows


def run_checks(out: Path, dry_run: bool = False) -> int:
    """All kernel checks on CUDA; ``dry_run``: the same code on tiny shapes on CPU (interpreter)."""
    import torch

    if dry_run:
        device = torch.device("cpu")
        rows = correctness(device, heads=8, d=16, n=40, pages=(1, 16), groups=(1, 4), dtypes=("bfloat16",))
        t0 = t1 = time.perf_counter()
        bench = speed(device, shapes=((32, 0), (16, 48)), model="tiny", repeats=2)
        t2 = time.perf_counter()
    else:
        if not torch.cuda.is_available():
            print("no CUDA device visible to torch: the GPU checks cannot run", file=sys.stderr)
            return 2
        device = torch.device("cuda")
        t0 = time.perf_counter()
        rows = correctness(device)
        t1 = time.perf_counter()
        bench = speed(device)
        t2 = time.perf_counter()
    import triton

    from kvsim.costs import roofline

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (dry run)"
    peak = roofline.device_peak(name)
    result = {"device": name, "torch": torch.__version__, "triton": triton.__version__,
              "peak": None if peak is None else peak.__dict__, "correctness": rows, "speed": bench,
              "seconds": {"correctness": t1 - t0, "speed": t2 - t1}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel_check.json").write_text(json.dumps(result, indent=2))
    bad = [r for r in rows if not r["ok"]]
    print(f"kernel vs reference on {result['device']}: {len(rows) - len(bad)}/{len(rows)} cases ok "
          f"({t1 - t0:.0f} s); speed vs SDPA on {len(bench)} shapes ({t2 - t1:.0f} s)")
    for r in bad:
        print(f"  FAILED {r}")
    return 1 if bad else 0


def summary(out: Path) -> int:
    """The short table printed last: kernel checks, kernel speed, gpu-validate results."""
    status = 0
    kc = out / "kernel_check.json"
    print("=" * 78)
    if kc.exists():
        k = json.loads(kc.read_text())
        rows = k["correctness"]
        ok = sum(r["ok"] for r in rows)
        worst = max(r["rel_err"] for r in rows)
        print(f"GPU check on {k['device']} (torch {k['torch']}, triton {k['triton']})")
        print(f"kernel vs torch reference/dense (CUDA): {ok}/{len(rows)} ok, max rel err {worst:.2e}")
        status |= ok != len(rows)
        print(f"{'new':>6} {'cached':>7} {'ours ms':>8} {'SDPA ms':>8} {'ours/SDPA':>9} {'TFLOP/s':>8} {'%peak':>6}")
        for r in k["speed"]:
            share = "-" if r["ours_share_of_peak_flops"] is None else f"{100 * r['ours_share_of_peak_flops']:.0f}%"
            print(f"{r['new']:>6} {r['cached']:>7} {r['ours_s'] * 1e3:>8.3f} {r['sdpa_s'] * 1e3:>8.3f} "
                  f"{r['ours_over_sdpa']:>9.2f} {r['ours_tflops']:>8.1f} {share:>6}")
    else:
        print("kernel checks: no results (did they run?)")
        status = 1
    for path in sorted(out.glob("validate*/gpu_validate.json")):
        v = json.loads(path.read_text())
        s, cfg = v["summary"], v["config"]
        line = (f"gpu-validate {cfg['policy']} {cfg['model']} {cfg['dtype']} ({s['validated']} req): "
                f"{'PASS' if v['ok'] else 'FAIL'}, {s['validated'] - s['mismatches']}/{s['validated']} match, "
                f"max logits err {_g(s.get('max_logits_rel_err'))}")
        print(line)
        if "measured_saving_share" in s:
            print(f"  saving measured {_p(s['measured_saving_share'])}, predicted {_p(s.get('predicted_saving_share'))} "
                  f"({s.get('predicted_saving_model')}), rel err {_p(s.get('predicted_saving_rel_err'))}; "
                  f"full prefill measured/roofline {_ratio(s)}")
        if "kernel_flops_share_of_peak" in s:
            print(f"  attention kernel {s['kernel_flops_per_s'] / 1e12:.1f} TFLOP/s "
                  f"({_p(s['kernel_flops_share_of_peak'])} of peak), {s['kernel_bytes_per_s'] / 1e9:.0f} GB/s")
        status |= not v["ok"]
    print("=" * 78)
    return status


def _g(v) -> str:
    return "-" if v is None else f"{v:.2e}"


def _p(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _ratio(s: dict[str, Any]) -> str:
    if not s.get("roofline_full_s"):
        return "-"
    return f"{s['measured_full_s'] / s['roofline_full_s']:.2f}x"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvsim.gpu.cuda_check", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("out/gpu-check"))
    ap.add_argument("--summary", action="store_true", help="print the final table from OUT and exit")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU (Triton interpreter): "
                    "exercises this script's code path without a GPU; its numbers mean nothing")
    args = ap.parse_args(argv)
    if args.summary:
        return summary(args.out)
    if args.dry_run:
        import os

        os.environ.setdefault("TRITON_INTERPRET", "1")
    return run_checks(args.out, args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
