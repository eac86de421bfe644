"""Run several policies on one trace; the results as JSON and per-request rows."""
from __future__ import annotations

from contextlib import nullcontext
from typing import Any, Iterator

from kvsim.io.trace.columns import Trace
from kvsim.outputs import is_jsonable
from kvsim.drive.sequential import replay
from kvsim.drive.metrics import breakdowns, per_request_columns, summarize
from kvsim.engines.options import SimOptions
from kvsim.drive.result import ReplayResult

def run_simulation(trace: Trace, policies: list[str], options: SimOptions,
                   progress: bool = False) -> dict[str, ReplayResult]:
    """Replay ``trace`` through each policy; a progress bar per policy when asked."""
    trace.require_tokens("simulate")
    results: dict[str, ReplayResult] = {}
    bars = None
    if progress and len(trace) >= 2000:
        from kvsim.progress import bars as display

        bars = display("count")
    with (bars or nullcontext()) as bars:
        for name in policies:
            if bars is None:
                results[name] = replay(name, trace, options)
                continue
            update = bars.task(f"replaying ({name})", len(trace))
            results[name] = replay(name, trace, options, progress=update)   # progress(done, total)
            update(len(trace))
    return results


def simulation_json(trace: Trace, runs: dict[str, ReplayResult], options: SimOptions,
                    calibration: Any = None) -> dict[str, Any]:
    """Everything the terminal shows, as JSON (no prompt text)."""
    return {
        "trace": {
            "sources": trace.meta.sources, "formats": trace.meta.formats, "requests": len(trace),
            "prompt_tokens": trace.num_prompt_tokens, "tokenizer": trace.meta.tokenizer,
            "chat_template": trace.meta.chat_template, "skipped_lines": trace.meta.skipped_lines,
        },
        "options": options.as_dict(),
        "policies": {
            name: {
                "summary": summarize(r, trace, calibration),
                "config": r.config,
                "breakdowns": {c: f.reset_index().to_dict(orient="records") for c, f in breakdowns(r, trace).items()},
                "extra": {k: v for k, v in r.extra.items() if is_jsonable(v)},
            }
            for name, r in runs.items()
        },
    }


def per_request_rows(trace: Trace, runs: dict[str, ReplayResult]) -> Iterator[dict[str, Any]]:
    """One dict per request (per policy when several), in input order."""
    for name, r in runs.items():
        columns = per_request_columns(r, trace)
        keys = (["policy"] if len(runs) > 1 else []) + list(columns)
        values = ([[name] * len(columns["index"])] if len(runs) > 1 else []) + list(columns.values())
        for row in zip(*values):
            yield dict(zip(keys, row))
