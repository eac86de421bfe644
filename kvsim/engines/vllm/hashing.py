"""Block hashing for the APC model: prefix-chained hashes of full blocks (``docs/engines/apc.md §1``).

Block *i* of a sequence (tokens ``[i*B, (i+1)*B)``) gets ``H((parent, tokens_i, extra_i))``
where ``parent`` is the previous block's hash (NONE_HASH for block 0) and ``extra_i`` holds
the namespace keys in vLLM 0.33's order: the LoRA adapter on every block, multimodal items
overlapping the block, the ``cache_salt`` on block 0 only (§1.3). Only full blocks are hashed.

Two families of ``H``:

- ``sha256`` / ``sha256_cbor``: byte-for-byte vLLM's own hashes (SHA-256 over pickle /
  canonical CBOR, NONE_HASH = H(seed) with the seed ``"vllm-none-hash"`` unless
  ``PYTHONHASHSEED`` is set, as 0.33's ``init_none_hash``). Use these to match kvsim's
  blocks against the hashes in vLLM's KV-cache events. Pure Python, so slow.
- ``fast`` (default): a 64-bit chained hash over the same inputs, compiled with numba
  (:mod:`kvsim.engines.vllm.hash_kernels`, loaded when first used): a
  block's key mixes its parent's key, its namespace keys and the sum of its tokens each
  mixed with its position, so the tokens of a block hash in parallel.
  Only *equality* of hashes matters for hits and evictions, so it gives the same replay
  unless two different prefixes collide: with n distinct blocks the chance of any collision
  is about n²/2⁶⁵ (3·10⁻⁶ for ten million blocks).
"""
from __future__ import annotations

import hashlib
import os
import pickle
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kvsim.errors import ConfigError

HASH_ALGOS = ("fast", "sha256", "sha256_cbor")
EXACT_ALGOS = ("sha256", "sha256_cbor")
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"  # vLLM 0.33 kv_cache_utils.DEFAULT_NONE_HASH_SEED

# An mm item as vLLM's MultiModalFeatureSpec sees it: (offset, length, identifier).
MMItem = tuple[int, int, str]


def check_algo(algo: str) -> str:
    """The algorithm name, or a clear error."""
    if algo not in HASH_ALGOS:
        raise ConfigError(f"unknown hash algorithm {algo!r}; choose one of {', '.join(HASH_ALGOS)}")
    return algo


# -- vLLM's exact hashes ----------------------------------------------------------------

def sha256_pickle(obj: Any) -> bytes:
    """vLLM ``sha256``: SHA-256 of ``pickle.dumps(obj, HIGHEST_PROTOCOL)``."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(obj: Any) -> bytes:
    """vLLM ``sha256_cbor``: SHA-256 of canonical CBOR."""
    try:
        import cbor2
    except ImportError:
        raise ConfigError("--hash-algo sha256_cbor needs the cbor2 package (pip install cbor2)") from None
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def hash_function(algo: str) -> Callable[[Any], bytes]:
    """The byte-exact hash function vLLM uses for ``--prefix-caching-hash-algo algo``."""
    if algo == "sha256":
        return sha256_pickle
    if algo == "sha256_cbor":
        return sha256_cbor
    raise ConfigError(f"{algo!r} is not one of vLLM's hash algorithms ({', '.join(EXACT_ALGOS)})")


def none_hash_seed() -> str:
    """NONE_HASH's seed as vLLM 0.33 resolves it for sha256*: PYTHONHASHSEED, else the fixed default."""
    seed = os.getenv("PYTHONHASHSEED")
    return DEFAULT_NONE_HASH_SEED if seed is None else seed


def none_hash(algo: str, seed: str | None = None) -> bytes:
    """The parent hash of every block 0 (vLLM ``init_none_hash``, docs/engines/apc.md §1.1)."""
    return hash_function(algo)(none_hash_seed() if seed is None else seed)


def extra_keys(
    start: int,
    end: int,
    lora: tuple[str, str] | None = None,
    cache_salt: str | None = None,
    mm_items: Sequence[MMItem] = (),
) -> tuple[Any, ...] | None:
    """The extra keys of the block covering tokens ``[start, end)``, as vLLM 0.33 builds them.

    Order (docs/engines/apc.md §1.3; ``generate_block_hash_extra_keys``): LoRA ``("lora", name, path)`` on
    every block, then ``("mm", identifier, offset - start)`` for each mm item overlapping the
    block, then ``("cache_salt", salt)`` on the first block only. None when empty.
    """
    keys: list[Any] = []
    if lora is not None:
        keys.append(("lora", _own(lora[0]), _own(lora[1])))
    for offset, length, ident in mm_items:
        if offset < end and start < offset + length:
            keys.append(("mm", _own(ident), offset - start))
    if start == 0 and cache_salt:
        keys.append(("cache_salt", _own(cache_salt)))
    return tuple(keys) if keys else None


def _own(text: str) -> str:
    """A copy of ``text`` that is its own object, as every string vLLM decodes from a request is.

    ``pickle`` writes a string seen twice in one object as a back-reference, so vLLM's
    ``sha256`` of ``("lora", name, path)`` differs between ``name is path`` and two equal
    strings. CPython shares one-character strings, and so does this copy.
    """
    return (text + "\0")[:-1]


def exact_block_hashes(
    tokens: Sequence[int],
    block_size: int,
    algo: str = "sha256",
    lora: tuple[str, str] | None = None,
    cache_salt: str | None = None,
    mm_items: Sequence[MMItem] = (),
    start_block: int = 0,
    parent: bytes | None = None,
    seed: str | None = None,
) -> list[bytes]:
    """vLLM's block hashes (bytes) of the full blocks of ``tokens`` from ``start_block`` on.

    ``parent`` is the hash of block ``start_block - 1`` (None for block 0), so hashes can be
    extended as tokens are appended, as vLLM's request block hasher does.
    """
    fn = hash_function(algo)
    root = none_hash(algo, seed)
    out: list[bytes] = []
    ids = [int(t) for t in tokens]  # Python ints: numpy ints pickle differently
    for i in range(start_block, len(ids) // block_size):
        start, end = i * block_size, (i + 1) * block_size
        extra = extra_keys(start, end, lora, cache_salt, mm_items)
        parent = fn((parent or root, tuple(ids[start:end]), extra))
        out.append(parent)
    return out


# -- the fast 64-bit hash -----------------------------------------------------------------

_MASK = (1 << 64) - 1
_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_F1 = 0xFF51AFD7ED558CCD
_F2 = 0xC4CEB9FE1A85EC53


def _fmix_py(h: int) -> int:
    h ^= h >> 33
    h = (h * _F1) & _MASK
    h ^= h >> 33
    h = (h * _F2) & _MASK
    return h ^ (h >> 33)


def _lane_py(value: int, position: int) -> int:
    """One value at one position of a block, mixed. A block's hash state is the sum of its
    lanes, so its tokens are hashed independently (no serial dependency between them)."""
    return _fmix_py(((value & _MASK) * _P2 + position * _P1 + _P3) & _MASK)


FAST_ROOT = _fmix_py(_P3)  # parent of block 0 (the fast hash's NONE_HASH)


def namespace_key(kind: str, *parts: str) -> int:
    """A 64-bit key for a namespace value (LoRA adapter, salt); 0 means none."""
    digest = hashlib.blake2b("\0".join((kind, *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") or 1


def fast_namespace_pair(lora_key: tuple[str, str] | None, cache_salt: str | None) -> tuple[int, int]:
    """The fast hash's namespace keys of a request: (its LoRA's, on every block; its salt's,
    on block 0), 0 for none (§1.3)."""
    every = 0 if lora_key is None else namespace_key("lora", *lora_key)
    return every, namespace_key("cache_salt", cache_salt) if cache_salt else 0


def fast_namespace_arrays(lora_keys: Sequence, salts: Sequence) -> tuple[np.ndarray, np.ndarray]:
    """:func:`fast_namespace_pair` of each request, as two uint64 arrays (every, first)."""
    pairs = [fast_namespace_pair(k, s) for k, s in zip(lora_keys, salts)]
    return np.array([e for e, _ in pairs], np.uint64), np.array([f for _, f in pairs], np.uint64)


def fast_block_hash_py(parent: int, block: Sequence[int], every_key: int, first_key: int) -> int:
    """The fast hash of one block — the readable definition the compiled kernels follow.

    ``every_key`` (LoRA) enters every block and ``first_key`` (salt) block 0 only, as in
    vLLM's extra keys (§1.3); the parent chains the whole prefix in. 0 is never returned.
    """
    acc = (_fmix_py(parent ^ _P3) + _lane_py(every_key, 0) + _lane_py(first_key, 1)) & _MASK
    for position, t in enumerate(block):
        acc = (acc + _lane_py(int(t), position + 2)) & _MASK
    return _fmix_py(acc ^ len(block)) or 1


#: below this many tokens, fast_hash_sequence hashes in Python unless the kernels are loaded
SMALL_TOKENS = 1 << 15
_KERNELS = ("_fmix", "_lane", "block_start", "block_token", "block_end", "fast_hash_requests")


def fast_hash_sequence(tokens, start_block, num_blocks, block_size, parent, every_key, first_key, out) -> None:
    """Hash blocks ``start_block .. start_block+num_blocks-1`` of one token array into ``out``
    (the compiled kernel, or :func:`fast_block_hash_py` for a few blocks before the kernels
    are loaded: the same keys, without compiling)."""
    if num_blocks * block_size > SMALL_TOKENS or "kvsim.engines.vllm.hash_kernels" in sys.modules:
        from kvsim.engines.vllm.hash_kernels import fast_hash_sequence as kernel

        kernel(tokens, start_block, num_blocks, block_size, parent, every_key, first_key, out)
        return
    h = int(parent)
    for j in range(num_blocks):
        b = start_block + j
        h = fast_block_hash_py(h, tokens[b * block_size:(b + 1) * block_size].tolist(), int(every_key),
                               int(first_key) if b == 0 else 0)
        out[j] = h


class BlockHasher:
    """Hashes a sequence's full blocks as vLLM's request block hasher does (§1.2)."""

    def __init__(self, block_size: int, algo: str = "fast", lora_paths: dict[str, str] | None = None):
        self.block_size = block_size
        self.algo = check_algo(algo)
        self.lora_paths = lora_paths or {}
        self._root = FAST_ROOT if algo == "fast" else none_hash(algo)

    def lora_key(self, lora: str | None) -> tuple[str, str] | None:
        """vLLM 0.33 hashes the adapter's name and path; a log has only the name (§1.3)."""
        return None if lora is None else (lora, self.lora_paths.get(lora, lora))

    def fast_namespace_keys(self, lora: str | None, cache_salt: str | None) -> tuple[int, int]:
        """The fast hash's namespace keys: (LoRA, on every block; salt, on block 0) (§1.3)."""
        return fast_namespace_pair(self.lora_key(lora), cache_salt)

    def fast_namespace_arrays(self, loras: Sequence, salts: Sequence) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`fast_namespace_keys` of each request (LoRA names, salts), as uint64 arrays."""
        return fast_namespace_arrays([self.lora_key(lora) for lora in loras], salts)

    def extend(self, seq) -> None:
        """Append the hashes of blocks that became full since the last call."""
        b, start = self.block_size, len(seq.block_hashes)
        n = len(seq.tokens) // b - start
        if n <= 0:
            return
        if self.algo == "fast":
            every, first = self.fast_namespace_keys(seq.lora, seq.cache_salt)
            parent = seq.block_hashes[-1] if start else self._root
            out = np.zeros(n, np.uint64)
            tokens = np.asarray(seq.tokens[: (start + n) * b], dtype=np.int64)
            fast_hash_sequence(tokens, start, n, b, np.uint64(parent), np.uint64(every), np.uint64(first), out)
            seq.block_hashes.extend(int(h) for h in out)
        else:
            seq.block_hashes.extend(exact_block_hashes(
                seq.tokens[: (start + n) * b], b, self.algo, self.lora_key(seq.lora), seq.cache_salt,
                seq.mm_items, start_block=start, parent=seq.block_hashes[-1] if start else None))


def __getattr__(name: str):
    """The compiled kernels, imported (with numba) on first use."""
    if name in _KERNELS:
        from kvsim.engines.vllm import hash_kernels

        return getattr(hash_kernels, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
