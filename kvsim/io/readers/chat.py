"""OpenAI chat request logs: ``{"messages": [{"role", "content"}, ...], ...}``.

The messages are rendered with the chat template (generation prompt appended) and the text
is tokenized; the logged reply, when present, becomes the known output tokens.

Large files take a fast path, without compiled code:

1. msgspec decodes each line with its messages left raw (one ``Raw`` per message, the bytes of
   its JSON) and the usual fields typed as :func:`kvsim.io.fields.plain_fields` takes them; a
   line with other fields has them decoded as a dict and checked by ``common_fields``.
2. Turn k+1 resends turn k's messages: the line's messages but the last two, joined, are
   looked up among the earlier lines' (kept by their count, byte length and last message,
   compared byte for byte), and only the messages after them are looked at.
3. Each distinct message (by its bytes) is parsed and rendered once; with a per-message
   template (llama3, chatml) each distinct piece is also tokenized once and prompts are
   assembled from their pieces' tokens (:mod:`kvsim.io.tokenize.message_tokens`).

A line that is not the plain case (bad JSON, a message that is not a role and a text, ...) is
read by the general reader, which also writes the error.
"""
from __future__ import annotations

import functools
import math
from typing import Annotated, Any, Callable, ClassVar, NamedTuple

from kvsim.io.tokenize.encode import PendingRequest
from kvsim.io.fields import MAX_LENGTH, BadRecord, CommonFields, common_fields, kind
from kvsim.io.tokenize.message_tokens import MAX_HELD_CHARS, MessageTokens
from kvsim.io.readers.base import JsonRequestReader, LoadContext, message_text
from kvsim.io.source import UTF8_BOM, Source, _msgspec_decode, block_buffer, plain_json_bytes

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
        # a message's JSON bytes -> (role, content, handle of its piece or None, the piece's
        # characters), or None when it is not the plain case (its lines are read by the general
        # reader)
        self._seen: dict[bytes, tuple[str, str, int | None, int] | None] = {}
        # a line's messages, by (count, byte length, last message's bytes) -> (their bytes
        # joined, role codes, handles (or (role, content) pairs), the characters of their
        # pieces); taken out when a later line extends them
        self._lists: dict[tuple[int, int, bytes], tuple[bytes, list, list, int]] = {}
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
        """Read the file line by line, each line's messages left as raw JSON (see the module
        docstring). False (and nothing read) if the first record is not one this path takes:
        the general reader then reads the whole file, so that its special cases for a first
        line (one pretty-printed JSON document) still apply."""
        decoders, store = _decoders(), self.store(ctx)
        batch: list[PendingRequest] = []
        weight = 0
        started = False
        limited = ctx.limit is not None
        line = 0  # (counted here: the blocks of a plain file come unnumbered)
        for _, block in src.line_blocks(numbered=False):
            data = block_buffer(block)
            view, find = memoryview(data), data.find
            pos, end = 0, len(block)
            while pos < end and not (limited and ctx.full()):
                stop = find(b"\n", pos, end)
                if stop < 0:
                    stop = end
                raw = view[pos:stop]
                start, pos = pos, stop + 1
                line += 1
                req = None if line == 1 and raw[:3] == UTF8_BOM else self._fast_request(raw, decoders, store, ctx)
                if req is not None:
                    started = True
                    ctx.requests += 1
                    batch.append(req)
                    weight += req.weight
                    if self._full(batch, weight, ctx):
                        batch, weight = [], 0
                        store = self.store(ctx)  # (a new one once the reader has forgotten what it held)
                    continue
                if not started:
                    if not bytes(raw).strip():
                        continue  # a blank line before the first record
                    return False
                whole = view[start:min(stop + 1, end)]     # with its newline, as the general reader reads a line
                reqs = self.general_requests(bytes(whole), line, src, ctx)
                if reqs is not None:
                    batch, weight = self._take(reqs, batch, weight, ctx)
                    store = self.store(ctx)
            if ctx.full():
                break
        if batch:
            self._flush(batch, ctx, last=True)
        return True

    def _fast_request(self, raw: memoryview, decoders: _Decoders, store: MessageTokens | None,
                      ctx: LoadContext) -> PendingRequest | None:
        """The request of a line, or None if the general reader must read it."""
        try:
            rec = decoders.plain(raw)  # the usual fields only, each of its plain type (fields.plain_fields)
        except decoders.invalid:  # another field, another type, or no messages array
            return self._fast_request_any(raw, decoders, store, ctx)
        except decoders.malformed:
            return None
        if store is None or not rec.messages:
            rest = {k: getattr(rec, k) for k in rec.__struct_fields__}
            rest["messages"] = 0
            return self._request(rest, rec.messages, store, ctx)
        found = self._messages(rec.messages, store, ctx)
        if found is None:
            return None
        ctx.used_template = True
        if rec.model is not None:
            ctx.models.add(rec.model)
        t = rec.timestamp
        return PendingRequest(prompt_pieces=store.prompt(found[1], found[2]), msg_roles=found[0], reply=rec.response,
                              reply_eot=True, logged_output=rec.output_length, max_tokens=rec.max_tokens,
                              arrival=math.nan if t is None else t, request_id=rec.request_id,
                              session=ctx.builder.categories["session"].code(rec.session_id))

    def _fast_request_any(self, raw: memoryview, decoders: _Decoders, store: MessageTokens | None,
                          ctx: LoadContext) -> PendingRequest | None:
        """The request of a line with other fields (their values decoded as a dict)."""
        try:
            members = decoders.members(raw)
            elems = decoders.elements(members.pop("messages"))
            rest = {k: decoders.value(v) for k, v in members.items()}
        except Exception:  # noqa: BLE001 (msgspec's errors, no messages: the general reader decides)
            return None
        rest["messages"] = 0
        return self._request(rest, elems, store, ctx)

    def _request(self, rest: dict, elems: list, store: MessageTokens | None, ctx: LoadContext) -> PendingRequest | None:
        """The request of a line's other fields (``rest``, its messages replaced by 0) and its
        raw messages ``elems``, or None."""
        if not elems:
            return None
        try:
            fields = common_fields(rest)
        except BadRecord:
            return None
        found = self._messages(elems, store, ctx)
        return None if found is None else self._request_of(fields, found, store, ctx)

    def _request_of(self, fields: CommonFields, found: tuple[list, list, int], store: MessageTokens | None,
                    ctx: LoadContext) -> PendingRequest | None:
        roles, parts, chars = found
        if store is None:
            try:
                prompt = self.chat_prompt(parts, ctx)
            except BadRecord:
                return None
        else:
            prompt = dict(prompt_pieces=store.prompt(parts, chars), msg_roles=roles)
            ctx.used_template = True
        return self.pending(fields, ctx, reply_eot=True, **prompt)

    def _messages(self, elems: list, store: MessageTokens | None, ctx: LoadContext) -> tuple[list, list, int] | None:
        """A line's messages (raw JSON), reusing an earlier line's messages it starts with:
        their role codes, piece handles and the characters of those pieces, or without a store
        their role names and (role, content) pairs (and 0); None if a message is not the plain
        case."""
        n = len(elems)
        joined = b"".join(elems)
        known = None
        j = 0
        if n > 2:  # the turn before, resent: all but its reply and the new question
            j = n - 2
            size = len(joined) - len(elems[-1]) - len(elems[-2])
            key = (j, size, bytes(elems[j - 1]))
            known = self._lists.get(key)
            # the same bytes, every one: the same messages (a kept line's messages are JSON
            # objects, and an object's bytes decide where it ends)
            if known is not None and joined.startswith(known[0]):
                del self._lists[key]
                self._held -= size
            else:
                known, j = None, 0
        seen = self._seen
        names, parts, chars = [], [], 0
        b = b""
        for e in elems[j:] if j else elems:
            b = bytes(e)
            m = seen.get(b, _UNSEEN)
            if m is _UNSEEN:
                m = seen[b] = self._parse_message(b, store)
                self._held += len(b)
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
                 else ([*known[1], *names], [*known[2], *parts], known[3] + chars))
        self._lists[n, len(joined), b] = (joined, *found)
        self._held += len(joined)
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


class _Decoders(NamedTuple):
    plain: Callable      # a line holding only the usual fields: a _PlainLine, messages left raw
    members: Callable    # any line: its top-level values left raw
    elements: Callable   # a messages array: its elements left raw
    value: Callable      # any JSON value
    invalid: type        # what ``plain`` raises for a line of another shape
    malformed: type      # what every decoder raises for bytes that are not JSON


@functools.lru_cache(maxsize=1)
def _decoders() -> _Decoders:
    import msgspec

    # A chat line with the usual fields only (fields._PLAIN_KEYS), each of the type that
    # fields.plain_fields takes as it is (msgspec checks them; any other line raises
    # ValidationError); its messages left raw.
    text = Annotated[str, msgspec.Meta(min_length=1)]
    length = Annotated[int, msgspec.Meta(ge=0, le=MAX_LENGTH)]
    members = [("messages", list[msgspec.Raw]), ("model", text | None, None), ("timestamp", float | None, None),
               ("session_id", text | None, None), ("request_id", text | None, None),
               ("max_tokens", length | None, None), ("output_length", length | None, None),
               ("response", str | None, None), ("prompt", Any, None), ("prompt_token_ids", Any, None)]
    plain_line = msgspec.defstruct("PlainLine", members, forbid_unknown_fields=True)
    return _Decoders(msgspec.json.Decoder(plain_line).decode, msgspec.json.Decoder(dict[str, msgspec.Raw]).decode,
                     msgspec.json.Decoder(list[msgspec.Raw]).decode, _msgspec_decode(), msgspec.ValidationError,
                     msgspec.DecodeError)
