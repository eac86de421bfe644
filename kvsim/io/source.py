"""Opening input files: existence checks, transparent gzip, numbered lines and JSON records.

Every problem is reported as an :class:`~kvsim.errors.InputError` naming the file and,
where it applies, the line. Lines that cannot be decoded or parsed are *yielded* as errors
(the reader decides to fail or skip); a broken gzip stream or JSON array is fatal.
"""
from __future__ import annotations

import functools
import gzip
import io
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterator

import numpy as np

from kvsim.errors import InputError

GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"
BLOCK_BYTES = 8 << 20  # bytes handed to a compiled scanner at a time
_ARRAY_CHUNK = 1 << 20  # characters read at a time from a JSON array file
_WHOLE_DOCUMENT_MAX = 256 << 20  # largest file tried as one pretty-printed JSON document

ProgressFn = Callable[[int], None]  # called with the number of on-disk bytes consumed so far


def check_input(path: Path) -> None:
    """Fail clearly on a missing file, a directory or an empty file."""
    if not path.exists():
        raise InputError(path, "no such file")
    if path.is_dir():
        raise InputError(path, "is a directory; give the log file(s) inside it")
    if not path.is_file():
        raise InputError(path, "is not a regular file")
    if path.stat().st_size == 0:
        raise InputError(path, "file is empty")


@dataclass
class Source:
    """One input file and how far through it we are (for the progress bar)."""

    path: Path
    progress: ProgressFn | None = None

    @property
    def size(self) -> int:
        return self.path.stat().st_size

    @property
    def is_gzip(self) -> bool:
        with open(self.path, "rb") as f:
            return f.read(2) == GZIP_MAGIC

    def open_binary(self) -> tuple[IO[bytes], IO[bytes]]:
        """(decompressed stream, raw file) — the raw file's position drives progress."""
        raw = open(self.path, "rb")
        if raw.read(2) == GZIP_MAGIC:
            raw.seek(0)
            return gzip.GzipFile(fileobj=raw, mode="rb"), raw
        raw.seek(0)
        return raw, raw

    def lines(self) -> Iterator[tuple[int, str | InputError]]:
        """(line number, text) for every non-blank line; undecodable lines come as errors."""
        stream, raw = self.open_binary()
        with raw, stream:
            for lineno, data in _raw_lines(self.path, stream):
                if self.progress is not None and lineno % 256 == 0:
                    self.progress(raw.tell())
                text = self.decode_line(data, lineno)
                if text is not None:
                    yield lineno, text
            if self.progress is not None:
                self.progress(self.size)

    def decode_line(self, data: bytes, lineno: int) -> str | InputError | None:
        """One raw line as text (None if blank), or the error saying why it is not UTF-8."""
        if lineno == 1 and data.startswith(UTF8_BOM):
            data = data[3:]
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            return InputError(self.path, f"not valid UTF-8 (byte 0x{data[e.start]:02x} at column {e.start + 1})",
                              lineno)
        return None if not text or text.isspace() else text  # (isspace stops at the first letter)

    def line_blocks(self, size: int = BLOCK_BYTES, first: int | None = None,
                    numbered: bool = True) -> Iterator[tuple[int, np.ndarray]]:
        """The file as blocks of whole lines: (number of the block's first line, bytes); the
        first block of an uncompressed file holds about ``first`` bytes when given. Without
        ``numbered`` the lines of an uncompressed file are not counted (a caller that counts
        them itself gets 1 for every block).

        Every block but the last ends with a newline. Compressed input is read line by line,
        exactly as :meth:`lines` reads it, so a broken stream fails at the same line.
        """
        stream, raw = self.open_binary()
        with raw, stream:
            blocks = (_plain_blocks(raw, size, first or size, numbered) if stream is raw
                      else _stream_blocks(self.path, stream, size))
            for first, block in blocks:
                yield first, block
                if self.progress is not None:
                    self.progress(raw.tell())

    def first_char(self) -> str:
        """The first non-blank character of the file ('' if it holds only whitespace)."""
        for _, text in self.lines():
            if isinstance(text, InputError):
                return "\x00"
            return text.lstrip()[:1]
        return ""

    def records(self) -> Iterator[tuple[int, Any | InputError]]:
        """JSON values with their line numbers: JSON Lines, a JSON array, or one JSON document.

        A JSON array yields its elements (each numbered by the line it starts on); a file
        whose first line is not JSON on its own but which parses as a whole (a pretty-printed
        object) yields that object as line 1.
        """
        if self.first_char() == "[":
            yield from self._array_records()
            return
        first = True
        for lineno, text in self.lines():
            if isinstance(text, InputError):
                yield lineno, text
                first = False
                continue
            value = parse_json(text)
            if (first and isinstance(value, _JsonProblem) and text.lstrip().startswith("{")
                    and self.size <= _WHOLE_DOCUMENT_MAX):
                whole = self._whole_document()
                if whole is not None:
                    yield 1, whole
                    return
            first = False
            yield lineno, self.record_of(text, lineno, value)

    def record_of(self, text: str, lineno: int, value: Any = None) -> Any | InputError:
        """The JSON value of one line of text, or the error saying why it is not JSON."""
        if value is None:
            value = parse_json(text)
        return InputError(self.path, value.message, lineno) if isinstance(value, _JsonProblem) else value

    def _whole_document(self) -> Any | None:
        stream, raw = self.open_binary()
        with raw, stream:
            try:
                data = stream.read()
            except (OSError, EOFError, zlib.error) as e:
                raise InputError(self.path, f"cannot read compressed data ({_gzip_problem(e)})") from None
        try:
            return json.loads(data.decode("utf-8-sig"))
        except (ValueError, RecursionError):
            return None

    def _array_records(self) -> Iterator[tuple[int, Any | InputError]]:
        """Stream the elements of a top-level JSON array without reading the file at once."""
        stream, raw = self.open_binary()
        decoder = json.JSONDecoder()
        with raw, stream:
            text = io.TextIOWrapper(stream, encoding="utf-8-sig", errors="strict")
            buf, pos, eof = "", 0, False
            line, counted = 1, 0  # line number of buf[counted]

            def line_at(p: int) -> int:
                nonlocal line, counted
                line += buf.count("\n", counted, p)
                counted = p
                return line

            def fill() -> None:
                nonlocal buf, pos, eof, counted
                try:
                    chunk = text.read(_ARRAY_CHUNK)
                except UnicodeDecodeError:
                    raise InputError(self.path, "not valid UTF-8", line_at(pos)) from None
                except (OSError, EOFError, zlib.error) as e:
                    raise InputError(self.path, f"cannot read compressed data ({_gzip_problem(e)})",
                                     line_at(pos)) from None
                line_at(pos)
                buf, pos, counted = buf[pos:] + chunk, 0, 0
                eof = not chunk
                if self.progress is not None:
                    self.progress(raw.tell())

            def skip_ws() -> None:
                nonlocal pos
                while True:
                    while pos < len(buf) and buf[pos] in " \t\r\n":
                        pos += 1
                    if pos < len(buf) or eof:
                        return
                    fill()

            fill()
            skip_ws()
            pos += 1  # the opening '['
            skip_ws()
            if buf[pos:pos + 1] == "]":
                return
            while True:
                skip_ws()
                start_line = line_at(pos)
                while True:
                    try:
                        value, end = decoder.raw_decode(buf, pos)
                        if end < len(buf) or eof:
                            break
                    except (ValueError, RecursionError) as e:
                        if eof:
                            msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
                            raise InputError(self.path, f"invalid JSON array element: {msg}",
                                             start_line) from None
                    fill()
                yield start_line, value
                pos = end
                skip_ws()
                sep = buf[pos:pos + 1]
                if sep == "]":
                    return
                if sep != ",":
                    raise InputError(self.path, "invalid JSON array: expected ',' or ']'", line_at(pos))
                pos += 1


def _plain_blocks(raw: IO[bytes], size: int, first: int, numbered: bool = True) -> Iterator[tuple[int, np.ndarray]]:
    """Blocks of whole lines of an uncompressed file, read into one reused buffer (the first
    read fills ``first`` bytes of it at most; a bytearray, see :func:`block_buffer`)."""
    data = bytearray(max(size, first))
    buf = np.frombuffer(data, np.uint8)
    filled, line, limit = 0, 1, min(first, size)
    while True:
        n = raw.readinto(memoryview(data)[filled:limit])
        limit = len(data)
        if not n:
            if filled:
                yield line, buf[:filled]
            return
        filled += n
        last = data.rfind(b"\n", 0, filled)
        if last < 0:
            if filled == len(data):  # one line longer than the buffer: grow it
                data = data + bytearray(len(data))
                buf = np.frombuffer(data, np.uint8)
                limit = len(data)
            continue
        yield line, buf[:last + 1]
        if numbered:
            line += data.count(b"\n", 0, last + 1)
        tail = filled - last - 1
        data[:tail] = data[last + 1:filled]
        filled = tail


def block_buffer(block: np.ndarray) -> bytes | bytearray:
    """A block of :meth:`Source.line_blocks` as bytes or a bytearray whose first
    ``len(block)`` bytes are the block's: the buffer it views when it starts there (no copy;
    valid until the next block is read), else a copy."""
    base = block.base
    while isinstance(base, (np.ndarray, memoryview)):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    if (isinstance(base, (bytes, bytearray))
            and block.__array_interface__["data"][0] == np.frombuffer(base, np.uint8).__array_interface__["data"][0]):
        return base
    return block.tobytes()


def _stream_blocks(path: Path, stream: IO[bytes], size: int) -> Iterator[tuple[int, np.ndarray]]:
    """Blocks of whole lines of a compressed stream, read line by line as ``Source.lines`` does."""
    pending: list[bytes] = []
    held, first = 0, 1
    try:
        for lineno, data in _raw_lines(path, stream):
            pending.append(data)
            held += len(data)
            if held >= size:
                yield first, np.frombuffer(b"".join(pending), np.uint8)
                pending, held, first = [], 0, lineno + 1
    except InputError:
        if pending:             # the whole lines before the damage are still read
            yield first, np.frombuffer(b"".join(pending), np.uint8)
        raise
    if pending:
        yield first, np.frombuffer(b"".join(pending), np.uint8)


def _raw_lines(path: Path, stream: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of a stream; damaged compressed data is an InputError at its line."""
    lineno = 0
    it = iter(stream)
    while True:
        try:
            data = next(it)
        except StopIteration:
            return
        except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
            raise InputError(path, f"cannot read compressed data ({_gzip_problem(e)})", lineno + 1) from None
        lineno += 1
        yield lineno, data


@dataclass
class _JsonProblem:
    message: str


_scan_value = json.JSONDecoder().scan_once  # the C scanner behind json.loads


def plain_json(text: str) -> Any | None:
    """The JSON value that ``text`` holds from its first character (JSON whitespace may
    follow), as ``json.loads`` reads it but with less around the C scanner; None for anything
    else (invalid JSON, leading whitespace, ...: the caller reads such text the usual way)."""
    try:
        value, end = _scan_value(text, 0)
    except (StopIteration, ValueError, RecursionError):
        return None
    if end != len(text) and text[end:].strip(" \t\n\r"):
        return None
    return value


_JSON_SPACE = frozenset(b" \t\n\r")


def plain_json_bytes(raw: bytes) -> Any | None:
    """:func:`plain_json` of UTF-8 bytes (None also for bytes that are not UTF-8).

    msgspec's decoder reads them first, about twice as fast as the C scanner behind
    ``json.loads``: where it succeeds it gives what ``json.loads`` gives (the same values and
    types, integers of any size included), and what it refuses (lone surrogates, NaN, floats
    out of range, ...) is read by :func:`plain_json` (``tests/test_io_fields.py``)."""
    if not raw or raw[0] in _JSON_SPACE:
        return None
    try:
        return _msgspec_decode()(raw)
    except Exception:  # noqa: BLE001 (msgspec's DecodeError, ValidationError: the usual reader decides)
        pass
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return plain_json(text)


@functools.lru_cache(maxsize=1)
def _msgspec_decode():
    import msgspec.json

    return msgspec.json.Decoder().decode


def parse_json(text: str) -> Any | _JsonProblem:
    """Parse one JSON value, or describe why it is not valid JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        return _JsonProblem(f"invalid JSON: {e.msg} (column {e.colno})")
    except RecursionError:
        return _JsonProblem("invalid JSON: nested too deeply")
    except ValueError as e:  # e.g. an integer with too many digits
        return _JsonProblem(f"invalid JSON: {e}")


def _gzip_problem(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text if len(text) < 120 else text[:117] + "..."
