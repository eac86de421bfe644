"""(e) Multi-LoRA: teams run their own LoRA adapter over the same base prompts.

A few task prompts (triage, summary, field extraction) are shared by all teams and the
tickets come from one pool, so the same prompt text is often sent under different
adapters. The engines key cached blocks by adapter, so those never share: the cost of
serving many adapters on one base model."""
from __future__ import annotations

import string

from kvsim.workloads import support_chat, words
from kvsim.workloads.record import ChatRequest, Turn, single_turns
from kvsim.workloads.registry import Params
from kvsim.workloads.rng import Rng, zipf_weights
from kvsim.workloads.text import TextGen, approx_tokens

MAX_TOKENS = 256
_TASKS = (
    ("Ticket triage", ("Classify the support ticket into one of: billing, login, sync, bug, "
                       "feature request, other. Reply with the label, a confidence from 0 to 1, "
                       "and one sentence of justification.")),
    ("Ticket summary", ("Summarize the support ticket for the on-call engineer in at most three "
                        "sentences: what is broken, for whom, and since when.")),
    ("Field extraction", ("Extract the customer name, plan, order number, error code and product "
                          "area from the ticket. Reply with a JSON object; use null for missing "
                          "fields.")),
)


def adapter_names(n: int) -> list[str]:
    """``team_a_lora``, ``team_b_lora``, ... (as in the seed article), then ``team_027_lora``..."""
    letters = string.ascii_lowercase
    return [f"team_{letters[i]}_lora" if i < 26 else f"team_{i + 1:03d}_lora" for i in range(n)]


def base_prompts(rng: Rng, tokens: int) -> list[str]:
    """One system prompt per task, each about ``tokens`` tokens."""
    out = []
    for i, (title, rule) in enumerate(_TASKS):
        text = TextGen(rng.fork(f"task{i}"), words.SUPPORT)
        head = f"You are the {title.lower()} model of the TechCorp support pipeline. {rule}"
        out.append(f"{head}\n\n## Guidelines\n{text.bullets(max(15, tokens - approx_tokens(head) - 4))}")
    return out


def tickets(rng: Rng, n: int) -> list[str]:
    """A pool of ``n`` customer tickets, shared by all teams."""
    out = []
    for i in range(n):
        name = rng.choice(words.FIRST_NAMES)
        body = support_chat.first_message(rng, name)
        extra = TextGen(rng, words.SUPPORT).sentences(rng.lognormal_int(60, 0.6, 10, 300))
        out.append(f"Ticket #{40000 + i} from {name}:\n{body} {extra}")
    return out


_LABELS = ("billing", "login", "sync", "bug", "feature request", "other")


def task_reply(rng: Rng, task: int) -> str:
    """What the adapter answered: a label, a summary or a JSON object, by task."""
    text = TextGen(rng, words.SUPPORT)
    if task == 0:
        return (f"Label: {rng.choice(_LABELS)}\nConfidence: {rng.between(55, 99) / 100}\n"
                f"Reason: {text.sentence()}")
    if task == 1:
        return text.sentences(rng.lognormal_int(60, 0.4, 15, 150))
    name = rng.choice(words.FIRST_NAMES)
    plan = rng.choice(('"Basic"', '"Pro"', '"Enterprise"', "null"))
    order = rng.choice((f'"TC-{rng.between(100000, 999999)}"', "null"))
    error = rng.choice((f'"E{rng.between(100, 599)}"', "null"))
    area = rng.choice(_LABELS)
    return (f'{{"customer_name": "{name}", "plan": {plan}, "order_number": {order}, '
            f'"error_code": {error}, "product_area": "{area}"}}')


def build(p: Params, rng: Rng, prefix: str = "lora") -> list[ChatRequest]:
    assert p.requests is not None and p.adapters is not None and p.system_tokens is not None
    prompts = base_prompts(rng.fork("system"), p.system_tokens)
    adapters = adapter_names(p.adapters)
    adapter_weights = zipf_weights(len(adapters), 0.7)
    pool = tickets(rng.fork("tickets"), max(8, p.requests // 3))

    def turn(draw: Rng) -> Turn:
        adapter = draw.weighted(adapters, adapter_weights)
        task = draw.below(len(prompts))
        reply = task_reply(draw, task)
        return Turn(prompts[task], draw.choice(pool), reply, {"lora": adapter})

    return single_turns(p, rng.fork("requests"), prefix, MAX_TOKENS, turn)
