"""The report's words: number formats, captions (one sentence per chart), tables and key numbers.

Everything here reads plain data (the analyze dict, summaries, rates, keyed by policy) and
returns strings or :class:`~kvsim.report.document.Table` objects; an engine's names come from
its spec (:mod:`kvsim.engines.registry`). Nothing here prints prompt text unless the analyze
dict carries it (``--show-text``).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from kvsim import __version__
from kvsim.report.document import KeyNumber, Table

IGNORED = {"salt": "cache salts ignored", "lora": "adapters ignored"}
COLUMN_NAMES = {"tenant": "tenant", "cache_salt": "cache salt", "lora": "LoRA adapter"}

CAPACITY_INTRO = ("How much of the prompt tokens a cache of a given size serves, replaying the log in arrival "
                  "order. The dashed lines are the unlimited-cache upper bounds; the vertical line is the "
                  "capacity used in the rest of the report.")
OPTIMAL_INTRO = ("The dotted lines are the optimum: the most any cache of that size could serve, knowing the "
                 "whole log in advance, under the same engine rules (whole blocks or pages, the last prompt "
                 "token recomputed, namespaces kept apart, a running request's own blocks resident). The gap "
                 "between an engine and its optimum is what a better eviction policy could still win; the gap "
                 "to the dashed bound, only more memory or different prompts. How it is computed and proven: "
                 "docs/optimal.md in kvsim's repository.")
BLOCK_INTRO = ("APC caches only full blocks and radix allocates whole pages, so larger units lose the partial "
               "block at every divergence point; they also change how many blocks fit in the same memory.")


# -- formats -------------------------------------------------------------------------------

def pct(x: float | None, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{100 * x:.{digits}f}%"


def tokens(x: float | int | None) -> str:
    if x is None or (isinstance(x, float) and math.isinf(x)):
        return "unlimited"
    if isinstance(x, float) and math.isnan(x):
        return "-"
    return f"{int(round(x)):,}"


def human(x: float | int | None) -> str:
    """12.3M, 450k, 980."""
    if x is None:
        return "-"
    x = float(x)
    if math.isinf(x):
        return "unlimited"
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.1f}{unit}"
    return f"{x:.0f}"


def gib(tok: float | None, kv_bytes: int | None) -> str:
    if kv_bytes is None or tok is None or not math.isfinite(tok):
        return "-"
    return f"{tok * kv_bytes / 2**30:,.2f} GiB"


def capacity_text(cap: float | None, kv_bytes: int | None = None) -> str:
    if cap is None or not math.isfinite(cap):
        return "unlimited"
    return f"{tokens(cap)} tokens" + (f" ({gib(cap, kv_bytes)})" if kv_bytes else "")


def spec(policy: str) -> Any:
    """The engine called ``policy`` (its :class:`~kvsim.engines.spec.EngineSpec`)."""
    from kvsim.engines import registry

    return registry.engine(policy)


def short(policy: str) -> str:
    """The engine's name in tight places: "APC"."""
    return spec(policy).short


def config(policy: str, sim: Any) -> dict[str, Any]:
    """The settings of ``sim`` that ``policy`` reads: its unit and its sweep axes."""
    s = spec(policy)
    return {name: getattr(sim, name) for name in (s.unit, *s.axes)}


def policy_label(policy: str, sim: Any) -> str:
    """"vLLM APC (block 16)": the engine at the settings of ``sim``."""
    return spec(policy).describe(config(policy, sim))


def setting_label(policy: str, settings: dict[str, Any]) -> str:
    """"APC block 16", "radix page 1 lru": a curve's or a sweep row's settings (a policy that
    is no engine, as it is)."""
    from kvsim.engines import registry

    if policy not in registry.names():
        return str(policy)
    from kvsim.engines.options import SimOptions

    s = spec(policy)
    others = [str(settings.get(a, getattr(SimOptions, a))) for a in s.axes if a != s.unit]
    return " ".join([s.short, s.unit_name, str(settings.get(s.unit)), *others])


def unit_series_label(policy: str, sim: Any) -> str:
    """"SGLang radix (lru) at the chosen capacity (by page size)": the engine's line of the
    block-size chart, with the settings it reads besides its unit."""
    s = spec(policy)
    others = [str(getattr(sim, a)) for a in s.axes if a != s.unit]
    return s.label + (f" ({', '.join(others)})" if others else "") + f" at the chosen capacity (by {s.unit_name} size)"


def unit_axis(policies: Any) -> tuple[str, str]:
    """(title, x label) of the block-size chart: "block / page size", "block size (APC) / page
    size (radix)"."""
    units: dict[str, list[str]] = {}
    for p in policies:
        units.setdefault(spec(p).unit_name, []).append(short(p))
    title = "Token hit rate vs " + " / ".join(units) + " size"
    xlabel = " / ".join(f"{u} size ({', '.join(names)})" for u, names in units.items())
    return title, xlabel + " [tokens, log scale]"


def capacity_alt(policies: Any) -> str:
    """The capacity chart in words, for a screen reader."""
    with_optimum = [spec(p).label for p in policies if spec(p).optimal]
    labels = [spec(p).label for p in policies]
    text = "Line chart of token hit rate against KV cache capacity for " + and_list(labels)
    if with_optimum == labels:
        return text + ", with the optimum of each"
    return text + (f", with the optimum of {and_list(with_optimum)}" if with_optimum else "")


def capacity_table_caption(optimum: bool, curves: Any) -> str:
    """What the capacity table holds: exact replays, the optimum (``optimum``), the exact
    curves of the engines ``curves``."""
    names = [short(p) for p in curves]
    parts = ["Exact replays"] + (["the optimum at the same capacities"] if optimum else [])
    if names:
        parts.append(f"the {and_list(names)} one-pass curve" + ("s" if len(names) > 1 else ""))
    if len(parts) == 3:
        return f"{parts[0]}, {parts[1]}, and {parts[2]}"
    return " and ".join(parts)


def and_list(items: Any) -> str:
    """"a", "a and b", "a, b and c"."""
    items = [str(i) for i in items]
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def trace_line(shape: dict[str, Any]) -> str:
    """One line about the trace: size, groups, format (no text)."""
    parts = [f"{shape['requests']:,} requests", f"{shape['prompt_tokens']:,} prompt tokens"]
    for key, name in (("sessions", "sessions"), ("tenants", "tenants"), ("cache_salts", "cache salts"),
                      ("lora_adapters", "LoRA adapters")):
        if shape.get(key):
            parts.append(f"{shape[key]:,} {name}")
    if shape.get("formats"):
        parts.append("format " + ", ".join(shape["formats"]))
    if shape.get("tokenizer"):
        parts.append(f"tokenizer {shape['tokenizer']}")
    return " · ".join(parts)


# -- captions (one sentence each) ----------------------------------------------------------

#: why an engine whose one-pass curve is of this kind is drawn by its exact replays
APPROXIMATE = {"token_tree": "no one-pass model tracks its tree within a point"}


def capacity_caption(target_caps: dict[str, float | None], share: float, errors: dict[str, float],
                     from_sweep: bool = False, near: dict[str, float | None] | None = None,
                     near_share: float = 0.9, steps: dict[str, float | None] | None = None,
                     yardstick: str | None = None) -> str:
    """``target_caps``: policy -> the capacity its curve needs for ``share`` (None: no curve);
    ``errors``: policy -> curve vs replay (the engines drawn by an exact curve); ``steps``:
    policy -> the largest step between neighbouring replays (the engines drawn by replays);
    ``yardstick``: the curve the capacity was read from when no engine has an exact one."""
    reach = [f"{short(p)} at {human(c)} tokens" for p, c in target_caps.items() if c is not None]
    if yardstick is not None:
        reach = [yardstick] + reach
    head = (f"Read off the capacity a hit rate needs: {share:.0%} of the unlimited-cache rate takes "
            + " and ".join(reach) if reach else "Nothing is reused, so no capacity helps")
    close = ""
    if near:
        parts = [f"{short(p)} from {human(c)} tokens on" if c is not None else f"{short(p)} nowhere "
                 "in this range" for p, c in near.items()]
        close = f"; each engine stays within {near_share:.0%} of its optimum (triangles): " + ", ".join(parts)
    optimum = "; dotted: the optimum" if any(spec(p).optimal for p in target_caps) else ""
    if from_sweep:
        rough = [short(p) for p in target_caps if spec(p).curve and not spec(p).curve_exact]
        return (head + close + "; lines are one-pass curves" + (f" ({', '.join(rough)}: an estimate)" if rough else "")
                + ", markers the sweep's exact replays.")
    drawn = [f"{short(p)}: its one-pass curve (exact) and exact replays (circles, curve vs replay {short(p)} "
             f"within {100 * e:.1f} points)" for p, e in errors.items()]
    drawn += [f"{short(p)}: exact replays joined by a line"
              + ("" if step is None else f", neighbours at most {100 * step:.1f} points apart")
              + f" ({replays_why(p)})" for p, step in (steps or {}).items()]
    return head + close + "; " + "; ".join(drawn) + optimum + "."


def replays_why(policy: str) -> str:
    """Why the report draws ``policy``'s exact replays rather than a curve."""
    s = spec(policy)
    if s.curve is None:
        return "it has no one-pass curve"
    return APPROXIMATE.get(s.curve, "its one-pass curve is an estimate")


def block_policies_caption(block: int, tail: str, warmup: str | None, exact: bool) -> str:
    """The kvcache-lab view: which model each line is."""
    last = ("the partial last block counts at its real length" if tail == "weighted"
            else "a partial tail is not a block and is not counted")
    return (f"A store of {block}-token blocks of the prompts (replies are not stored), as the Mooncake team's kvcache-lab draws it: no recompute "
            f"cap, no room for the running request, {last}; FIFO evicts in insertion order, LRU the least recently "
            "used leaf, and the optimum is the best any eviction (with bypass) could do"
            + ("" if exact else " (reached by a real schedule; its proven bound is within a fraction of a point)")
            + (f"; {warmup}" if warmup else "") + ".")


def block_caption(rates: dict[str, dict[int, float]], cap: str) -> str:
    """``rates``: policy -> its unit size -> hit rate. An engine with pages is read at page 1
    (token level), the others from their smallest to their largest unit."""
    parts = []
    for p, r in rates.items():
        s = spec(p)
        if not r:
            continue
        if s.unit_name == "page":
            if 1 in r:
                parts.append(f"{s.short} reaches {pct(r[1])} at page 1")
            continue
        lo, hi = min(r), max(r)
        parts.append(f"{s.short} goes from {pct(r[lo])} at {s.unit_name} {lo} to {pct(r[hi])} at {s.unit_name} {hi}")
    if not parts:
        return f"Hit rate by block size at {cap}."
    return f"Smaller blocks share more: at {cap}, " + ", ".join(parts) + (
        ", and the dashed line is the unlimited-cache bound at each size.")


def fraction_caption(fractions: dict[str, np.ndarray]) -> str:
    parts = []
    for p, f in fractions.items():
        f = np.asarray(f, np.float64)
        if len(f):
            parts.append(f"{short(p)}: mean {pct(float(f.mean()))}, {pct(float((f == 0).mean()), 0)} of "
                         f"requests get nothing, {pct(float((f >= 0.9).mean()), 0)} get 90% or more")
    return ("Bars on the right are requests served almost entirely from the cache and bars at 0% got nothing ("
            + "; ".join(parts) + ").")


def divergence_caption(h: dict[str, Any], sites: list[dict[str, Any]]) -> str:
    bins = [b for b in h["bins"] if b["requests"]]
    total = h["requests_stopping_in_prompt"] + h["requests_whole_prompt_seen"]
    if not bins or not total:
        return "No request stops sharing inside its prompt."
    top = max(bins, key=lambda b: b["requests"])
    text = (f"Most requests stop sharing at tokens {top['label']} ({pct(top['requests'] / total, 0)} of requests), "
            f"{pct(h['stops_inside_block_share'], 0)} of stops fall inside a {h['block']}-token block")
    if sites:
        text += (f", and the {len(sites)} highlighted site{'s' if len(sites) != 1 else ''} hold volatile content "
                 "that, moved later in the prompt, would let requests share again")
    return text + "."


def divergence_summary(h: dict[str, Any]) -> str:
    return (f"Median stop at token {tokens(h['median_stop'])}; {h['requests_whole_prompt_seen']:,} request(s) had "
            f"their whole prompt seen before.")


def tree_caption(tree: dict[str, Any], top: list[dict[str, Any]]) -> str:
    ranks = f"#1–#{len(top)} mark the top shared prefixes of the table below" if top else "no prefix is shared"
    thr = tree["min_requests"]
    return (f"Each box is a prefix shared by the requests under it (width) over the token span it covers (height), "
            f"children below their parent; {ranks}, grey bands are cache namespaces, and only prefixes shared by "
            f"{thr} or more requests are drawn ({tree['shared_requests']:,} of {tree['total_requests']:,} "
            f"requests start with one).")


def group_caption(overall: dict[str, dict[str, float]], base: dict[str, float]) -> str:
    """``overall``: namespace kind -> policy -> hit rate with it ignored; ``base``: honoured."""
    costs = [f"{short(p)} {100 * (rates[p] - base[p]):+.1f} points with {IGNORED[which]}"
             for which, rates in overall.items() for p in rates]
    text = "Solid bars are each group's hit rate at the chosen capacity"
    if costs:
        text += (", hatched bars the same groups if the namespace were shared, so the gap is the cost of "
                 f"isolation (overall: {'; '.join(costs)})")
    return text + "."


# -- tables -------------------------------------------------------------------------------

def _where(loc: dict[str, Any] | None, offset: bool = False) -> str:
    if loc is None:
        return "-"
    if loc.get("message") is None:
        return str(loc.get("role", "-"))
    return f"msg {loc['message']} {loc['role']}" + (f" +{loc['offset_in_message']}" if offset else "")


def volatile_table(sites: list[dict[str, Any]]) -> Table:
    rows = []
    for k, s in enumerate(sites, 1):
        mb = s.get("moved_bound")
        rows.append([f"#{k}", tokens(s["offset"]), _where(s["location"], offset=True), s["kind"],
                     f"{s['requests_diverging']:,}", tokens(s["median_span_tokens"]),
                     tokens(s["median_shared_after"]),
                     f"{pct(mb['token'])} ({mb['token_gain_points']:+.1f})" if mb else "-"])
        if "text" in s:
            tx = s["text"]
            rows.append(["", "text", f"…{tx['before']} [{tx['span']} | {tx['other_span']}] {tx['after']}…",
                         "", "", "", "", ""])
    return Table("Volatile content: requests differ here for a short span, then share again. span = median "
                 "tokens that differ; 'if moved' = token-level upper bound with the span moved after the shared "
                 "part (gain in points)",
                 ["site", "token", "where", "kind", "requests", "span", "shared after", "if moved"], rows)


def moved_summary(vol: dict[str, Any], bound: dict[str, Any]) -> str:
    m = vol["all_moved_bound"]
    return (f"Moving the divergent spans of the {vol['all_moved_sites']} sites that gain, together: token level "
            f"{pct(bound['token'])} → {pct(m['token'])} (+{m['token_gain_tokens']:,} tokens), APC block 16 "
            f"{pct(bound['block16'])} → {pct(m['block16'])}.")


def prefix_table(top: list[dict[str, Any]], show_text: bool) -> Table:
    spaces = any(r.get("namespace") for r in top)
    header = ["#", "prefix id", "tokens", "requests", "sessions", "tokens saved", "ends in", "extends"]
    header += ["namespace"] if spaces else []
    header += ["text"] if show_text and any("text" in r for r in top) else []
    rows = []
    for r in top:
        row = [f"#{r['rank']}", r["id"], tokens(r["length"]), f"{r['requests']:,}", f"{r['sessions']:,}",
               tokens(r["tokens_saved"]), _where(r.get("ends_in")),
               "-" if r.get("extends") is None else f"#{r['extends']}"]
        if spaces:
            row.append(r.get("namespace") or "-")
        if "text" in header:
            row.append(r.get("text", ""))
        rows.append(row)
    return Table("Top shared prefixes (maximal: some sharer stops here); tokens saved = (requests - 1) × tokens "
                 "with an unlimited cache", header, rows)


def tree_summary(tr: dict[str, Any]) -> str:
    return (f"Prefix tree at {tr['granularity']}-token blocks: {tr['nodes']:,} nodes, "
            f"{tr['distinct_first_blocks']:,} distinct first blocks, depth up to {tr['max_depth_tokens']:,} tokens, "
            f"{tr['branching_nodes']:,} branching nodes with {tr['mean_children_at_branch']:.1f} children on average.")


def isolation_table(iso: dict[str, Any]) -> Table:
    h = iso["honoured"]
    rows = [["honoured (what the engines do)", pct(h["token"]), pct(h["block16"]), "-", "-"]]
    for key, name in (("salts_ignored", "cache salts ignored"), ("adapters_ignored", "LoRA adapters ignored"),
                      ("both_ignored", "both ignored")):
        if key in iso:
            r = iso[key]
            rows.append([name, pct(r["token"]), pct(r["block16"]), tokens(r["token_cost_tokens"]),
                         f"{r['token_cost_points']:.1f}"])
    return Table("Cost of isolation with an unlimited cache (upper bound, from kvsim analyze). Ignoring LoRA "
                 "namespaces is valid only if the adapters leave K/V unchanged",
                 ["namespaces", "token level", "APC block 16", "cost (tokens)", "cost (points)"], rows)


def definitions(policies: Any = ()) -> list[str]:
    """The definitions of the notes; ``policies``: the report's engines (each beyond the
    built-ins gets a line on how it is drawn)."""
    return [
        "Token hit rate: cached prompt tokens / prompt tokens of the admitted requests (SGLang's cached_tokens / "
        "prompt_tokens; vLLM's num_cached_tokens summed).",
        "Upper bound: the share of prompt tokens whose prefix an earlier request already had, with an unlimited "
        "cache (token level = RadixAttention page 1; APC block 16 = full 16-token blocks); the last prompt token "
        "is always recomputed.",
        "Capacity: usable KV cache in tokens (vLLM: (num_gpu_blocks - 1) × block size; SGLang: "
        "max_total_num_tokens).",
        "Exact replays run the faithful models of vLLM APC 0.33.0 and SGLang RadixAttention 0.5.23 request by "
        "request; one-pass curves give every capacity at once (APC: exact wherever no request is rejected; "
        "radix: an approximation, so the report draws its exact replays instead).",
        "Optimum: the largest hit rate any eviction schedule of a cache of that size reaches on this log, knowing "
        "the future, under the engine's rules; computed exactly, never below an engine's replay.",
        "Estimated GPU time saved uses a gpu-validate calibration: fitted prefill seconds with and without the "
        "cached tokens.",
        "Privacy: no prompt text appears in this report unless it was made with --show-text.",
    ] + [_plugin_line(p) for p in policies if not _builtin(p)]


def _builtin(policy: str) -> bool:
    from kvsim.engines import registry

    return policy in registry.BUILTIN


def _plugin_line(policy: str) -> str:
    """How the report draws an engine from a plugin."""
    s = spec(policy)
    curve = ("its one-pass curve and a few exact replays" if s.curve_exact
             else f"its exact replays ({replays_why(policy)})")
    return (f"{s.label} ({s.name}, a plugin engine following {s.release}'s rules): the report draws {curve}"
            + ("" if s.optimal else ", and no optimum (its spec names none)") + ".")


def settings_table(trace: Any, an: dict[str, Any], sim: Any, source: str, opts: Any,
                   caps: dict[str, float], kv_bytes: int | None) -> Table:
    rows = [
        ["sources", ", ".join(trace.meta.sources) or "-"],
        ["trace", trace_line(an["shape"])],
        ["capacity", "; ".join(f"{short(p)} {capacity_text(c, kv_bytes)}" for p, c in caps.items())
         + f" — {source}"],
        ["engine settings", "".join(f"{policy_label(p, sim)}; " for p in caps) + "vLLM profile "
         f"{sim.engine_version or '0.33 (default)'}"],
        ["block sizes charted", ", ".join(str(b) for b in opts.block_sizes)],
        ["model (GiB figures)", opts.model or "none (add --model for GiB)"],
        ["calibration", "given" if opts.calibration is not None else "none (GPU time not estimated)"],
        ["prompt text", "shown (--show-text)" if opts.show_text else "left out"],
        ["warm-up", opts.warmup.describe(len(trace)) if getattr(opts.warmup, "active", False)
         else "none: every request is counted"],
        ["kvsim", __version__ + (f" — {opts.command}" if opts.command else "")],
    ]
    if trace.meta.skipped_lines:
        rows.append(["skipped input lines", f"{trace.meta.skipped_lines:,} (--on-error skip)"])
    return Table("Settings", ["", "value"], rows)


# -- key numbers ---------------------------------------------------------------------------

def _target_parts(n: dict[str, Any], kv: int | None) -> list[str]:
    """The capacity for the target share by the curve it came from first, then each other
    engine's curve."""
    source = n["target_from"]
    first = (f"{short(source)} {capacity_text(n['target_capacity'], kv)} (exact curve)" if source is not None
             else f"{n['target_yardstick']} needs {capacity_text(n['target_capacity'], kv)} (its exact one-pass "
             "curve: no engine here has one)")
    others = [f"{short(p)} {capacity_text(c, kv)} ({'exact curve' if spec(p).curve_exact else 'estimate'})"
              for p, c in n["capacity_for_target"].items() if p != source and c is not None]
    return [first, *others]


def key_numbers(n: dict[str, Any], summaries: dict[str, dict[str, Any]], an: dict[str, Any], sim: Any,
                opts: Any) -> list[KeyNumber]:
    """The cards at the top of the page, from the figures in ``n`` (see ``ReportData.numbers``)."""
    kv = n["kv_bytes_per_token"]
    caps = n["capacity_tokens"]
    out = [KeyNumber("Upper bound (unlimited cache)", pct(n["upper_bound_token"]),
                     "of prompt tokens reusable at token level; APC 16-token blocks "
                     + pct(n["upper_bound_apc_block16"]))]
    best = n.get("optimal_hit_rate") or {}
    for p, s in summaries.items():
        out.append(KeyNumber(f"{spec(p).label} hit rate", pct(s["token_hit_rate"]),
                             f"at {capacity_text(caps[p], kv)} ({policy_label(p, sim).partition('(')[2].rstrip(')')})"
                             + (f"; the optimum there is {pct(best[p])}" if best.get(p) is not None else "")
                             + (f"; {s['rejected']:,} request(s) never fit" if s["rejected"] else "")))
    total = max(n["prompt_tokens"].values())
    names = " / ".join(short(p) for p in summaries)
    out.append(KeyNumber("Prefill tokens saved", " / ".join(human(c) for c in n["cached_tokens"].values()),
                         f"{names}, of {total:,} prompt tokens at the chosen capacity"))
    if n["gpu_seconds_saved"] is not None:
        cal = opts.calibration
        g = n["gpu_seconds_saved"]
        out.append(KeyNumber("Estimated GPU time saved", " / ".join(f"{v:,.1f} s" for v in g.values()),
                             f"{names} prefill GPU-seconds ({cal.model} on {cal.device}, {cal.dtype} calibration)"))
    else:
        out.append(KeyNumber("Estimated GPU time saved", "not estimated",
                             "no calibration given: the saving is shown in tokens (pass --calibration from "
                             "kvsim gpu-validate for GPU-seconds)"))
    share = n["target_share"]
    target = n["target_capacity"]
    value = "-" if target is None else (gib(target, kv) if kv else f"{human(target)} tokens")
    detail = f"KV for {share:.0%} of the upper bound: " + ", ".join(_target_parts(n, kv))
    if kv is None:
        detail += "; add --model for GiB"
    out.append(KeyNumber(f"KV memory for {share:.0%} of the bound", value, detail))
    r = an.get("recommendation")
    if r:
        size, _, why = (r.get("size_text") or "").partition(" (")
        if r.get("size") is None:  # engine "none": the size text is a sentence
            size, why = "", (r.get("size_text") or "") + ")"
        first = (r.get("changes") or [{}])[0].get("change")
        detail = ([why.rstrip(")")] if why else []) + ([f"biggest fix: {first}"] if first else [])
        out.append(KeyNumber("Recommendation", f"{r['engine']}" + (f", {size}" if size else ""),
                             "; ".join(detail) or "see the recommendation below"))
    return out
