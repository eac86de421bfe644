"""(b) Multi-turn support chatbot: a ~650-token system prompt (company policy ~200,
product information ~300, response guidelines ~150 tokens, as in the seed article), and
sessions whose every turn resends the system prompt and the whole history, including
the assistant's earlier replies. Sessions start as a Poisson stream and interleave."""
from __future__ import annotations

import math

from kvsim.workloads import words
from kvsim.workloads.record import ChatRequest, answered, finalize, msg
from kvsim.workloads.registry import Params
from kvsim.workloads.rng import Rng
from kvsim.workloads.text import TextGen, approx_tokens

MAX_TOKENS = 256
POLICY_TOKENS, PRODUCT_TOKENS, GUIDELINE_TOKENS = 200, 300, 150

_INTRO = ("You are a customer support specialist at TechCorp. You help customers with TechCorp "
          "products, billing and accounts in the website chat.")
_POLICY = (
    ("- Annual plans can be refunded in full within 30 days of purchase; monthly plans are "
     "refunded for the current month only."),
    "- Never share account details before the customer confirms the email address on the account.",
    "- Escalate outages, data loss, security reports and legal questions to a human agent.",
)
_PRODUCTS = (
    "- CloudDesk Basic: $12 per user per month, 50 GB storage per user, email support.",
    "- CloudDesk Pro: $24 per user per month, 1 TB storage per user, chat support, single sign-on.",
    "- CloudDesk Enterprise: custom pricing, unlimited storage, 24/7 phone support, audit logs.",
    ("- SyncBridge: connects CloudDesk with Google Calendar, Outlook and Slack; included in Pro "
     "and Enterprise."),
    "- Free trial: 14 days of Pro for up to 5 users, no card required.",
)
_GUIDELINES = (
    "- Greet the customer by name when you know it, and keep answers short and concrete.",
    "- Give numbered steps for anything the customer has to do in the app.",
)

_SLACK = 8  # bullet lists overshoot their target a little; this keeps the prompt at ~650

_PLANS = ("Basic", "Pro", "Enterprise")
_OPENERS = (
    "Hi, I was charged twice for my CloudDesk {plan} subscription this month. Order number {order}.",
    "Hello, I'd like a refund for my {plan} plan. I bought it {days} days ago.",
    "I can't log in to my account. It says my password is invalid even after I reset it.",
    "My CloudDesk calendar stopped syncing with {app} since yesterday.",
    "How do I upgrade from {plan} to {plan2} without losing my files?",
    "Can I add {n} more seats to our team plan before the renewal?",
    "How can I export all my documents to a zip file?",
    "Our admin left the company. How do we transfer the admin role to me?",
    "The desktop app shows error {code} when I open a shared folder.",
    "I got an invoice for {n} seats but we only have {m} users.",
    "Is there a discount for nonprofits or schools?",
    "We want to cancel our subscription at the end of this billing period.",
)
_DETAILS = ("I already tried clearing the browser cache.", "This is urgent, my team can't work.",
            "I'm using the mobile app on Android.", "I'm on the desktop app for Windows.",
            "My email is {name}@example.com.", "It started after the last update.",
            "We are on the annual plan.", "I contacted you last week but got no answer.")
_FOLLOWUPS = (
    "Thanks. How long will the refund take?", "I tried that but I still see error {code}.",
    "Okay, that worked. One more question: can I change the billing email?",
    "Can you escalate this to a manager?", "Where do I find that setting on mobile?",
    "Will I lose any data if I do that?", "Does that also apply to the {plan} plan?",
    "Can you send me a confirmation by email?", "How much will that cost per month?",
    "I don't see that option. I'm an admin, does that matter?",
    "Great, thank you. And what happens at renewal?", "Is there a way to do it for all users at once?",
)
_APPS = ("Google Calendar", "Outlook", "Slack")
_GREETINGS = ("Thanks for reaching out{name}!", "Hi{name}, thanks for contacting TechCorp support.",
              "Thanks for the details{name}.", "I'm sorry about the trouble{name}.")
_LATER_GREETINGS = ("Sure.", "Good question.", "Of course.", "Thanks for checking.", "I understand.")
_CLOSINGS = ("Is there anything else I can help you with?",
             "Let me know if the problem continues and I'll take a closer look.",
             "I hope this helps. Have a great day!")


def system_prompt(rng: Rng) -> str:
    """The support system prompt: policy ~200, products ~300, guidelines ~150 tokens."""
    text = TextGen(rng, words.SUPPORT)

    def section(title: str, fixed: tuple[str, ...], tokens: int) -> str:
        head = "\n".join(fixed)
        more = text.bullets(tokens - approx_tokens(title) - approx_tokens(head) - _SLACK)
        return f"{title}\n{head}\n{more}"

    return "\n\n".join((
        _INTRO,
        section("## Company policy", _POLICY, POLICY_TOKENS - approx_tokens(_INTRO)),
        section("## Product information", _PRODUCTS, PRODUCT_TOKENS),
        section("## Response guidelines", _GUIDELINES, GUIDELINE_TOKENS),
    ))


def _slots(rng: Rng, name: str) -> dict[str, object]:
    plan, plan2 = rng.sample(_PLANS, 2)
    m = rng.between(3, 40)
    return {"plan": plan, "plan2": plan2, "order": f"TC-{rng.between(100000, 999999)}",
            "days": rng.between(2, 45), "app": rng.choice(_APPS), "n": m + rng.between(1, 10),
            "m": m, "code": f"E{rng.between(100, 599)}", "name": name.lower()}


def first_message(rng: Rng, name: str) -> str:
    slots = _slots(rng, name)
    text = rng.choice(_OPENERS).format(**slots)
    if rng.chance(0.3):
        text = f"Hi, this is {name}. " + text
    if rng.chance(0.5):
        text += " " + rng.choice(_DETAILS).format(**slots)
    return text


def followup_messages(rng: Rng, name: str, n: int) -> list[str]:
    """``n`` follow-up questions for one conversation (no repeats among any 12 in a row)."""
    chosen: list[str] = []
    while len(chosen) < n:
        chosen += rng.sample(_FOLLOWUPS, n - len(chosen))
    return [f.format(**_slots(rng, name)) for f in chosen]


def reply(rng: Rng, name: str | None, tokens: int, first: bool = True) -> str:
    """An agent reply of about ``tokens`` tokens: greeting, explanation, steps, closing."""
    text = TextGen(rng, words.SUPPORT)
    greetings = _GREETINGS if first else _LATER_GREETINGS
    greet = rng.choice(greetings).format(name=f", {name}" if name else "")
    close = rng.choice(_CLOSINGS)
    body_tokens = max(10, tokens - approx_tokens(greet) - approx_tokens(close))
    explain = text.sentences(max(8, body_tokens // 3))
    steps = text.bullets(max(8, body_tokens - approx_tokens(explain)), marker="1.")
    return f"{greet} {explain}\n\n{steps}\n\n{close}"


def turns_in_session(rng: Rng, mean_turns: int) -> int:
    """About ``mean_turns`` turns: uniform on [ceil(mean/2), mean + mean//2]."""
    return rng.between(max(1, math.ceil(mean_turns / 2)), mean_turns + mean_turns // 2)


def build(p: Params, rng: Rng, prefix: str = "chat") -> list[ChatRequest]:
    """``p.sessions`` conversations of about ``p.turns`` turns each (or sessions until
    ``p.max_requests`` requests, for the mixture), in arrival order."""
    assert p.turns is not None and p.rate is not None
    system = system_prompt(rng.fork("system"))
    draw = rng.fork("sessions")
    session_rate = p.rate / p.turns  # so that requests arrive at about p.rate per second
    out: list[ChatRequest] = []
    start = 0.0
    s = 0
    while (p.max_requests is None and s < (p.sessions or 1)) or \
            (p.max_requests is not None and len(out) < p.max_requests):
        start += draw.expo(session_rate)
        name = draw.choice(words.FIRST_NAMES) if draw.chance(0.6) else None
        n_turns = turns_in_session(draw, p.turns)
        if p.max_requests is not None:
            n_turns = min(n_turns, p.max_requests - len(out))
        user_turns = [first_message(draw, name or draw.choice(words.FIRST_NAMES))]
        user_turns += followup_messages(draw, name or "customer", n_turns - 1)
        history = [msg("system", system)]
        t = start
        for turn, user in enumerate(user_turns):
            messages = history + [msg("user", user)]
            answer = reply(draw, name, draw.lognormal_int(140, 0.35, 40, MAX_TOKENS - 40),
                           first=turn == 0)
            request = answered(messages, answer, max_tokens=MAX_TOKENS, timestamp=t, model=p.model,
                               session_id=f"{prefix}-s{s:04d}")
            out.append(request)
            # Next turn: the whole history, this reply included, is sent again.
            history = messages + [msg("assistant", answer)]
            t += 0.3 + 0.025 * request.output_length + draw.lognormal_int(20, 0.6, 4, 180)
        s += 1
    return finalize(out, prefix)
