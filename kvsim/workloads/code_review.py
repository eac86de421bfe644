"""(a) Code review: one long shared system prompt, short varied user code snippets.

Every request sends the same reviewer system prompt (a few thousand tokens) and one
snippet to review; about one review in seven gets a follow-up question that resends the
conversation so far (system, snippet, the review, the question) — the seed article's
"request C".

(g) Volatile prefix (:func:`build_volatile`): the same workload, but the app writes "Today is
<time>. Request ID: <id>." at the very start of the system prompt, so no two requests share
more than the chat template's header — the mistake the analyzer must point out.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from kvsim.workloads import code, words
from kvsim.workloads.record import ChatRequest, answered, finalize, msg
from kvsim.workloads.registry import Params
from kvsim.workloads.rng import Rng
from kvsim.workloads.text import TextGen, approx_tokens, fill

FOLLOWUP_SHARE = 0.15
MAX_TOKENS = 512
REPLY_CAP = 400  # target size of the longest reply; code counts ~15% more tokens than estimated
_COMPANIES = ("Northwind", "Contoso", "Globex", "Initech", "Acme Robotics", "Umbrella Labs")

_INTRO = (
    "You are ReviewBot, an expert code reviewer for the engineering team at {company}. You review "
    "pull requests and code snippets written in Python, JavaScript and Go. Your reviews are precise, "
    "friendly and actionable: every finding names the problem, explains why it matters and shows a fix."
)
_PRIORITIES = (
    "## Review priorities\n"
    "1. Correctness: the code does what its name and docstring promise, for every input.\n"
    "2. Security: untrusted input never reaches a query, a shell or a file path unchecked.\n"
    "3. Reliability: errors are handled or raised, never silently swallowed.\n"
    "4. Performance: no repeated work inside loops, no blocking calls on hot paths.\n"
    "5. Readability: clear names, small functions, comments only where the code cannot speak."
)
_OUTPUT_FORMAT = (
    "## Output format\n"
    "Start with a one-line summary of what the code does. Then list the findings ordered by "
    "severity, each as \"**[severity]** line N: problem. Fix: suggestion.\" Use the severities "
    "blocker, major, minor and nit. End with one sentence on what is done well. Keep the review "
    "under 400 words and do not rewrite the whole function unless the user asks for it."
)
_SECTIONS = ("## Team conventions for Python", "## Team conventions for JavaScript",
             "## Team conventions for Go", "## Security checklist", "## Performance checklist",
             "## Testing expectations")

_ASKS = ("Please review this {lang} {kind}:", "Can you review this {lang} {kind}?",
         "Review this {lang} {kind}, please.", "Could you take a look at this {lang} {kind}?",
         "I'd appreciate a quick review of this {lang} {kind}:")
_KINDS = ("function", "code", "change", "snippet")
_CONCERNS = ("I'm mostly worried about error handling.", "Is this thread-safe?",
             "Can this be made faster?", "Does this handle empty input correctly?",
             "Our linter flags it but I'm not sure why.", "It works locally but fails in CI.",
             "This runs on every request, so performance matters.")
_OPENINGS = ("Overall the function is easy to follow, but a few issues are worth fixing before merge.",
             "Thanks for sharing this. The logic is mostly correct; here are my findings.",
             "Summary: the function works for the happy path but needs better error handling.",
             "The intent is clear, and the structure is reasonable. A few points:")
_SEVERITIES = ("blocker", "major", "minor", "nit")
_CLOSINGS = ("Good use of early returns; the naming is clear.",
             "Let me know if you want me to look at the tests as well.",
             "Nice and compact otherwise; the control flow is easy to read.",
             "With these changes this is ready to merge.")
_FOLLOWUPS = ("Can you explain point {k} in more detail?",
              "Thanks! Could you show the full corrected version of the function?",
              "Why is point {k} a problem here? It has worked fine so far.",
              "Would you also add tests for this? Which cases matter most?",
              "Is point {k} really that severe, or can it wait for a later PR?")


def system_prompt(rng: Rng, tokens: int) -> str:
    """The shared reviewer instructions, about ``tokens`` tokens (a worked example is
    included from 800 tokens up)."""
    text = TextGen(rng, words.CODE)
    head = [_INTRO.format(company=rng.choice(_COMPANIES)), _PRIORITIES]
    tail = [_OUTPUT_FORMAT]
    if tokens >= 800:
        example_code = code.snippet(rng, "python", 70)
        tail.insert(0, "## Example\nUser: Please review this Python function:\n```python\n"
                       f"{example_code}\n```\nAssistant: {review_reply(rng, 'python', 110)}")
    budget = tokens - sum(approx_tokens(p) for p in head + tail)
    sections: list[str] = []
    for i, title in enumerate(_SECTIONS):  # each section takes its share of what is left
        share = (budget - sum(approx_tokens(x) for x in sections)) // (len(_SECTIONS) - i)
        sections.append(f"{title}\n{text.bullets(max(15, share - approx_tokens(title)))}")
    return "\n\n".join(head + sections + tail)


def review_request(rng: Rng) -> tuple[str, str]:
    """A user message asking for a review of a fresh snippet, and the snippet's language."""
    lang = rng.weighted(code.LANGUAGES, code.LANGUAGE_WEIGHTS)
    tokens = rng.lognormal_int(110, 0.5, 30, 400)
    ask = rng.choice(_ASKS).format(lang=code.LANGUAGE_NAMES[lang], kind=rng.choice(_KINDS))
    body = f"{ask}\n\n```{lang}\n{code.snippet(rng, lang, tokens)}\n```"
    if rng.chance(0.4):
        body += "\n\n" + rng.choice(_CONCERNS)
    return body, lang


def review_reply(rng: Rng, lang: str, tokens: int) -> str:
    """A review of about ``tokens`` tokens: findings by severity, a suggested fix."""
    text = TextGen(rng, words.CODE)
    head, tail = rng.choice(_OPENINGS), rng.choice(_CLOSINGS)
    fix = ""
    if tokens >= 150:
        fix = f"Suggested fix:\n```{lang}\n{code.snippet(rng, lang, min(80, tokens // 4))}\n```"
    budget = tokens - approx_tokens(head) - approx_tokens(tail) - approx_tokens(fix)
    count = iter(range(1, 100))
    findings = fill(lambda: (f"{next(count)}. **[{rng.choice(_SEVERITIES)}]** line {rng.between(2, 30)}: "
                             f"{text.sentence()} Fix: {text.sentence()}"), budget, "\n")
    return "\n\n".join(p for p in (head, findings, fix, tail) if p)


def _volatile_line(t: float, rng: Rng) -> str:
    when = datetime(2026, 11, 30, 14, 0, 0) + timedelta(seconds=int(t))
    return f"Today is {when:%Y-%m-%d %H:%M:%S}. Request ID: {rng.hex(8)}.\n"


def build(p: Params, rng: Rng, volatile: bool = False, prefix: str = "cr") -> list[ChatRequest]:
    """``p.requests`` review requests (originals and follow-ups) in arrival order.

    With ``volatile`` the system prompt starts with the current time and a request id,
    rendered afresh for every request (follow-ups included), as a careless app would.
    """
    assert p.requests is not None and p.rate is not None and p.system_tokens is not None
    system = system_prompt(rng.fork("system"), p.system_tokens)
    draw = rng.fork("requests")
    out: list[ChatRequest] = []
    t = 0.0
    conversation = 0
    while len(out) < p.requests:
        t += draw.expo(p.rate / (1.0 + FOLLOWUP_SHARE))
        session = f"{prefix}-s{conversation:04d}"
        conversation += 1
        user, lang = review_request(draw)
        first_reply = review_reply(draw, lang, draw.lognormal_int(260, 0.4, 40, REPLY_CAP))
        sys_first = (_volatile_line(t, draw) + system) if volatile else system
        first = answered([msg("system", sys_first), msg("user", user)], first_reply,
                         max_tokens=MAX_TOKENS, timestamp=t, model=p.model, session_id=session)
        out.append(first)
        if len(out) < p.requests and draw.chance(FOLLOWUP_SHARE):
            # The follow-up resends the history: system, snippet, the review, a question.
            t_follow = t + 0.02 * first.output_length + draw.lognormal_int(40, 0.6, 8, 600)
            question = draw.choice(_FOLLOWUPS).format(k=draw.between(1, 3))
            sys_follow = (_volatile_line(t_follow, draw) + system) if volatile else system
            follow_reply = review_reply(draw, lang, draw.lognormal_int(200, 0.4, 30, REPLY_CAP))
            history = [msg("system", sys_follow), msg("user", user), msg("assistant", first_reply)]
            out.append(answered(history + [msg("user", question)], follow_reply, max_tokens=MAX_TOKENS,
                                timestamp=t_follow, model=p.model, session_id=session))
    return finalize(out, prefix)


def build_volatile(p: Params, rng: Rng) -> list[ChatRequest]:
    """(g) Volatile prefix: :func:`build` with the time and a request id opening the prompt."""
    return build(p, rng, volatile=True, prefix="vol")
