"""The record: one JSON line per request the cache model served, readable by every kvsim
command (the ``tokens`` format: ``prompt_token_ids`` and ``output_token_ids``).

A line holds the exact prompt and generated token ids, the namespace fields (``lora``,
``cache_salt``, ``user``), ``prompt_logprobs``, the arrival ``timestamp``, and kvsim's
answer under ``"kvsim"`` (and, in proxy mode, the real server's under ``"upstream"``).
Replaying the file with ``kvsim simulate`` and the same settings gives the served
``cached_tokens`` request for request. No text unless ``--record-text`` (then the
``messages`` or ``prompt`` and the ``reply_text`` are kept too).

The file is opened for appending only: earlier lines are never touched.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TextIO

from kvsim.errors import ConfigError
from kvsim.outputs import open_private_append


class Recorder:
    """Appends record lines to one file, flushed line by line."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self.existing_lines = _count_lines(self.path)
            # O_APPEND: every write lands at the end, whatever else has the file open
            # mode 0600: the record holds prompt token ids (and text with --record-text)
            self._file: TextIO = open_private_append(self.path)
        except OSError as e:
            raise ConfigError(f"--record {self.path}: cannot open for appending ({e.strerror})") from None
        self.written = 0

    def write(self, line: dict[str, Any]) -> None:
        self._file.write(json.dumps(line, separators=(",", ":"), ensure_ascii=False) + "\n")
        self.written += 1

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()


def _count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
