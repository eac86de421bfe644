"""Opening input files: existence checks, transparent gzip, numbered lines and JSON records.

Every problem is reported as an :class:`~kvsim.errors.InputError` naming the file and,
where it applies, the line. Lines that cannot be decoded or parsed are *yielded* as errors
(the reader decides to fail or skip); a broken gzip stream or JSON array is fatal.
"""
from __future__ import annotations

import gzip
import io
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterator

from kvsim.errors import InputError

GZIP_MAGIC = b"\x1f\x8b"
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
            lineno = 0
            it = iter(stream)
            while True:
                try:
                    data = next(it)
                except StopIteration:
                    break
                except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
                    raise InputError(self.path, f"cannot read compressed data ({_gzip_problem(e)})",
                                     lineno + 1) from None
                lineno += 1
                if self.progress is not None and lineno % 256 == 0:
                    self.progress(raw.tell())
                if lineno == 1 and data.startswith(b"\xef\xbb\xbf"):
                    data = data[3:]  # UTF-8 byte-order mark
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError as e:
                    yield lineno, InputError(
                        self.path, f"not valid UTF-8 (byte 0x{data[e.start]:02x} at column {e.start + 1})",
                        lineno)
                    continue
                if text.strip():
                    yield lineno, text
            if self.progress is not None:
                self.progress(self.size)

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
            yield lineno, (InputError(self.path, value.message, lineno)
                           if isinstance(value, _JsonProblem) else value)

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


@dataclass
class _JsonProblem:
    message: str


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
