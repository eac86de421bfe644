"""Every file kvsim writes goes through here: never over an input file, never over existing
data unless asked, always atomically (a temporary file renamed into place), missing parent
folders created, and JSON from numpy values without surprises.

Modes: what a user asks for by name (reports, PNGs, JSON and CSV summaries, per-request
rows, exports) gets the usual umask mode, and none of it holds prompt text unless
``--show-text`` asked for it; what kvsim keeps on the side that holds prompt token ids
(the trace cache, ``kvsim serve``'s record, the tokenizer failure note) is ``private``:
mode 0600 in folders of mode 0700, the user's alone."""
from __future__ import annotations

import gzip
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from kvsim.errors import KvsimError


def check_output_path(path: Path, inputs: Iterable[Path] = (), force: bool = True) -> Path:
    """Refuse to write onto an input file (always) or onto an existing file (unless force)."""
    path = Path(path).expanduser()
    target = path.resolve()
    for src in inputs:
        try:
            if Path(src).expanduser().resolve() == target or (target.exists() and os.path.samefile(src, target)):
                raise KvsimError(f"{path}: refusing to write over an input file")
        except FileNotFoundError:
            continue
    if path.is_dir():
        raise KvsimError(f"{path}: is a directory, expected a file path")
    if path.exists() and not force:
        raise KvsimError(f"{path}: already exists (use --force to overwrite)")
    _check_can_make(path.parent)
    return path


def _check_can_make(folder: Path) -> None:
    """A missing ``folder`` can be created: its nearest existing ancestor is a folder."""
    for parent in (folder, *folder.parents):
        if parent.exists():
            if not parent.is_dir():
                raise KvsimError(f"{parent}: is a file, cannot create the folder {folder}")
            return


def make_dir(folder: Path, private: bool = False) -> Path:
    """Create ``folder`` and its missing parents (mode 0700 when ``private``)."""
    folder = Path(folder).expanduser()
    _check_can_make(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700 if private else 0o777)
        if private:
            os.chmod(folder, 0o700)
    except OSError as e:
        raise KvsimError(f"cannot create the folder {folder}: {e.strerror}") from None
    return folder


@contextmanager
def atomic_path(path: Path, private: bool = False) -> Iterator[Path]:
    """A temporary path beside ``path`` that is renamed to it when the block ends without
    error (for writers that want a file name); the parent folder is created if missing.
    Mode 0600 when ``private``, else the usual umask mode."""
    path = Path(path)
    make_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o600 if private else 0o666 & ~_umask())  # mkstemp makes 0600
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@contextmanager
def atomic_file(path: Path, compress: bool | None = None, private: bool = False) -> Iterator[IO[bytes]]:
    """A binary file that appears at ``path`` only when the block ends without error.

    ``compress`` (default: when the name ends in ``.gz``) writes gzip with no name and
    mtime 0 in the header, so equal content gives equal bytes.
    """
    path = Path(path)
    if compress is None:
        compress = path.name.endswith(".gz")
    with atomic_path(path, private) as tmp, open(tmp, "wb") as raw:
        if compress:
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz:
                yield gz
        else:
            yield raw


def open_private_append(path: Path) -> IO[str]:
    """``path`` opened for appending text, line-buffered; created with mode 0600 (the parent
    folder too, if missing). An existing file keeps its mode."""
    path = Path(path)
    make_dir(path.parent)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    return os.fdopen(fd, "a", encoding="utf-8", buffering=1)


def write_bytes_atomic(path: Path, payload: bytes, private: bool = False) -> None:
    with atomic_file(path, compress=False, private=private) as f:
        f.write(payload)


def write_text_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a file."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_lines_atomic(path: Path, lines: Iterable[str]) -> None:
    """Text lines (each ending in a newline) to ``path``, gzip when it ends in ``.gz``."""
    with atomic_file(path) as f:
        for line in lines:
            f.write(line.encode("utf-8"))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# -- JSON -------------------------------------------------------------------------------

def json_default(value: Any) -> Any:
    """``json.dumps(default=...)``: numpy scalars and arrays, paths."""
    import numpy as np

    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def to_jsonable(value: Any) -> Any:
    """A copy of ``value`` with numpy values turned into Python ones, recursively (keys as strings)."""
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    try:
        return json_default(value)
    except TypeError:
        return value


def is_jsonable(value: Any) -> bool:
    try:
        json.dumps(value, default=json_default)
        return True
    except TypeError:
        return False


def write_json(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, default=json_default) + "\n")


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    write_lines_atomic(path, (json.dumps(r, default=json_default) + "\n" for r in rows))
