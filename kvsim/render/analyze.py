"""Terminal rendering of an analysis report (rich): key numbers first, then one table per
section. It reads only ``report.to_dict()``, so everything printed is also in ``--json``."""
from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console, Group
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text


def pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def num(x: float | int | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not x.is_integer():
        return f"{x:,.1f}"
    return f"{int(x):,}"


def human(x: float | int | None) -> str:
    """12.3M, 450k, 980 — for the headline panel."""
    if x is None:
        return "-"
    x = float(x)
    for unit, div in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.1f}{unit}"
    return f"{x:.0f}"


def _table(title: str, *columns: str, right_from: int = 1) -> Table:
    t = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for k, c in enumerate(columns):
        t.add_column(c, justify="right" if k >= right_from else "left")
    return t


def render_report(console: Console, data: dict[str, Any]) -> None:
    """Print the report: a headline panel, then the sections that apply."""
    console.print(_headline(data))
    for part in (_shape, _bounds, _hash_native, _prefixes, _divergence, _volatile, _sessions, _isolation,
                 _reuse_distance, _heuristic, _recommendation):
        block = part(data)
        if block is not None:
            console.print(block)
    for note in data.get("notes", []):
        console.print(f"[dim]note: {escape(note)}[/]")


def _headline(d: dict[str, Any]) -> Panel:
    s = d["shape"]
    lines = [f"[bold]{num(s['requests'])}[/] requests, [bold]{human(s['prompt_tokens'])}[/] prompt tokens"
             + (f", {num(s['sessions'])} session{'s' if s['sessions'] != 1 else ''}" if s["sessions"] else "")
             + (f", hash ids of {s['hash_block_size']}-token blocks" if s["hash_block_size"] else "")]
    b = d.get("bound")
    if b is None:
        lines.append("[yellow]no prefix information in this trace: only its shape is reported[/]")
    else:
        lines.append(f"Unlimited-cache upper bound: [bold green]{pct(b['token'])}[/] of prompt tokens at token level, "
                     f"[bold green]{pct(b['block16'])}[/] with APC 16-token blocks")
        h = d.get("hash_native")
        if h:
            lines.append(f"At the trace's own {h['block_size']}-token blocks: {pct(h['token_weighted'])} "
                         f"token-weighted, {pct(h['block_weighted'])} block-weighted, "
                         f"{pct(h['request_weighted'])} request-weighted")
        r = d.get("recommendation")
        if r:
            lines.append(f"Recommendation: [bold]{r['engine']}[/], {escape(r['size_text'])}" if r["engine"] != "none"
                         else f"Recommendation: {escape(r['size_text'])}")
            if r["changes"]:
                c = r["changes"][0]
                lines.append(f"Biggest fix: {escape(c['change'])} (+{num(c['tokens_saved'])} tokens, "
                             f"{c['points']:.1f} points)")
        hs = d.get("heuristic")
        if hs:
            lines.append(f"[dim]Seed heuristic (same first {hs['chars']} characters): {pct(hs['share'])} "
                         f"(why it misleads: below)[/]")
    title = ", ".join(s["sources"]) or "trace"
    return Panel("\n".join(lines), title=f"kvsim analyze: {escape(title)}", title_align="left", border_style="cyan")


def _shape(d: dict[str, Any]) -> Group:
    s = d["shape"]
    t = _table("Workload shape (tokens per request)", "", "requests", "mean", "p50", "p90", "p99", "max", "total")
    for name, key in (("prompt", "prompt_length"), ("output", "output_length")):
        q = s[key]
        t.add_row(name, num(s["requests"]), num(q["mean"]), num(q["p50"]), num(q["p90"]), num(q["p99"]),
                  num(q["max"]), num(q["total"]))
    facts = [f"sessions {num(s['sessions'])}", f"tenants {num(s['tenants'])}", f"cache salts {num(s['cache_salts'])}",
             f"LoRA adapters {num(s['lora_adapters'])}", f"output ids known {num(s['output_ids_known'])}",
             f"tokenizer {s['tokenizer'] or '-'}", f"chat template {s['chat_template'] or '-'}",
             f"format {', '.join(s['formats']) or '-'}"]
    a = s["arrival"]
    if a.get("span_s"):
        facts.append(f"arrivals over {a['span_s']:,.0f} s: {a['requests_per_s']:.2f} req/s, "
                     f"{human(a['prompt_tokens_per_s'])} prompt tokens/s, peak {a['peak_requests_per_s']:.2f} req/s")
    parts: list[Any] = [t, Text("  " + " · ".join(facts), style="dim")]
    if a.get("timeline"):
        peak = max(b["requests"] for b in a["timeline"]) or 1
        bars = "".join(" ▁▂▃▄▅▆▇█"[min(8, round(8 * b["requests"] / peak))] for b in a["timeline"])
        parts.append(Text(f"  arrival rate over time: {bars}  (each bar {a['span_s'] / len(a['timeline']):,.0f} s)",
                          style="dim"))
    return Group(*parts)


def _bounds(d: dict[str, Any]) -> Table | None:
    ub = d.get("upper_bound")
    if ub is None:
        return None
    t = _table("Upper bound (unlimited cache): prompt tokens whose prefix an earlier request had",
               "granularity", "tok-wtd", "req-wtd", "tok-wtd L-1", "req-wtd L-1", "hit tokens")
    rows = [("token", ub["token"])] + [(f"block {r['block_size']}", r) for r in ub["blocks"]]
    for name, r in rows:
        t.add_row(name, pct(r["token_weighted"]), pct(r["request_weighted"]), pct(r["token_weighted_recompute"]),
                  pct(r["request_weighted_recompute"]), num(r["hit_tokens"]))
    t.caption = (f"tok-wtd = share of prompt tokens, req-wtd = mean share per request; blocks count only when "
                 f"full (APC); L-1 = the last prompt token is always recomputed: at most floor((L-1)/B) blocks "
                 f"(vLLM) or L-1 tokens (SGLang). {num(ub['requests_with_reuse'])} requests reuse something, "
                 f"{num(ub['fully_reused_requests'])} their whole prompt.")
    if "prompts_only" in ub:
        t.caption += f" Without the logged replies in the cache: {pct(ub['prompts_only']['token'])} at token level."
    t.caption_justify = "left"
    return t


def _hash_native(d: dict[str, Any]) -> Table | None:
    h = d.get("hash_native")
    if not h:
        return None
    t = _table(f"Hash-id trace at its own {h['block_size']}-token blocks (definitions papers use)", "definition",
               "all requests", f"after {pct(h['warmup_share'], 0)} warm-up")
    t.add_row("token-weighted" + (" (partial last block at its length)" if h["tail_has_id"] else ""),
              pct(h["token_weighted"]), pct(h["after_warmup_token_weighted"]))
    t.add_row("block-weighted (hit ids / ids)", pct(h["block_weighted"]), pct(h["after_warmup_block_weighted"]))
    t.add_row("request-weighted (mean per-request share)", pct(h["request_weighted"]), "-")
    return t


def _where(loc: dict[str, Any] | None, offset: bool = False) -> str:
    if loc is None:
        return "-"
    if loc["message"] is None:
        return loc["role"]
    return f"msg {loc['message']} {loc['role']}" + (f" +{loc['offset_in_message']}" if offset else "")


def _prefixes(d: dict[str, Any]) -> Group | None:
    p = d.get("prefixes")
    if p is None:
        return None
    spaces = any(r["namespace"] for r in p["top"])
    t = _table("Top shared prefixes (maximal: some sharer stops here)", "#", "prefix id", "tokens", "requests",
               "sessions", "tokens saved", "ends in", "extends", *(["namespace"] if spaces else []), right_from=2)
    texts = []
    for r in p["top"]:
        t.add_row(str(r["rank"]), r["id"], num(r["length"]), num(r["requests"]), num(r["sessions"]),
                  num(r["tokens_saved"]), _where(r["ends_in"]), "-" if r["extends"] is None else f"#{r['extends']}",
                  *([escape(r["namespace"] or "-")] if spaces else []))
        if "text" in r:
            texts.append(f"  #{r['rank']} {escape(r['text'])!r}")
    tr = p["tree"]
    lines = [(f"  prefix tree at {tr['granularity']}-token blocks: {num(tr['nodes'])} nodes, "
              f"{num(tr['distinct_first_blocks'])} distinct first blocks, depth up to "
              f"{num(tr['max_depth_tokens'])} tokens (leaves {num(tr['mean_leaf_depth_tokens'])} on average), "
              f"{num(tr['branching_nodes'])} branching nodes with {tr['mean_children_at_branch']:.1f} children on "
              f"average (max {num(tr['max_children'])})")]
    sp = p.get("system_prompts")
    if sp is None:
        lines.append("  system prompts: unknown (no message structure in this trace)")
    else:
        top = ", ".join(f"{x['id']} ({num(x['length'])} tokens, {num(x['requests'])} req)" for x in sp["top"][:3])
        lines.append(f"  distinct system prompts: {num(sp['distinct'])} in {num(sp['requests_with_system'])} requests"
                     + (f"; most used: {top}" if top else ""))
    if not p["top"]:
        lines.insert(0, "  no prefix of 16 or more tokens is shared by two requests")
    head: Any = t if p["top"] else Text("Top shared prefixes", style="bold")
    return Group(head, *([Text("\n".join(texts))] if texts else []), Text("\n".join(lines), style="dim"))


def _divergence(d: dict[str, Any]) -> Table | None:
    dv = d.get("divergence")
    if dv is None:
        return None
    h = dv["histogram"]
    t = _table("First divergence: token where each request stops matching its best earlier request",
               "position", "requests", "", right_from=1)
    peak = max([b["requests"] for b in h["bins"]] + [1])
    for b in h["bins"]:
        if b["requests"] or b["from"] == 0:
            t.add_row(b["label"], num(b["requests"]), "█" * round(30 * b["requests"] / peak))
    t.add_row("whole prompt seen", num(h["requests_whole_prompt_seen"]), "")
    t.caption = (f"median stop {num(h['median_stop'])}; {pct(h['stops_inside_block_share'], 0)} of stops fall inside "
                 f"a {h['block']}-token block")
    t.caption_justify = "left"
    return t


def _volatile(d: dict[str, Any]) -> Group | None:
    v = (d.get("divergence") or {}).get("volatile")
    if v is None:
        return None
    if not v["sites"]:
        return Group(Text("Content that breaks sharing", style="bold"),
                     Text("  none found: no place where requests that share a prefix differ briefly and then "
                          "share again", style="dim"))
    t = _table("Content that breaks sharing: requests differ here, then share again", "#", "token", "where", "kind",
               "requests", "span", "shared after", "if moved", right_from=4)
    t.columns[1].justify = "right"
    texts = []
    for k, s in enumerate(v["sites"], 1):
        mb = s.get("moved_bound")
        t.add_row(str(k), num(s["offset"]), _where(s["location"], offset=True), s["kind"],
                  num(s["requests_diverging"]), num(s["median_span_tokens"]), num(s["median_shared_after"]),
                  f"{pct(mb['token'])} (+{mb['token_gain_points']:.1f})" if mb else "-")
        if "text" in s:
            tx = s["text"]
            texts.append(f"  #{k} ...{tx['before']!r} [{tx['span']!r} | {tx['other_span']!r}] {tx['after']!r}...")
    parts: list[Any] = [t]
    if texts:
        parts.append(Text("\n".join(texts)))
    parts.append(Text("  span = median tokens that differ; 'if moved' = token-level upper bound with that span "
                      "moved after the shared part that follows it (gain in points)", style="dim"))
    if v.get("all_moved_bound"):
        m = v["all_moved_bound"]
        parts.append(Text(f"  moving the divergent spans of the {v['all_moved_sites']} sites that gain, together: "
                          f"token level {pct(d['bound']['token'])} -> {pct(m['token'])} "
                          f"(+{num(m['token_gain_tokens'])} tokens), APC block 16 {pct(d['bound']['block16'])} -> "
                          f"{pct(m['block16'])}", style="dim"))
    return Group(*parts)


def _sessions(d: dict[str, Any]) -> Table | None:
    s = d.get("sessions")
    if s is None or not s.get("turn_pairs"):
        return None
    t = _table("Multi-turn sessions: does turn t+1 repeat turn t's prompt + reply token for token?",
               "", "turn pairs", "tokens lost")
    t.add_row("verbatim history", num(s["verbatim_pairs"]), "0")
    for key, name in (("edited_history", "history edited (break in the previous prompt)"),
                      ("retokenization", "reply re-tokenized"), ("reply_dropped", "reply content dropped"),
                      ("reply_edited", "reply edited")):
        t.add_row(name, num(s[key]["pairs"]), num(s[key]["tokens_lost"]))
    t.caption = (f"{num(s['sessions'])} sessions; consecutive-turn reuse {pct(s['consecutive_reuse_share'])} of the "
                 f"next prompts; replies known for {num(s['reply_ids_known_pairs'])} pairs"
                 + (f"; {s['note']}" if s.get("note") else ""))
    t.caption_justify = "left"
    return t


def _isolation(d: dict[str, Any]) -> Table | None:
    iso = d.get("isolation")
    if iso is None:
        return None
    t = _table("Isolation and adapters: upper bound with namespaces honoured vs ignored", "", "token level",
               "APC block 16", "cost (tokens)", "cost (points)")
    h = iso["honoured"]
    t.add_row("honoured (what the engines do)", pct(h["token"]), pct(h["block16"]), "", "")
    for key, name in (("salts_ignored", "cache salts ignored"), ("adapters_ignored", "LoRA adapters ignored"),
                      ("both_ignored", "both ignored")):
        if key in iso:
            r = iso[key]
            t.add_row(name, pct(r["token"]), pct(r["block16"]), num(r["token_cost_tokens"]),
                      f"{r['token_cost_points']:.1f}")
    return t


def _reuse_distance(d: dict[str, Any]) -> Group | None:
    rd = d.get("reuse_distance")
    if not rd:
        return None
    model = d["settings"].get("model")
    t = _table("KV capacity for a share of the upper bound (one-pass APC curve)",
               "block", "unit", "50%", "80%", "90%", "99%", right_from=2)
    if not any(r["capacity"] for r in rd):
        return Group(Text("KV capacity for a share of the upper bound", style="bold"),
                     Text("  no block is ever reused", style="dim"))
    for r in rd:
        caps = {c["share_of_bound"]: c for c in r["capacity"]}
        t.add_row(str(r["block_size"]), "tokens", *(human(caps[x]["tokens"]) if x in caps else "-"
                                                     for x in (50, 80, 90, 99)))
        if model and r["capacity"]:
            t.add_row("", "GiB", *(f"{caps[x]['gib']:.1f}" if x in caps else "-" for x in (50, 80, 90, 99)))
    lines = []
    for r in rd:
        need = r.get("need_tokens") or {}
        if need:
            lines.append(f"  block {r['block_size']}: capacity each cached token needs p10 "
                         f"{human(need['p10'])}, p50 {human(need['p50'])}, p90 {human(need['p90'])}, "
                         f"p99 {human(need['p99'])}")
    curve = rd[-1].get("curve") or []
    if curve:
        lines.append(f"  APC hit rate by capacity (block {rd[-1]['block_size']}): "
                     + ", ".join(f"{human(c['capacity_tokens'])} {pct(c['hit_rate'])}" for c in curve))
    lines.append("  " + (f"GiB for {model}" if model else "add --model for GiB") +
                 "; the same figure as kvsim report's; check a capacity with kvsim simulate")
    return Group(t, Text("\n".join(lines), style="dim"))


def _heuristic(d: dict[str, Any]) -> Text | None:
    h = d.get("heuristic")
    if h is None or d.get("bound") is None:
        return None
    b = d["bound"]
    return Text.from_markup(
        f"[bold]Seed heuristic[/] ({escape(h['method'])}): {pct(h['share'])} of prompts share the most common "
        f"opening, vs the real upper bound {pct(b['token'])} (token level) / {pct(b['block16'])} (APC block 16).\n"
        f"[dim]  misleading: {escape(h['why_misleading'])}[/]")


def _recommendation(d: dict[str, Any]) -> Panel | None:
    r = d.get("recommendation")
    if r is None:
        return None
    lines = [f"[bold]{r['engine']}[/], {escape(r['size_text'])}" if r["engine"] != "none"
             else f"[bold]{escape(r['size_text'])}[/]"]
    lines += [f"  • {escape(x)}" for x in r["reasons"]]
    if r["changes"]:
        lines.append(f"Top changes, by prefill tokens saved ({r['metric']} upper bound):")
        for k, c in enumerate(r["changes"], 1):
            lines.append(f"  {k}. {escape(c['change'])}: [bold]+{num(c['tokens_saved'])}[/] tokens "
                         f"({c['points']:.1f} points)")
    else:
        lines.append("No change to the prompts or the deployment would save more than 0.1% of prompt tokens.")
    return Panel("\n".join(lines), title="Recommendation", title_align="left", border_style="green")
