"""Every file kvsim writes goes through here: never over an input file, never over existing
data unless asked, always atomically (a temporary file renamed into place, with the usual
umask mode), and JSON from numpy values without surprises."""
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
    if not path.parent.exists():
        raise KvsimError(f"{path.parent}: directory does not exist")
    return path


@contextmanager
def atomic_file(path: Path, compress: bool | None = None) -> Iterator[IO[bytes]]:
    """A binary file that appears at ``path`` only when the block ends without error.

    ``compress`` (default: when the name ends in ``.gz``) writes gzip with no name and
    mtime 0 in the header, so equal content gives equal bytes.
    """
    path = Path(path)
    if compress is None:
        compress = path.name.endswith(".gz")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw:
            if compress:
                with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz:
                    yield gz
            else:
                yield raw
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_bytes_atomic(path: Path, payload: bytes) -> None:
    with atomic_file(path, compress=False) as f:
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
