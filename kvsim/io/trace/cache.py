"""The persistent trace cache: a log's columnar trace, stored after the first read and
memory-mapped by the next command that reads the same log with the same options.

Where: ``$KVSIM_CACHE_DIR/traces``, else ``traces`` in the user cache folder
(``platformdirs``: ``~/.cache/kvsim`` on Linux); the folder is readable by the user only
(0700) and so is every file in it (0600). ``KVSIM_NO_TRACE_CACHE=1`` (or ``kvsim
--no-trace-cache``) turns it off.

An entry is keyed by the real path of every input file, every option that changes the
trace (format, tokenizer, chat template, trace block size, ``--on-error``, ``--limit``,
reader options; a tokenizer file or template file by its content), kvsim's trace format
version and the trace's fields (so an entry written by another kvsim is never read). It
records each file's size, modification and change times, inode and a BLAKE2b hash of its
content (computed on a thread of its own while the log is read; the command line has it
computed and the entry written on another thread once the log is read, while the command goes
on). It is served when every file's stat is unchanged; when the stat changed but the
size did not (a copy, a ``touch``) or the file changed within two seconds of being recorded
(timestamps too coarse to tell), the content hash decides. A changed, truncated or appended
log is read again and its entry replaced. Entries past ``KVSIM_TRACE_CACHE_MAX_BYTES``
(default 20 GiB) in total are removed, least recently used first.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from kvsim.errors import KvsimError
from kvsim.outputs import atomic_file, make_dir, write_bytes_atomic

if TYPE_CHECKING:
    from kvsim.io.trace.columns import Trace

ENV_DIR = "KVSIM_CACHE_DIR"
ENV_OFF = "KVSIM_NO_TRACE_CACHE"
ENV_MAX = "KVSIM_TRACE_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 20 << 30
#: bump when what a trace holds for the same log and options changes
TRACE_FORMAT = 2   # 2: arrival_step
RACY_NS = 2_000_000_000
_HASH_CHUNK = 1 << 20


def cache_root() -> Path:
    """kvsim's cache folder: ``$KVSIM_CACHE_DIR``, else the user cache folder."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("kvsim"))


def traces_dir() -> Path:
    return cache_root() / "traces"


def enabled_by_default() -> bool:
    return os.environ.get(ENV_OFF, "").strip().lower() in ("", "0", "false", "no")


# -- identity of the inputs ------------------------------------------------------------------
@dataclass
class Stamp:
    """What an input file was when its trace was stored."""

    path: str
    size: int
    mtime_ns: int
    ctime_ns: int
    inode: int
    device: int
    seen_ns: int
    blake2b: str = ""

    @classmethod
    def of(cls, path: Path) -> "Stamp":
        st = os.stat(path)
        return cls(str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev,
                   time.time_ns())

    def same_stat(self, other: "Stamp") -> bool:
        return (self.size, self.mtime_ns, self.ctime_ns, self.inode, self.device) == \
               (other.size, other.mtime_ns, other.ctime_ns, other.inode, other.device)

    @property
    def racy(self) -> bool:
        """Changed so shortly before it was recorded that equal timestamps prove nothing."""
        return self.seen_ns - max(self.mtime_ns, self.ctime_ns) < RACY_NS


def content_hash(path: Path) -> str:
    h = hashlib.blake2b(digest_size=20)
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _file_identity(value: str) -> str | dict:
    """An option that may name a file (template, tokenizer): the file's content counts."""
    path = Path(value[3:] if value.startswith("hf:") else value).expanduser()
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        return value
    return {"value": value, "path": str(path.resolve()), "blake2b": content_hash(path)}


def options_key(*, format: str, tokenizer: str, chat_template: str, trace_block_size: int, on_error: str,
                limit: int | None, reader_options: dict[str, Any]) -> dict[str, Any]:
    """The options that change a trace, as a JSON-able dict."""
    return {"format": format, "tokenizer": _file_identity(tokenizer), "chat_template": _file_identity(chat_template),
            "trace_block_size": trace_block_size, "on_error": on_error, "limit": limit,
            "reader_options": reader_options}


def entry_key(sources: Sequence[Path], options: dict[str, Any]) -> str:
    from kvsim import __version__
    from kvsim.io.trace.mapped import VERSION as FILE_VERSION

    from kvsim.io.trace.columns import Trace, TraceMeta

    ident = {"trace_format": TRACE_FORMAT, "file_format": FILE_VERSION, "kvsim": __version__,
             "fields": [f.name for cls in (Trace, TraceMeta) for f in dataclasses.fields(cls)],
             "sources": [str(Path(p).resolve()) for p in sources], "options": options}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]


# -- lookup and store ------------------------------------------------------------------------
def lookup(sources: Sequence[Path], options: dict[str, Any]) -> "Trace | None":
    """The stored trace of these files and options, if it is still theirs; else None."""
    from kvsim.io.trace.mapped import TraceFileError, read_trace_file

    wait_for_stores()
    folder = traces_dir()
    key = entry_key(sources, options)
    index_path, data_path = folder / f"{key}.json", folder / f"{key}.trace"
    try:
        entry = json.loads(index_path.read_text())
        stamps = [Stamp(**s) for s in entry["sources"]]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    if len(stamps) != len(sources):
        return None
    refreshed = False
    for i, (old, path) in enumerate(zip(stamps, sources)):
        try:
            now = Stamp.of(Path(path))
        except OSError:
            return None
        if old.same_stat(now) and not old.racy:
            continue
        if old.size != now.size or content_hash(Path(path)) != old.blake2b:
            remove_entry(key)  # the log changed: read it again
            return None
        now.blake2b = old.blake2b
        stamps[i], refreshed = now, True
    try:
        trace = read_trace_file(data_path)
    except (OSError, TraceFileError, ValueError, TypeError, KeyError):
        remove_entry(key)
        return None
    if refreshed:
        entry["sources"] = [asdict(s) for s in stamps]
        _write_private(index_path, json.dumps(entry).encode())
    try:
        os.utime(data_path)  # least recently used is removed first
    except OSError:
        pass
    trace.meta.sources = [str(p) for p in sources]
    return trace


class PendingStore:
    """Started before a log is read: the files' stamps, and their content hashes computed in
    a background thread while the log is parsed (``hash_while_reading``; else once the entry
    is written). :meth:`store` writes the entry, or (with ``wait=False``) has a thread of its
    own write it while the caller goes on (the process waits for it before it exits, and
    :func:`lookup` before it looks)."""

    def __init__(self, sources: Sequence[Path], options: dict[str, Any], hash_while_reading: bool = True) -> None:
        self.sources = [Path(p) for p in sources]
        self.options = options
        self.stamps = [Stamp.of(p) for p in self.sources]
        self._hashes: list[str] = []
        self._thread = threading.Thread(target=self._hash, daemon=True, name="kvsim-hash")
        if hash_while_reading:
            self._thread.start()

    def _hash(self) -> None:
        try:
            self._hashes = [content_hash(p) for p in self.sources]
        except OSError:
            self._hashes = []

    def store(self, trace: "Trace", wait: bool = True) -> bool:
        """Store the trace, unless a file changed while it was read (False: nothing is
        stored). With ``wait=False`` the entry is written in the background: a file that
        changes before that is done is not stored either."""
        from kvsim.io.trace.mapped import encode_trace

        if not self._unchanged():
            return False
        encoded = encode_trace(trace)  # the trace as it is now, whatever the caller does next
        counts = {"requests": len(trace), "prompt_tokens": trace.num_prompt_tokens}
        if wait:
            return self._write(encoded, counts)
        writer = threading.Thread(target=self._write, args=(encoded, counts), name="kvsim-store")
        with _writers_lock:
            _writers.append(writer)
        writer.start()
        return True

    def _unchanged(self) -> bool:
        try:
            after = [Stamp.of(p) for p in self.sources]
        except OSError:
            return False
        return all(a.same_stat(b) for a, b in zip(self.stamps, after))

    def _write(self, encoded: tuple[bytes, list], counts: dict[str, int]) -> bool:
        from kvsim.io.trace.mapped import write_encoded

        if self._thread.ident is None:  # not started while the log was read: hash it now
            self._hash()
        else:
            self._thread.join()
        if len(self._hashes) != len(self.sources) or not self._unchanged():
            return False
        for stamp, digest in zip(self.stamps, self._hashes):
            stamp.blake2b = digest
        key = entry_key(self.sources, self.options)
        try:
            folder = _private_folder()
            with atomic_file(folder / f"{key}.trace", compress=False, private=True) as f:
                size = write_encoded(f, *encoded)
            entry = {"sources": [asdict(s) for s in self.stamps], "options": self.options, "bytes": size,
                     **counts, "created_ns": time.time_ns()}
            _write_private(folder / f"{key}.json", json.dumps(entry).encode())
            prune(int(os.environ.get(ENV_MAX, DEFAULT_MAX_BYTES)))
        except (OSError, KvsimError):
            return False
        return True


_writers: list[threading.Thread] = []
_writers_lock = threading.Lock()


def wait_for_stores() -> None:
    """Wait until every entry this process started storing is written (or given up)."""
    with _writers_lock:
        writers, _writers[:] = list(_writers), []
    for w in writers:
        if w is not threading.current_thread():
            w.join()


# -- the folder ------------------------------------------------------------------------------
@dataclass
class Entry:
    key: str
    sources: list[str]
    bytes: int
    requests: int
    prompt_tokens: int
    last_used_ns: int


def entries() -> list[Entry]:
    """Every stored trace, most recently used first."""
    if threading.current_thread().name != "kvsim-store":
        wait_for_stores()
    folder = traces_dir()
    out = []
    for index in folder.glob("*.json") if folder.is_dir() else []:
        data = index.with_suffix(".trace")
        try:
            entry = json.loads(index.read_text())
            out.append(Entry(index.stem, [s["path"] for s in entry["sources"]], data.stat().st_size,
                             int(entry["requests"]), int(entry["prompt_tokens"]), data.stat().st_mtime_ns))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sorted(out, key=lambda e: -e.last_used_ns)


def remove_entry(key: str) -> int:
    """Remove one entry; the bytes freed."""
    freed = 0
    for suffix in (".json", ".trace"):
        path = traces_dir() / f"{key}{suffix}"
        try:
            freed += path.stat().st_size
            path.unlink()
        except OSError:
            pass
    return freed


def clear() -> tuple[int, int]:
    """Remove every entry (and leftovers of interrupted writes): (entries, bytes freed)."""
    wait_for_stores()
    folder = traces_dir()
    if not folder.is_dir():
        return 0, 0
    count = len(list(folder.glob("*.json")))
    freed = 0
    for path in folder.iterdir():
        if path.is_file() and path.suffix in (".json", ".trace", ".tmp"):
            freed += path.stat().st_size
            path.unlink()
    return count, freed


def prune(max_bytes: int) -> None:
    """Remove the least recently used entries until the rest fit in ``max_bytes``."""
    total = 0
    for e in entries():
        total += e.bytes
        if total > max_bytes:
            remove_entry(e.key)


def _private_folder() -> Path:
    return make_dir(traces_dir(), private=True)


def _write_private(path: Path, data: bytes) -> None:
    write_bytes_atomic(path, data, private=True)
