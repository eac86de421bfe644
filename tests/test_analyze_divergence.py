"""First divergence and volatile content: where sharing breaks and what moving it recovers."""
from __future__ import annotations

import numpy as np
import pytest

from kvsim.analyze import AnalyzeOptions, analyze
from kvsim.analyze.divergence import divergence_histogram
from kvsim.io.trace.columns import Trace


def with_messages(trace: Trace, starts: list[list[int]], roles: list[list[str]]) -> Trace:
    """Attach message spans (token offset and role of each message) to a test trace."""
    names = sorted({r for rs in roles for r in rs})
    counts = [len(s) for s in starts]
    trace.msg_offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
    trace.msg_starts = np.concatenate([np.asarray(s, np.int64) for s in starts])
    trace.msg_roles = np.concatenate([np.asarray([names.index(r) for r in rs], np.int32) for rs in roles])
    trace.role_names = names
    return trace


def timestamp_workload(n: int = 12, ts_len: int = 4) -> tuple[Trace, int]:
    """A 2,000-token system prompt with a timestamp at token 5, then a unique question."""
    header = list(range(1, 6))                         # 5 stable tokens
    rest = list(range(10_000, 10_000 + 2000 - 5 - ts_len))
    prompts, starts = [], []
    for i in range(n):
        ts = [50_000 + 10 * i + k for k in range(ts_len)]   # differs from its first token on
        question = [90_000 + 100 * i + k for k in range(20)]
        prompts.append(header + ts + rest + question)
        starts.append([0, 2000])
    trace = Trace.from_prompts(prompts, arrival=np.arange(n, dtype=float) * 10)
    return with_messages(trace, starts, [["system", "user"]] * n), len(rest)


def test_timestamp_at_token_5_of_a_shared_system_prompt():
    """The detector points at token 5 of message 0 (system), and moving the timestamp
    after the stable part lifts the bound to the whole rest of the system prompt."""
    n = 12
    trace, rest = timestamp_workload(n)
    report = analyze(trace)
    assert report.bound["token_tokens"] == (n - 1) * 5
    vol = report.divergence["volatile"]
    site = vol["sites"][0]
    assert site["offset"] == 5
    assert site["location"] == {"message": 0, "role": "system", "offset_in_message": 5}
    assert site["kind"] == "volatile value"
    assert site["requests_diverging"] == n - 1
    assert site["median_span_tokens"] == 4
    assert site["median_shared_after"] == rest
    assert site["requests_moved"] == n
    moved = site["moved_bound"]
    # after the move every later request shares the header and the rest of the system prompt
    assert moved["token_tokens"] == (n - 1) * (5 + rest)
    assert moved["token_gain_tokens"] == (n - 1) * (5 + rest) - (n - 1) * 5
    assert moved["block16_tokens"] == (n - 1) * ((5 + rest) // 16 * 16)
    change = report.recommendation["changes"][0]
    assert "token 5 of message 0 (system)" in change["change"]
    assert change["tokens_saved"] == moved[("token" if report.recommendation["engine"] == "RadixAttention"
                                            else "block16") + "_gain_tokens"]


def test_volatile_values_of_different_lengths():
    """A user name of 1-3 tokens inside a shared prompt is found and moved."""
    base = list(range(1000, 1200))
    prompts = []
    for i in range(8):
        name = [70_000 + 10 * i + k for k in range(1 + i % 3)]
        prompts.append(base[:40] + name + base[40:] + [80_000 + i])
    report = analyze(Trace.from_prompts(prompts))
    site = report.divergence["volatile"]["sites"][0]
    assert site["offset"] == 40 and site["requests_diverging"] == 7
    assert site["moved_bound"]["token_tokens"] == 7 * 200


def test_popular_document_after_retrieved_ones():
    """A popular document placed after a per-request one: moving the retrieved part after
    it makes the popular document shareable."""
    head = list(range(1, 30))
    popular = list(range(5000, 5300))
    prompts = []
    for i in range(6):
        retrieved = [20_000 + 1000 * i + k for k in range(100)]
        prompts.append(head + retrieved + popular + [60_000 + i])
    report = analyze(Trace.from_prompts(prompts))
    site = report.divergence["volatile"]["sites"][0]
    assert site["offset"] == 29 and site["kind"] == "divergent section"
    assert site["median_span_tokens"] == 100 and site["median_shared_after"] == 300
    assert site["moved_bound"]["token_tokens"] == 5 * (29 + 300)


def test_no_site_without_reconvergence():
    """A shared system prompt followed by unrelated questions is not volatile content."""
    rng = np.random.default_rng(1)
    system = list(range(300))
    prompts = [system + rng.integers(10_000, 50_000, 80).tolist() for _ in range(10)]
    report = analyze(Trace.from_prompts(prompts))
    assert report.divergence["volatile"]["sites"] == []
    assert report.recommendation["changes"] == [] or all("move" not in c["change"]
                                                         for c in report.recommendation["changes"])


def test_divergence_histogram_counts():
    reuse = np.array([0, 5, 16, 17, 300, 40])
    lengths = np.array([10, 10, 20, 30, 400, 40])
    h = divergence_histogram(reuse, lengths)
    by_label = {b["label"]: b["requests"] for b in h["bins"]}
    assert by_label["0"] == 1 and by_label["1-15"] == 1 and by_label["16-63"] == 2 and by_label["256-1023"] == 1
    assert h["requests_whole_prompt_seen"] == 1
    assert h["requests_stopping_in_prompt"] == 5
    assert h["stops_inside_block"] == 3        # 5, 17, 300 are not multiples of 16
    assert h["stops_inside_block_share"] == pytest.approx(3 / 5)


def test_show_text_only_when_asked():
    """Raw text of a site appears only with show_text."""
    trace, _ = timestamp_workload(4)
    trace.meta.tokenizer = "bytes"
    assert "text" not in analyze(trace).divergence["volatile"]["sites"][0]
    shown = analyze(trace, AnalyzeOptions(show_text=True)).divergence["volatile"]["sites"][0]
    assert set(shown["text"]) == {"before", "span", "other_span", "after"}
