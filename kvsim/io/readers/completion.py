"""Completion logs: ``{"prompt": "...", ...}`` (a prompt given as token ids is read as such).

Like the engine's tokenizer (``add_special_tokens=True``), the prompt starts with the chat
template's BOS token (Llama 3: ``<|begin_of_text|>``, Mistral: ``<s>``, ChatML: none).
"""
from __future__ import annotations

from typing import Any

from kvsim.io.tokenize.encode import PendingRequest
from kvsim.io.fields import BadRecord, common_fields, kind, token_ids
from kvsim.io.readers.base import JsonRequestReader, LoadContext
from kvsim.io.source import Source


class CompletionReader(JsonRequestReader):
    name = "completion"

    @classmethod
    def matches(cls, record: Any) -> bool:
        return isinstance(record, dict) and "prompt" in record

    def requests(self, rec: dict, line: int, src: Source, ctx: LoadContext) -> list[PendingRequest]:
        prompt = rec.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # OpenAI allows a batch of one
        fields = common_fields(rec)
        if isinstance(prompt, list):
            return [self.pending(fields, ctx, prompt_ids=token_ids(prompt, "prompt"))]
        if prompt is None:
            raise BadRecord("missing prompt")
        if not isinstance(prompt, str):
            raise BadRecord(f"prompt must be a string, got {kind(prompt)}")
        if not prompt:
            raise BadRecord("prompt is empty")
        bos = ctx.template.bos
        if bos:
            ctx.count(f"completion prompts start with the template's BOS token {bos}, as the "
                      "engine's tokenizer adds it")
        ctx.used_template = ctx.used_template or bool(bos)
        return [self.pending(fields, ctx, prompt_text=bos + prompt)]
