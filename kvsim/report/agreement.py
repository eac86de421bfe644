"""Predicted vs served ``cached_tokens`` of a proxy record (``kvsim serve --upstream``).

Each record line holds kvsim's prediction under ``"kvsim"`` and the real server's answer
under ``"upstream"``. A request is *compared* when the server answered it without error
and reported ``cached_tokens`` (vLLM needs ``--enable-prompt-tokens-details``, SGLang
``--enable-cache-report``; a stream reports usage only with ``include_usage``). The
agreement is the exact share and the mean / max absolute difference over compared
requests; the first disagreement is where to start looking. Prompts whose token counts
differ between kvsim and the server point at a tokenizer or chat-template mismatch.
No prompt text is shown unless asked (``--show-text``) and the record kept it
(``--record-text``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from kvsim.errors import InputError
from kvsim.io.source import Source, check_input


@dataclass(frozen=True)
class Comparison:
    """One proxied request."""

    line: int
    request_id: str
    prompt_tokens: int            # kvsim's count
    server_prompt_tokens: int | None
    predicted: int                # kvsim's cached_tokens
    served: int | None            # the server's cached_tokens (None: not reported)
    status: int
    error: str | None
    latency_ms: float | None
    text: Any = None              # messages / prompt, when the record kept them

    @property
    def compared(self) -> bool:
        return self.status < 400 and self.error is None and self.served is not None

    @property
    def diff(self) -> int | None:
        return None if not self.compared else self.predicted - self.served


@dataclass
class Agreement:
    path: Path
    rows: list[Comparison]

    @property
    def compared(self) -> list[Comparison]:
        return [r for r in self.rows if r.compared]

    @property
    def errors(self) -> list[Comparison]:
        return [r for r in self.rows if r.status >= 400 or r.error is not None]

    @property
    def unreported(self) -> list[Comparison]:
        return [r for r in self.rows if r.status < 400 and r.error is None and r.served is None]

    @property
    def prompt_mismatches(self) -> list[Comparison]:
        return [r for r in self.rows if r.server_prompt_tokens is not None and r.server_prompt_tokens != r.prompt_tokens]

    @property
    def first_disagreement(self) -> Comparison | None:
        return next((r for r in self.compared if r.diff != 0), None)

    def summary(self) -> dict[str, Any]:
        rows = self.compared
        diffs = [abs(r.diff) for r in rows]
        first = self.first_disagreement
        return {
            "requests": len(self.rows),
            "compared": len(rows),
            "exact": sum(1 for d in diffs if d == 0),
            "exact_share": (sum(1 for d in diffs if d == 0) / len(rows)) if rows else None,
            "mean_abs_diff": (sum(diffs) / len(rows)) if rows else None,
            "max_abs_diff": max(diffs) if rows else None,
            "mean_diff": (sum(r.diff for r in rows) / len(rows)) if rows else None,
            "predicted_cached": sum(r.predicted for r in rows),
            "served_cached": sum(r.served for r in rows),
            "errors": len(self.errors),
            "unreported": len(self.unreported),
            "prompt_token_mismatches": len(self.prompt_mismatches),
            "first_disagreement": None if first is None else {
                k: v for k, v in asdict(first).items() if k != "text"},
        }


def load_agreement(path: Path) -> Agreement:
    """Read a proxy record; a line that is not one is an InputError (file, line, problem)."""
    path = Path(path)
    check_input(path)
    rows = []
    for line, rec in Source(path).records():
        if isinstance(rec, InputError):
            raise rec
        rows.append(_row(path, line, rec))
    return Agreement(path, rows)


def _row(path: Path, line: int, rec: Any) -> Comparison:
    def bad(problem: str) -> InputError:
        return InputError(path, problem, line)

    if not isinstance(rec, dict):
        raise bad("expected a JSON object (a kvsim serve --upstream record line)")
    ours, theirs = rec.get("kvsim"), rec.get("upstream")
    if not isinstance(ours, dict) or not isinstance(theirs, dict):
        raise bad("not a proxy record line: needs the 'kvsim' and 'upstream' objects")
    predicted = ours.get("cached_tokens")
    prompt = ours.get("prompt_tokens")
    status = theirs.get("status")
    if not _count(predicted) or not _count(prompt):
        raise bad("kvsim.cached_tokens and kvsim.prompt_tokens must be non-negative integers")
    if not isinstance(status, int) or isinstance(status, bool):
        raise bad("upstream.status must be an integer")
    served = theirs.get("cached_tokens")
    if served is not None and not _count(served):
        raise bad("upstream.cached_tokens must be a non-negative integer or null")
    server_prompt = theirs.get("prompt_tokens")
    error = theirs.get("error")
    latency = theirs.get("latency_ms")
    text = rec.get("messages", rec.get("prompt"))
    return Comparison(line, str(rec.get("request_id", "")), prompt, server_prompt if _count(server_prompt) else None,
                      predicted, served, status, None if error is None else str(error),
                      float(latency) if isinstance(latency, (int, float)) else None, text)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def render_agreement(console: Any, ag: Agreement, top: int = 10, show_text: bool = False) -> None:
    """Print the agreement summary and the per-request table (rich)."""
    from rich.table import Table

    s = ag.summary()
    console.print(f"[bold]{ag.path}[/]: {s['requests']} proxied request(s), {s['compared']} compared "
                  f"(the server reported cached_tokens), {s['errors']} upstream error(s), "
                  f"{s['unreported']} without a reported cached_tokens", highlight=False)
    if s["compared"]:
        console.print(f"agreement: {s['exact']}/{s['compared']} exact ({100 * s['exact_share']:.1f}%), "
                      f"mean |predicted - served| {s['mean_abs_diff']:.2f} tokens, max {s['max_abs_diff']}, "
                      f"mean predicted - served {s['mean_diff']:+.2f}; cached tokens predicted "
                      f"{s['predicted_cached']}, served {s['served_cached']}", highlight=False)
    first = ag.first_disagreement
    if first is not None:
        console.print(f"[bold]first disagreement[/]: line {first.line}, request {first.request_id}: predicted "
                      f"{first.predicted}, served {first.served} (prompt {first.prompt_tokens} tokens)",
                      highlight=False)
        if show_text and first.text is not None:
            console.print(f"  its prompt: {_short(first.text)}", highlight=False, markup=False)
    elif s["compared"]:
        console.print("no disagreement", highlight=False)
    if s["prompt_token_mismatches"]:
        console.print(f"[yellow]{s['prompt_token_mismatches']} request(s) where kvsim and the server count the "
                      "prompt differently: use the server's tokenizer (--tokenizer hf:...) and chat template "
                      "(--chat-template)[/]", highlight=False)
    shown = [r for r in ag.rows if not r.compared or r.diff != 0][:top] if s["compared"] > top else ag.rows[:top]
    if not shown:
        return
    table = Table(title="per request" if shown is ag.rows[:top] else "disagreements and errors")
    for col in ("line", "request", "prompt", "predicted", "served", "diff", "status", "ms"):
        table.add_column(col, justify="left" if col == "request" else "right")
    for r in shown:
        table.add_row(str(r.line), r.request_id[-24:], str(r.prompt_tokens), str(r.predicted),
                      "-" if r.served is None else str(r.served), "" if r.diff is None else f"{r.diff:+d}",
                      str(r.status) + ("" if r.error is None else " " + r.error[:40]),
                      "" if r.latency_ms is None else f"{r.latency_ms:.1f}")
    console.print(table)


def _short(text: Any, n: int = 300) -> str:
    s = text if isinstance(text, str) else str(text)
    return s if len(s) <= n else s[:n] + "..."
