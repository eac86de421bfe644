"""Chat templates: render OpenAI-style messages to the text a serving engine prefills.

The built-ins reproduce the Hugging Face chat templates character for character, with
``add_generation_prompt=True`` (what vLLM and SGLang apply to a chat request):

- ``llama3``: Meta-Llama-3-8B-Instruct ``tokenizer_config.json`` (the template vLLM logs as
  its default for that model)::

    {% set loop_messages = messages %}{% for message in loop_messages %}{% set content =
    '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim
    + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}
    {{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant
    <|end_header_id|>\\n\\n' }}{% endif %}

  (SGLang's ``llama-3-instruct`` template in ``sglang/lang/chat_template.py`` uses the same
  role prefixes and ``<|eot_id|>`` suffix.)
- ``chatml``: ChatML as in Qwen2/2.5 — ``'<|im_start|>' + role + '\\n' + content +
  '<|im_end|>' + '\\n'`` per message, then ``'<|im_start|>assistant\\n'``. No default system
  prompt is inserted (Qwen2.5's own template adds one when the log has none).
- ``mistral``: Mistral-7B-Instruct-v0.1::

    {{ bos_token }}{% for message in messages %}... {% if message['role'] == 'user' %}
    {{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}
    {{ message['content'] + eos_token}}{% endif %}{% endfor %}

  That template has no system role; like mistral-common for its v1 tokenizer, a system
  message is prepended to the next user message followed by a blank line. It has no
  generation prompt: the prompt ends with ``[/INST]``.
- ``plain``: ``role: content`` paragraphs and ``assistant: `` (no special tokens; for the
  ``bytes`` tokenizer or quick experiments).

Any other value is a path: a Jinja template file, or a Hugging Face ``tokenizer_config.json``
(its ``chat_template``, ``bos_token``, ``eos_token`` and added special tokens are used).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

from kvsim.errors import ConfigError

Message = tuple[str, str]  # (role, content)


class RenderedChat(NamedTuple):
    """A rendered prompt, the character offset where each message starts, and its role."""

    text: str
    message_starts_chars: list[int]
    roles: list[str]


class RenderedPieces(NamedTuple):
    """A rendered prompt cut where the template's output for each message begins.

    ``"".join(pieces)`` is the prompt; message *k* starts at character ``starts[k][1]`` of
    piece ``starts[k][0]``. Equal pieces are equal text, whatever their message's position,
    so their tokens can be reused (see :mod:`kvsim.io.tokenize.pieces`).
    """

    pieces: list[str]
    starts: list[tuple[int, int]]
    roles: list[str]

    @property
    def weight(self) -> int:
        """Characters of the prompt (sizes tokenization batches)."""
        return sum(map(len, self.pieces))

    def joined(self) -> RenderedChat:
        """The same rendering as one text."""
        offsets, pos = [], 0
        for piece in self.pieces:
            offsets.append(pos)
            pos += len(piece)
        return RenderedChat("".join(self.pieces), [offsets[k] + c for k, c in self.starts], self.roles)


@dataclass(frozen=True)
class LocalForm:
    """A template that renders each message on its own: ``head`` (when there is a message),
    then each message's piece, then the generation prompt ``tail``. Message 0 starts at the
    head; message *k* at its own piece. Its pieces can be cached per message (see
    :mod:`kvsim.io.tokenize.message_tokens`).

    ``parts(role, content)`` gives a message's piece as (template text before, the message
    text, template text after), so that an assistant message's text can be matched with the
    reply it repeats."""

    head: str
    parts: Callable[[str, str], tuple[str, str, str]]
    tail: str

    def message(self, role: str, content: str) -> str:
        """The piece of one message."""
        return "".join(self.parts(role, content))

    def render_pieces(self, messages: Sequence[Message]) -> RenderedPieces:
        head = [self.head] if self.head else []
        pieces = [*head, *[self.message(role, content) for role, content in messages], self.tail]
        first = len(head)
        starts = [(0, 0), *[(first + k, 0) for k in range(1, len(messages))]] if messages else []
        return RenderedPieces(pieces, starts, [r for r, _ in messages])


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    bos: str                      # what starts every prompt (also prepended to completions)
    eot: str                      # appended to a generated reply (end of the assistant turn)
    special_tokens: tuple[str, ...]
    render_pieces: Callable[[Sequence[Message]], RenderedPieces] = field(compare=False)
    local: LocalForm | None = field(default=None, compare=False)  # when each message renders alone

    def render(self, messages: Sequence[Message]) -> RenderedChat:
        """The prompt text with the generation prompt appended, and where each message starts."""
        return self.render_pieces(messages).joined()


def _local(name: str, bos: str, eot: str, specials: tuple[str, ...], form: LocalForm) -> ChatTemplate:
    return ChatTemplate(name, bos, eot, specials, form.render_pieces, form)


# bos_token + content for the first message: the BOS is a piece of its own, owned by message 0
_LLAMA3 = LocalForm("<|begin_of_text|>",
                    lambda role, content: (f"<|start_header_id|>{role}<|end_header_id|>\n\n", content.strip(),
                                           "<|eot_id|>"),
                    "<|start_header_id|>assistant<|end_header_id|>\n\n")
_CHATML = LocalForm("", lambda role, content: (f"<|im_start|>{role}\n", content, "<|im_end|>\n"),
                    "<|im_start|>assistant\n")
_PLAIN = LocalForm("", lambda role, content: (f"{role}: ", content, "\n\n"), "assistant: ")


def _mistral(messages: Sequence[Message]) -> RenderedPieces:
    pieces: list[str] = ["<s>"]
    starts: list[tuple[int, int]] = [(0, 0)] * len(messages)
    pending: list[tuple[int, str]] = []  # system messages waiting for the next user turn

    def place_pending() -> None:
        # the first waiting system message starts with its turn, the others at their text
        offset = 0
        for k, (j, text) in enumerate(pending):
            starts[j] = (len(pieces), offset)
            offset = (offset or len("[INST] ")) + len(text) + 2

    for j, (role, content) in enumerate(messages):
        if role == "system":
            # mistral-common (v1 tokenizer): the system prompt goes in front of the next
            # user turn, followed by a blank line.
            pending.append((j, content))
            continue
        if role == "assistant":
            starts[j] = (len(pieces), 0)
            pieces.append(content + "</s>")
            continue
        # user, and any other role, speaks as the user
        head = "[INST] " + "".join(text + "\n\n" for _, text in pending)
        place_pending()
        starts[j] = (len(pieces), len(head) if pending else 0)
        pieces.append(head + content + " [/INST]")
        pending.clear()
    if pending:  # system message(s) with no user turn after them
        place_pending()
        pieces.append("[INST] " + "\n\n".join(text for _, text in pending) + " [/INST]")
    if starts:
        starts[0] = (0, 0)  # the first message owns the BOS token
    return RenderedPieces(pieces, starts, [r for r, _ in messages])


BUILTIN: dict[str, ChatTemplate] = {
    "llama3": _local("llama3", "<|begin_of_text|>", "<|eot_id|>",
                     ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                      "<|end_of_text|>"), _LLAMA3),
    "chatml": _local("chatml", "", "<|im_end|>", ("<|im_start|>", "<|im_end|>", "<|endoftext|>"), _CHATML),
    "mistral": ChatTemplate("mistral", "<s>", "</s>", ("<s>", "</s>", "[INST]", "[/INST]"), _mistral),
    "plain": _local("plain", "", "", (), _PLAIN),
}


# ---------------------------------------------------------------------------- Jinja files
_SPECIAL_LIKE = re.compile(r"<\|[^<>|\s]{1,64}\|>|</?s>|\[/?[A-Z][A-Z_]{1,30}\]")


def _token_text(value: Any) -> str:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def load_template_file(path: str) -> ChatTemplate:
    """A Jinja chat template file, or the chat template of a ``tokenizer_config.json``."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"unknown chat template {path!r}: use llama3, chatml, mistral, plain, "
                          "or the path of a Jinja template / tokenizer_config.json")
    try:
        source = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read chat template {p}: {e}") from None
    bos = eos = ""
    specials: list[str] = []
    if p.suffix == ".json":
        try:
            cfg = json.loads(source)
        except ValueError as e:
            raise ConfigError(f"{p}: invalid JSON ({e})") from None
        tmpl = cfg.get("chat_template") if isinstance(cfg, dict) else None
        if isinstance(tmpl, list):  # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in tmpl if isinstance(t, dict)}
            tmpl = named.get("default") or next(iter(named.values()), None)
        if not isinstance(tmpl, str):
            raise ConfigError(f"{p} has no chat_template")
        source = tmpl
        bos, eos = _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token"))
        added = cfg.get("added_tokens_decoder") or {}
        if isinstance(added, dict):
            specials += [_token_text(t) for t in added.values() if isinstance(t, dict) and t.get("special")]
    specials += _SPECIAL_LIKE.findall(source) + [bos, eos]
    specials = [s for s in dict.fromkeys(specials) if s]
    eot = eos or next((t for t in ("<|eot_id|>", "<|im_end|>", "<|end|>", "</s>") if t in source), "")
    render = _jinja_renderer(source, bos, eos, str(p))
    return ChatTemplate(str(p), bos, eot, tuple(specials), render)


def _jinja_renderer(source: str, bos: str, eos: str, name: str) -> Callable[[Sequence[Message]], RenderedPieces]:
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ConfigError("Jinja chat templates need the optional package 'jinja2' "
                          "(pip install 'kvsim[jinja]')") from None

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    # Hugging Face renders chat templates with these settings (transformers' chat_template_utils).
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    try:
        template = env.from_string(source)
    except TemplateError as e:
        raise ConfigError(f"chat template {name}: {e}") from None

    def run(messages: Sequence[Message], generation: bool) -> str:
        return template.render(messages=[{"role": r, "content": c} for r, c in messages],
                               add_generation_prompt=generation, bos_token=bos, eos_token=eos)

    def render(messages: Sequence[Message]) -> RenderedPieces:
        try:
            text = run(messages, True)
            # A message starts where the rendering of the messages before it stops matching.
            starts = [0]
            for k in range(1, len(messages)):
                prefix = run(messages[:k], False)
                starts.append(max(starts[-1], _common_prefix(prefix, text)))
        except TemplateError as e:
            raise TemplateRenderError(str(e)) from None
        except Exception as e:  # noqa: BLE001 - a user template can fail in any way
            raise TemplateRenderError(f"{type(e).__name__}: {e}") from None
        # one piece per message (its whole rendering depends on the template: cut the text)
        cuts = starts[:1] + [s for a, s in zip(starts, starts[1:]) if s > a] if messages else [0]
        pieces = [text[a:b] for a, b in zip(cuts, cuts[1:] + [len(text)])]
        index = {c: k for k, c in enumerate(cuts)}
        return RenderedPieces(pieces, [(index[s], 0) for s in starts] if messages else [],
                              [r for r, _ in messages])

    return render


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class TemplateRenderError(Exception):
    """A template refused or failed to render a record's messages."""


def get_template(name: str) -> ChatTemplate:
    """A built-in template by name, or a Jinja template / tokenizer_config.json by path."""
    if name in BUILTIN:
        return BUILTIN[name]
    return load_template_file(name)


def render_chat(messages: Sequence[Message] | Sequence[dict], template: str | ChatTemplate = "llama3") -> RenderedChat:
    """Render messages (``(role, content)`` pairs or ``{"role", "content"}`` dicts) with the
    generation prompt appended, exactly as the engine's chat template does."""
    tmpl = get_template(template) if isinstance(template, str) else template
    msgs = [(m["role"], m["content"]) if isinstance(m, dict) else (m[0], m[1]) for m in messages]
    return tmpl.render(msgs)
