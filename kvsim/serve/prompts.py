"""From a request body to prompt token ids, exactly as ``kvsim simulate`` reads a chat or
completion log: the same message parsing (``io/readers/chat.py``), the same chat template
(``io/templates.py``, generation prompt appended), the same tokenizer with the template's
special tokens as single ids (``io/tokenizers.py``), and for a completion the template's
BOS token in front of a text prompt (``io/readers/completion.py``)."""
from __future__ import annotations

from typing import Any

from kvsim.io.fields import BadRecord
from kvsim.io.readers.base import LoadContext
from kvsim.io.readers.chat import parse_messages
from kvsim.io.tokenize.templates import TemplateRenderError
from kvsim.serve.errors import ApiError


class Prompter:
    """Renders and tokenizes prompts with one tokenizer and chat template."""

    def __init__(self, tokenizer: str = "cl100k_base", chat_template: str = "llama3") -> None:
        self._ctx = LoadContext(tokenizer_name=tokenizer, template_name=chat_template)
        self.template = self._ctx.template
        self.tokenizer = self._ctx.tokenizer      # loads now: a bad name fails at start-up
        self.eot_id = self._ctx.eot_id

    def chat(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of the rendered chat prompt."""
        try:
            pairs = parse_messages(messages, self._ctx)
        except BadRecord as e:
            raise ApiError(str(e), param="messages") from None
        try:
            rendered = self.template.render(pairs)
        except TemplateRenderError as e:
            raise ApiError(f"chat template {self.template.name} cannot render these messages: {e}",
                           param="messages") from None
        return self.tokenizer.encode(rendered.text)

    def completion(self, prompt: Any) -> list[int]:
        """Token ids of a completion prompt (a text, or token ids given by the client)."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if prompt is None:
            raise ApiError("Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
        if isinstance(prompt, list):
            if not prompt:
                raise ApiError("prompt is empty", param="prompt")
            if not all(isinstance(t, int) for t in prompt):
                raise ApiError(f"kvsim serve answers one prompt per request, got a batch of {len(prompt)}",
                               param="prompt")
            return list(prompt)
        if not prompt:
            raise ApiError("prompt is empty", param="prompt")
        return self.tokenizer.encode(self.template.bos + prompt)
