"""Multi-turn sessions: does each turn repeat the previous prompt and reply verbatim?

For consecutive turns t, t+1 of a session (file order), turn t+1's prompt should start
with turn t's prompt followed by turn t's reply (its logged output ids, when known). A
break before that point costs the rest of the history: those tokens are recomputed even
with an unlimited cache. Breaks are classified:

- *edited history*: the break is inside turn t's prompt;
- *re-tokenization*: inside the reply, and both sides run together again after a few
  tokens (the same text tokenized differently, e.g. at the reply/template boundary);
- *reply content dropped*: inside the reply, and turn t+1 resumes further on in the reply
  (stripped reasoning, truncated answer);
- *reply edited*: inside the reply, anything else.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from kvsim.analyze import _kernels as K
from kvsim.analyze.options import AnalyzeOptions
from kvsim.io.trace.columns import NONE, Trace

RETOKENIZE_SKIP = 8  # both sides resume within this many tokens: the same text re-tokenized


def consecutive_turns(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(previous, next) request indices of consecutive turns within sessions."""
    idx = np.flatnonzero(trace.session != NONE)
    if len(idx) < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = idx[np.argsort(trace.session[idx], kind="stable")]
    same = trace.session[order[1:]] == trace.session[order[:-1]]
    return order[:-1][same].astype(np.int64), order[1:][same].astype(np.int64)


def session_continuity(trace: Trace, tokens: np.ndarray, opts: AnalyzeOptions) -> dict[str, Any] | None:
    """Section 5 (None when the trace has no session ids)."""
    prev, nxt = consecutive_turns(trace)
    if (trace.session != NONE).sum() == 0:
        return None
    out: dict[str, Any] = {"sessions": int(len(np.unique(trace.session[trace.session != NONE]))),
                           "turn_pairs": int(len(prev))}
    if len(prev) == 0:
        return out
    use_ext = trace.output_known[prev]
    res = np.zeros((len(prev), 5), np.int64)
    out_tok = np.asarray(trace.output_tokens).astype(tokens.dtype, copy=False)
    K.pair_prefixes(tokens, trace.offsets, nxt, out_tok, trace.output_offsets, prev, use_ext,
                    opts.max_skip, opts.window, res)
    common, hist, da, db, run = res.T
    lp = trace.prompt_lengths[prev]
    ln = trace.prompt_lengths[nxt]
    B = trace.meta.hash_block_size
    if B:
        # hash-id traces: a last block that is partial in turn t is a different (longer)
        # block in turn t+1, so only the previous prompt's full blocks can repeat
        hist = lp // B * B
        lp = hist
    verbatim = common >= np.minimum(hist, ln)
    brk = ~verbatim
    in_prompt = brk & (common < lp)
    in_reply = brk & ~in_prompt
    realigned = run >= opts.window
    retok = in_reply & realigned & (da <= RETOKENIZE_SKIP) & (db <= RETOKENIZE_SKIP)
    dropped = in_reply & realigned & ~retok & (db > da + RETOKENIZE_SKIP)
    edited_reply = in_reply & ~retok & ~dropped
    # history as it appears in the next prompt (shifted by what was dropped or added)
    hist_in_next = np.where(realigned, hist + da - db, hist)
    cost = np.where(brk, np.maximum(0, np.minimum(ln, hist_in_next) - common), 0)

    def part(mask: np.ndarray) -> dict[str, int]:
        return {"pairs": int(mask.sum()), "tokens_lost": int(cost[mask].sum())}

    out.update({
        "reply_ids_known_pairs": int(use_ext.sum()),
        "verbatim_pairs": int(verbatim.sum()),
        "verbatim_share": float(verbatim.mean()),
        "consecutive_reuse_tokens": int(np.minimum(common, ln).sum()),
        "consecutive_reuse_share": float(np.minimum(common, ln).sum() / ln.sum()) if ln.sum() else 0.0,
        "breaks": int(brk.sum()),
        "tokens_lost": int(cost.sum()),
        "edited_history": part(in_prompt),
        "retokenization": part(retok),
        "reply_dropped": part(dropped),
        "reply_edited": part(edited_reply),
        "median_break_position": float(np.median(common[brk])) if brk.any() else None,
    })
    if B:
        out["note"] = f"hash ids: only the previous prompt's full {B}-token blocks are checked"
    elif not use_ext.any():
        out["note"] = "no logged reply ids: only the previous prompt is checked"
    return out
