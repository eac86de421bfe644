"""Writing output files safely: never over an input file, never over existing data unless asked."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable

from kvsim.errors import KvsimError


def check_output_path(path: Path, inputs: Iterable[Path] = (), force: bool = True) -> Path:
    """Refuse to write onto an input file (always) or onto an existing file (unless force)."""
    path = Path(path)
    target = path.resolve()
    for src in inputs:
        try:
            if Path(src).resolve() == target or (target.exists() and os.path.samefile(src, target)):
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


def write_text_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, default=_jsonable) + "\n")


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    write_text_atomic(path, "".join(json.dumps(r, default=_jsonable) + "\n" for r in rows))


def _jsonable(value: Any) -> Any:
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
