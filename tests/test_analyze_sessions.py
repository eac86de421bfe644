"""Multi-turn sessions: verbatim history, and the kinds of breaks and what they cost."""
from __future__ import annotations

from kvsim.analyze import analyze
from kvsim.analyze.options import AnalyzeOptions
from kvsim.analyze.sessions import session_continuity
from kvsim.io.trace.columns import Trace

P1 = list(range(100, 160))          # turn 1 prompt, 60 tokens
ANSWER = list(range(700, 740))      # 40 tokens
THINK = list(range(900, 930))       # 30 tokens of reasoning
NEW = [5, 6, 7, 8]


def sessions_of(prompts, outputs, sessions):
    trace = Trace.from_prompts(prompts, outputs=outputs, sessions=sessions)
    return session_continuity(trace, trace.tokens, AnalyzeOptions())


def test_verbatim_history():
    s = sessions_of([P1, P1 + ANSWER + NEW], [ANSWER, [1]], ["s", "s"])
    assert s["turn_pairs"] == 1 and s["verbatim_pairs"] == 1 and s["breaks"] == 0 and s["tokens_lost"] == 0
    assert s["consecutive_reuse_tokens"] == 100


def test_edited_history():
    edited = list(P1)
    edited[10] = 1
    s = sessions_of([P1, edited + ANSWER + NEW], [ANSWER, [1]], ["s", "s"])
    assert s["edited_history"] == {"pairs": 1, "tokens_lost": 100 - 10}
    assert s["median_break_position"] == 10


def test_retokenized_reply():
    """The reply's first two tokens come back as one different token."""
    next_prompt = P1 + [1] + ANSWER[2:] + NEW
    s = sessions_of([P1, next_prompt], [ANSWER, [1]], ["s", "s"])
    assert s["retokenization"]["pairs"] == 1
    # history in the next prompt: 60 + 39 tokens, of which the first 60 were reused
    assert s["retokenization"]["tokens_lost"] == 39


def test_stripped_reasoning():
    """The reply was THINK + ANSWER; the next turn resends only ANSWER."""
    s = sessions_of([P1, P1 + ANSWER + NEW], [THINK + ANSWER, [1]], ["s", "s"])
    assert s["reply_dropped"] == {"pairs": 1, "tokens_lost": 40}
    assert s["breaks"] == 1 and s["tokens_lost"] == 40


def test_only_consecutive_turns_of_the_same_session():
    s = sessions_of([P1, P1 + [9], P1 + ANSWER + NEW], [ANSWER, [1], [1]], ["a", "b", "a"])
    assert s["sessions"] == 2 and s["turn_pairs"] == 1 and s["verbatim_pairs"] == 1


def test_without_reply_ids_only_the_prompt_is_checked():
    s = sessions_of([P1, P1 + [3] * 30], None, ["s", "s"])
    assert s["verbatim_pairs"] == 1 and "only the previous prompt" in s["note"]


def test_no_sessions_section_without_session_ids():
    assert analyze(Trace.from_prompts([P1, P1])).sessions is None
