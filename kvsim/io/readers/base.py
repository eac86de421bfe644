"""The reader interface and the state shared while loading (options, bad-line policy,
tokenizer and template, the trace builder)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Iterator, Mapping


from kvsim.errors import InputError
from kvsim.io.trace.builder import TraceBuilder
from kvsim.io.tokenize.encode import PendingRequest, encode_requests, plan_requests
from kvsim.io.fields import BadRecord, CommonFields, kind, require_object
from kvsim.io.tokenize.pieces import PieceEncoder, cut_strings
from kvsim.io.source import Source
from kvsim.io.tokenize.templates import ChatTemplate, get_template
from kvsim.io.tokenize.tokenizers import Tokenizer, get_tokenizer


@dataclass
class LoadContext:
    """Options and shared state of one ``load_trace`` call."""

    tokenizer_name: str = "cl100k_base"
    template_name: str = "llama3"
    block_size: int = 512
    on_error: str = "fail"
    limit: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    builder: TraceBuilder = field(default_factory=TraceBuilder)
    source_index: int = 0
    skipped: int = 0                          # bad lines skipped in the current file
    requests: int = 0                         # requests read so far (all files)
    batches: int = 0                          # batches handed to tokenization so far
    notes: list[str] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)  # aggregated notes: text -> count
    used_tokenizer: bool = False
    used_template: bool = False
    hash_block_sizes: list[int] = field(default_factory=list)
    models: set[str] = field(default_factory=set)
    recorded: dict[str, Any] | None = None  # meta stored with a converted trace (Parquet)
    executor: ThreadPoolExecutor | None = None
    _tokenizer: Tokenizer | None = None
    _template: ChatTemplate | None = None
    _pieces: PieceEncoder | None | bool = False  # False: not decided yet
    #: tokenize chat prompts piece by piece, each distinct piece once (see kvsim.io.tokenize.pieces)
    piecewise: ClassVar[bool] = True

    # -- lazily loaded: a hash-id trace needs neither ------------------------------------
    @property
    def template(self) -> ChatTemplate:
        if self._template is None:
            self._template = get_template(self.template_name)
        return self._template

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            self._tokenizer = get_tokenizer(self.tokenizer_name, self.template.special_tokens)
        return self._tokenizer

    @property
    def pieces(self) -> PieceEncoder | None:
        """The piece-by-piece encoder, or None where prompts are tokenized whole."""
        if self._pieces is False:
            specials = cut_strings(self.tokenizer) if self.piecewise else None
            self._pieces = None if specials is None else PieceEncoder(self.tokenizer, specials)
        return self._pieces

    @property
    def eot_id(self) -> int | None:
        eot = self.template.eot
        return self.tokenizer.special_token_ids.get(eot) if eot else None

    # -- bad input ----------------------------------------------------------------------
    def bad(self, error: InputError) -> None:
        """A bad line: raise it (``--on-error fail``) or count it (``skip``)."""
        if self.on_error == "fail":
            raise error
        self.skipped += 1

    def room(self) -> int | None:
        """How many more requests may be read (None: no limit)."""
        return None if self.limit is None else max(self.limit - self.requests, 0)

    def full(self) -> bool:
        return self.limit is not None and self.requests >= self.limit

    def count(self, note: str, n: int = 1) -> None:
        self.counts[note] += n


class Reader(ABC):
    """One input format. Subclasses register in ``kvsim/io/readers/__init__.py``."""

    name: ClassVar[str]
    #: file-level formats (not JSON records) are detected by :meth:`sniff`
    jsonl: ClassVar[bool] = True

    @classmethod
    def matches(cls, record: Any) -> bool:
        """Does this first valid JSON record look like this format? (auto-detection)"""
        return False

    @classmethod
    def sniff(cls, src: Source, first_line: str) -> bool:
        """For non-JSON formats: does the file's first line look like this format?"""
        return False

    @abstractmethod
    def read(self, src: Source, ctx: LoadContext) -> None:
        """Read the file and add its requests to ``ctx.builder``."""

    @staticmethod
    def parsed(src: Source, ctx: LoadContext, parse: Callable[[dict, int], Any],
               until_full: bool = True) -> Iterator[tuple[int, Any]]:
        """(line, ``parse(record, line)``) for each usable record of ``src``: unreadable lines
        and records ``parse`` rejects (BadRecord) go to ``ctx.bad``; stops at --limit."""
        for line, rec in src.records():
            if until_full and ctx.full():
                break
            if isinstance(rec, InputError):
                ctx.bad(rec)
                continue
            try:
                value = parse(require_object(rec), line)
            except BadRecord as e:
                ctx.bad(InputError(src.path, str(e), line))
                continue
            yield line, value


#: the first batches are smaller (halved this many times, then less and less), so that
#: tokenization starts soon after reading does
RAMP_BATCHES = 3


class JsonRequestReader(Reader):
    """A JSON-lines format whose record holds one (or a few) text or token requests."""

    batch_requests: ClassVar[int] = 4096
    batch_weight: ClassVar[int] = 1 << 22     # characters of text per tokenization batch

    @abstractmethod
    def requests(self, rec: dict, line: int, src: Source, ctx: LoadContext) -> list[PendingRequest]:
        """The requests in a record (raise BadRecord if it is unusable)."""

    def read(self, src: Source, ctx: LoadContext) -> None:
        batch: list[PendingRequest] = []
        weight = 0
        for _, reqs in self.parsed(src, ctx, lambda rec, line: self.requests(rec, line, src, ctx)):
            batch, weight = self._take(reqs, batch, weight, ctx)
        if batch:
            self._flush(batch, ctx, last=True)

    def _take(self, reqs: list[PendingRequest], batch: list[PendingRequest], weight: int,
              ctx: LoadContext) -> tuple[list[PendingRequest], int]:
        """Add a line's requests (up to --limit) to the batch; tokenize it once it is full."""
        if ctx.limit is not None:
            reqs = reqs[:ctx.room()]
        ctx.requests += len(reqs)
        batch.extend(reqs)
        weight += sum(r.weight for r in reqs)
        return ([], 0) if self._full(batch, weight, ctx) else (batch, weight)

    def _full(self, batch: list[PendingRequest], weight: int, ctx: LoadContext) -> bool:
        """Tokenize the batch if it is full (True: it was handed over; start a new one)."""
        smaller = max(0, RAMP_BATCHES - ctx.batches)  # the first batches: 1/8, 1/4, 1/2 of the size
        if len(batch) >= self.batch_requests >> smaller or weight >= self.batch_weight >> smaller:
            self._flush(batch, ctx)
            return True
        return False

    def _flush(self, batch: list[PendingRequest], ctx: LoadContext, last: bool = False) -> None:
        """Tokenize a complete batch in the background (``last``: nothing is read after it, so
        its tokenization may take every core)."""
        needs_tok = any(r.prompt_text is not None or r.prompt_pieces is not None
                        or (r.reply is not None and r.output_ids is None) for r in batch)
        tok = ctx.tokenizer if needs_tok else None
        eot = ctx.eot_id if needs_tok else None
        pieces = self.piece_encoder(ctx) if needs_tok else None
        if needs_tok:
            ctx.used_tokenizer = True
        plan = plan_requests(batch, pieces, last) if needs_tok else None
        ctx.batches += 1
        if ctx.executor is not None:  # tokenize in the background while parsing goes on
            ctx.builder.add(ctx.executor.submit(encode_requests, batch, ctx.source_index, tok, eot, pieces, plan))
        else:
            ctx.builder.add(encode_requests(batch, ctx.source_index, tok, eot, pieces, plan))

    def piece_encoder(self, ctx: LoadContext) -> Any:
        """What tokenizes prompts rendered in pieces (``encode_requests``' ``pieces``)."""
        return ctx.pieces

    # -- the compiled fast path -------------------------------------------------------------
    def read_scanned(self, src: Source, ctx: LoadContext, scan: Callable[[Any], Any],
                     fast: Callable[[Any, Any, int, int, LoadContext], list[PendingRequest] | None]) -> bool:
        """Read ``src`` block by block: ``scan(block)`` gives each line's status (FAST, BLANK
        or declined) and bounds, ``fast(block, scanned, k, line, ctx)`` the requests of an
        accepted line k (None: the general reader reads it). False (and nothing read) if the
        first record is not one the fast path takes: the general reader then reads the whole
        file, so that its special cases for a first line (one pretty-printed JSON document)
        still apply."""
        from kvsim.io.readers.token_scan import BLANK, FAST

        batch: list[PendingRequest] = []
        weight = 0
        started = False
        for first_line, block, scanned in _scanned_blocks(src, scan):
            status = scanned.status
            for k in range(len(status)):
                if ctx.full():
                    break
                st = status[k]
                if st == BLANK:
                    continue
                line = first_line + k
                reqs = fast(block, scanned, k, line, ctx) if st == FAST else None
                if reqs is None:
                    if not started:
                        return False
                    reqs = self.general_requests(bytes(block[scanned.bounds[k]:scanned.bounds[k + 1]]), line, src,
                                                 ctx)
                    if reqs is None:
                        continue
                started = True
                batch, weight = self._take(reqs, batch, weight, ctx)
            if ctx.full():
                break
        if batch:
            self._flush(batch, ctx, last=True)
        return True

    def general_requests(self, data: bytes, line: int, src: Source, ctx: LoadContext) -> list[PendingRequest] | None:
        """One line read as the general reader reads it (None: blank, or bad and skipped)."""
        text = src.decode_line(data, line)
        if text is None:
            return None
        rec = text if isinstance(text, InputError) else src.record_of(text, line)
        if isinstance(rec, InputError):
            ctx.bad(rec)
            return None
        try:
            return self.requests(require_object(rec), line, src, ctx)
        except BadRecord as e:
            ctx.bad(InputError(src.path, str(e), line))
            return None

    # -- helpers for subclasses -----------------------------------------------------------
    @staticmethod
    def pending(fields: CommonFields, ctx: LoadContext, **kw: Any) -> PendingRequest:
        """A request with the record's common fields coded."""
        cats = ctx.builder.categories
        if fields.model is not None:
            ctx.models.add(fields.model)
        return PendingRequest(
            reply=fields.reply, output_ids=fields.output_ids, logged_output=fields.logged_output,
            max_tokens=fields.max_tokens, arrival=fields.arrival,
            tenant=cats["tenant"].code(fields.tenant), cache_salt=cats["cache_salt"].code(fields.cache_salt),
            lora=cats["lora"].code(fields.lora), session=cats["session"].code(fields.session),
            request_id=fields.request_id, prompt_logprobs=fields.prompt_logprobs,
            logprob_start_len=fields.logprob_start_len, arrival_step=fields.arrival_step, **kw,
        )

    @staticmethod
    def chat_prompt(messages: Iterable[tuple[str, str]], ctx: LoadContext) -> dict[str, Any]:
        """Render messages with the template: the PendingRequest fields of a chat prompt."""
        from kvsim.io.tokenize.templates import TemplateRenderError

        msgs = list(messages)
        try:
            rendered = ctx.template.render_pieces(msgs)
        except TemplateRenderError as e:
            raise BadRecord(f"chat template {ctx.template.name} cannot render these messages: {e}") from None
        ctx.used_template = True
        roles = ctx.builder.roles.codes(rendered.roles)
        if ctx.pieces is not None:
            return dict(prompt_pieces=rendered, msg_roles=roles)
        whole = rendered.joined()
        return dict(prompt_text=whole.text, msg_chars=list(whole.message_starts_chars), msg_roles=roles)


def _scanned_blocks(src: Source, scan: Callable[[Any], Any]):
    """(first line, block, scan of the block) for each block of ``src``; the lines are
    counted by the scans (``bounds``), not once more by the source."""
    line = 1
    for _, block in src.line_blocks(numbered=False):
        scanned = scan(block)
        yield line, block, scanned
        line += len(scanned.bounds) - 1


def message_text(content: Any, where: str, ctx: LoadContext) -> str:
    """A message's content as text: a string, null (e.g. an assistant tool call), or a list
    of OpenAI content parts whose text parts are joined with newlines (vLLM's "string"
    content format); other parts (images, audio) are dropped and counted in the notes."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, dict):
                ctx.count("non-text content parts (images, audio, ...) were dropped: the tokens they "
                          "add on the server are not modelled")
            else:
                raise BadRecord(f"{where} content parts must be objects, got {kind(part)}")
        return "\n".join(texts)
    raise BadRecord(f"{where} content must be a string or a list of parts, got {kind(content)}")
