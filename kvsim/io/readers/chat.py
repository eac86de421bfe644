"""OpenAI chat request logs: ``{"messages": [{"role", "content"}, ...], ...}``.

The messages are rendered with the chat template (generation prompt appended) and the text
is tokenized; the logged reply, when present, becomes the known output tokens.

Large files take a fast path: a compiled scanner (:mod:`kvsim.io.readers.chat_scan`) finds each
line's messages, each distinct message (by the raw bytes of its JSON) is parsed and rendered
once, and only the rest of the line goes through the JSON parser and the usual field
validation. With a per-message template (llama3, chatml) each distinct message is also
tokenized once and prompts are assembled from their messages' tokens
(:mod:`kvsim.io.tokenize.message_tokens`). A line the scanner does not take, or whose messages or
rest are not the plain case, is read by the general reader, which also writes the error.
"""
from __future__ import annotations

from typing import Any, ClassVar

from kvsim.io.tokenize.encode import PendingRequest
from kvsim.io.fields import BadRecord, common_fields, kind
from kvsim.io.tokenize.message_tokens import MAX_HELD_CHARS, MessageTokens
from kvsim.io.readers.base import JsonRequestReader, LoadContext, message_text
from kvsim.io.source import UTF8_BOM, Source, plain_json_bytes

_UNSEEN = object()


def parse_messages(value: Any, ctx: LoadContext, key: str = "messages") -> list[tuple[str, str]]:
    """Validate OpenAI-style messages into (role, content) pairs."""
    if value is None:
        raise BadRecord(f"missing {key}")
    if not isinstance(value, list):
        raise BadRecord(f"{key} must be a list, got {kind(value)}")
    if not value:
        raise BadRecord(f"{key} is empty")
    out = []
    for i, m in enumerate(value):
        plain = _plain_message(m)
        out.append(plain if plain is not None else _message(m, f"{key}[{i}]", ctx))
    return out


def _plain_message(m: Any) -> tuple[str, str] | None:
    """(role, content) of the common case (checked without building the error context)."""
    if type(m) is dict:
        role, content = m.get("role"), m.get("content")
        if type(role) is str and role and type(content) is str and not m.get("tool_calls"):
            return role, content
    return None


def _message(m: Any, where: str, ctx: LoadContext) -> tuple[str, str]:
    if not isinstance(m, dict):
        raise BadRecord(f"{where} must be an object, got {kind(m)}")
    role = m.get("role")
    if not isinstance(role, str) or not role:
        raise BadRecord(f"{where} has no role" if role is None else f"{where}.role must be a string")
    if "content" not in m and not m.get("tool_calls"):
        raise BadRecord(f"{where} has no content")
    if m.get("tool_calls"):
        ctx.count("assistant tool calls are not rendered (only message text is)")
    return role, message_text(m.get("content"), where, ctx)


class ChatReader(JsonRequestReader):
    name = "chat"
    #: files at least this large (bytes on disk) take the compiled fast path
    fast_min_bytes: ClassVar[int] = 1 << 20

    def __init__(self) -> None:
        self._store: MessageTokens | None | bool = False  # False: not decided yet
        self._forget()

    def _forget(self) -> None:
        # a message's key (kvsim.io.readers.chat_scan) -> (role, content, handle of its piece or None,
        # the piece's characters), or None when it is not the plain case (its lines are read by
        # the general reader)
        self._seen: dict[tuple[int, int], tuple[str, str, int | None, int] | None] = {}
        # the key of a line's first j messages -> their roles, handles (or (role, content) pairs)
        # and the characters of their pieces
        self._prefixes: dict[tuple[int, int], tuple[list, list, int]] = {}
        self._held = 0  # bytes held by the two

    @classmethod
    def matches(cls, record: Any) -> bool:
        return isinstance(record, dict) and "messages" in record

    def requests(self, rec: dict, line: int, src: Source, ctx: LoadContext) -> list[PendingRequest]:
        messages = parse_messages(rec.get("messages"), ctx)
        fields = common_fields(rec)
        return [self.pending(fields, ctx, reply_eot=True, **self._prompt(messages, ctx))]

    def _prompt(self, messages: list[tuple[str, str]], ctx: LoadContext) -> dict[str, Any]:
        store = self.store(ctx)
        refs = None if store is None else store.render(messages)
        if refs is None:
            return self.chat_prompt(messages, ctx)
        ctx.used_template = True
        return dict(prompt_pieces=refs, msg_roles=ctx.builder.roles.codes([r for r, _ in messages]))

    def store(self, ctx: LoadContext) -> MessageTokens | None:
        """Where each distinct message's tokens are kept (None: the template or tokenizer
        does not allow prompts to be assembled from messages)."""
        if self._store is False:
            form, pieces = ctx.template.local, ctx.pieces
            usable = pieces is not None and MessageTokens.usable(form, pieces.specials)
            self._store = MessageTokens(ctx.tokenizer, form, pieces.specials, pieces) if usable else None
        return self._store

    def piece_encoder(self, ctx: LoadContext) -> Any:
        store = self.store(ctx)
        return ctx.pieces if store is None else store

    def _flush(self, batch: list[PendingRequest], ctx: LoadContext, last: bool = False) -> None:
        super()._flush(batch, ctx, last)
        store = self._store
        if self._held + (store.held if store else 0) > MAX_HELD_CHARS:
            self._store = False  # queued batches keep the old store
            self._forget()

    def read(self, src: Source, ctx: LoadContext) -> None:
        if src.size < self.fast_min_bytes or src.first_char() != "{" or not self._read_fast(src, ctx):
            super().read(src, ctx)

    # -- the fast path --------------------------------------------------------------------
    def _read_fast(self, src: Source, ctx: LoadContext) -> bool:
        from kvsim.io.readers.chat_scan import ChatScan, LineLists

        lists = LineLists()  # the message lists of the lines scanned so far
        return self.read_scanned(src, ctx, lambda block: ChatScan(block, lists), self._fast_requests, ahead=True)

    def _fast_requests(self, block, scan, k: int, line: int, ctx: LoadContext) -> list[PendingRequest] | None:
        """The request of a scanned line, or None if the general reader must read it."""
        rest = scan.rest(k)
        if line == 1 and rest.startswith(UTF8_BOM):
            return None
        try:
            rec = plain_json_bytes(rest)
            if type(rec) is not dict:
                return None
            fields = common_fields(rec)
        except BadRecord:
            return None
        store = self.store(ctx)
        found = self._messages(scan, k, store, ctx)
        if found is None:
            return None
        roles, parts, chars = found
        if store is None:
            try:
                prompt = self.chat_prompt(parts, ctx)
            except BadRecord:
                return None
        else:
            prompt = dict(prompt_pieces=store.prompt(parts, chars), msg_roles=roles)
            ctx.used_template = True
        return [self.pending(fields, ctx, reply_eot=True, **prompt)]

    def _messages(self, scan, k: int, store: MessageTokens | None, ctx: LoadContext) -> tuple[list, list, int] | None:
        """Line k's messages, reusing the longest sequence of them seen before: their role
        codes, piece handles and the characters of those pieces, or without a store their role
        names and (role, content) pairs (and 0); None if a message is not the plain case."""
        prefixes = self._prefixes
        # the longest prefix that was a whole line's messages, as scanned, and what follows it
        j, key, rows, whole = scan.history(k)
        known = prefixes.get(key) if j else None
        if j and known is None:  # that line was not read here (or was forgotten): a shorter one
            while known is None and j > 1:
                j -= 1
                known = prefixes.get(scan.first_key(k, j))
            rows = [row[:4] for row in scan.elements(k)[j if known is not None else 0:]]
        if not rows:
            return known
        seen, data = self._seen, scan.data
        names, parts, chars = [], [], 0
        for start, end, key1, key2 in rows:
            m = seen.get((key1, key2), _UNSEEN)
            if m is _UNSEEN:
                m = seen[key1, key2] = self._parse_message(data[start:end], store)
                self._held += end - start
            if m is None:
                return None
            names.append(m[0])
            if store is None:
                parts.append((m[0], m[1]))
            else:
                parts.append(m[2])
                chars += m[3]
        if store is not None:  # coded once the line is sure to be read here, in order of appearance
            names = ctx.builder.roles.codes(names)
        found = ((names, parts, chars) if known is None
                 else ([*known[0], *names], [*known[1], *parts], known[2] + chars))
        prefixes[whole] = found
        self._held += 16 * len(found[1])
        return found

    @staticmethod
    def _parse_message(raw: bytes, store: MessageTokens | None) -> tuple[str, str, int | None, int] | None:
        """(role, content, the handle of its piece and the piece's characters), or None if
        the message is not the plain case or its piece cannot be cut apart."""
        m = plain_json_bytes(raw)
        plain = _plain_message(m)
        if plain is None:
            return None
        if store is None:
            return (*plain, None, 0)
        h = store.message(*plain)
        return None if h is None else (*plain, h, store.chars[h])
