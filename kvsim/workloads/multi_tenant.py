"""(d) Multi-tenant SaaS assistant: every tenant sends the same platform system prompt,
and each tenant has its own ``cache_salt`` (``tenant:<id>``, as in the seed article), so
the engines keep tenants' caches apart. About a third of the questions come from a
shared FAQ pool, so identical prompts recur across tenants: what isolation costs."""
from __future__ import annotations

from kvsim.workloads import words
from kvsim.workloads.record import ChatRequest, Turn, single_turns
from kvsim.workloads.registry import Params
from kvsim.workloads.rng import Rng, zipf_weights
from kvsim.workloads.text import TextGen, approx_tokens

MAX_TOKENS = 512
FAQ_SHARE = 0.35
_INTRO = ("You are Nova, the writing and productivity assistant built into the WorkHub platform. "
          "You help the people of the organization you are deployed in write, summarize, plan "
          "and find answers about WorkHub. Be concise, accurate and friendly.")
_SECTIONS = ("## What you can do", "## Tone and style", "## Formatting rules",
             "## Privacy and safety", "## WorkHub facts")
_FAQ = (
    "How do I share a workspace with my team?", "How do I reset my password?",
    "Can I recover a deleted document?", "How do I connect WorkHub to my calendar?",
    "What is the maximum file size I can upload?", "How do I turn off email notifications?",
    "How do I export a board to PDF?", "Can guests edit documents?",
    "How do I change the language of the interface?", "Where can I see my storage usage?",
    "How do I create a recurring task?", "How do I mention a colleague in a comment?",
    "Is there a dark mode?", "How do I move a document to another workspace?",
    "Can I use WorkHub offline?", "How do I set up two-factor authentication?",
    "How do I add a custom field to a board?", "Who can see my private notes?",
    "How do I import tasks from a spreadsheet?", "How do I archive an old project?",
)
_TASKS = (
    "Summarize these meeting notes in three bullet points:\n\n{para}",
    "Write a short, friendly email to {name} about the {adj} {noun}.",
    "Rewrite this paragraph so it is clearer and shorter:\n\n{para}",
    "Give me five title ideas for a report about {nouns} and {nouns2}.",
    "Draft an agenda for a 30-minute meeting about the {adj} {noun}.",
    "Turn these notes into a task list with owners:\n\n{para}",
    "Fix the grammar in this sentence: {sentence}",
)


def tenant_names(n: int) -> list[str]:
    return [f"tenant_{i + 1:03d}" for i in range(n)]


def salt_of(tenant: str) -> str:
    return f"tenant:{tenant}"


def system_prompt(rng: Rng, tokens: int) -> str:
    text = TextGen(rng, words.GENERAL)
    per_section = max(15, (tokens - approx_tokens(_INTRO)) // len(_SECTIONS) - 4)
    return "\n\n".join([_INTRO] + [f"{s}\n{text.bullets(per_section)}" for s in _SECTIONS])


def task(rng: Rng) -> str:
    text = TextGen(rng, words.GENERAL)
    n1, n2 = rng.sample(words.COMMON_NOUNS, 2)
    return rng.choice(_TASKS).format(
        para=text.sentences(rng.lognormal_int(90, 0.5, 20, 400)), name=rng.choice(words.FIRST_NAMES),
        adj=rng.choice(words.COMMON_ADJECTIVES), noun=n1, nouns=n1 + "s", nouns2=n2 + "s",
        sentence=text.sentence())


def answer(rng: Rng, tokens: int) -> str:
    return TextGen(rng, words.GENERAL).paragraphs(tokens, 70)


def build(p: Params, rng: Rng, prefix: str = "mt") -> list[ChatRequest]:
    assert p.tenants is not None and p.system_tokens is not None
    system = system_prompt(rng.fork("system"), p.system_tokens)
    tenants = tenant_names(p.tenants)
    tenant_weights = zipf_weights(len(tenants), 0.8)  # a few large tenants, a long tail
    faq_weights = zipf_weights(len(_FAQ), 1.0)

    def turn(draw: Rng) -> Turn:
        tenant = draw.weighted(tenants, tenant_weights)
        user = draw.weighted(_FAQ, faq_weights) if draw.chance(FAQ_SHARE) else task(draw)
        reply = answer(draw, draw.lognormal_int(160, 0.5, 20, MAX_TOKENS - 60))
        return Turn(system, user, reply, {"tenant": tenant, "cache_salt": salt_of(tenant)})

    return single_turns(p, rng.fork("requests"), prefix, MAX_TOKENS, turn)
