"""The core of the analyzer: for every request, the longest prefix of its prompt that some
*earlier* request (file order = arrival order) already had, with an unlimited cache.

Two levels keep memory near the number of distinct 16-token blocks, not tokens:

1. every full G-token block of every request gets a chained key (parent key + content,
   as vLLM chains block hashes) and a dense node id; a request's reuse starts with the
   number of leading prompt blocks whose key an earlier request already produced;
2. inside the first unseen block, partial prefixes (parent key + first t tokens) extend
   the reuse token by token. They are stored only under parents where some request
   stops matching, so this level stays small.

What an earlier request leaves in the cache is its prompt followed by its *extension*:
the logged output tokens minus the last one (an engine never computes the KV of the
token it sampled last). Requests live in namespaces (cache salt, LoRA adapter): a
namespace seeds the root key, so prefixes are shared only inside one namespace.

From the per-request reuse ``r`` every bound follows: the token-level bound is ``r``,
APC at block size B hits ``floor(r/B)`` blocks (capped at ``floor((L-1)/B)`` by the
one-token-recompute rule), and so on (see :mod:`kvsim.analyze.upper_bound`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from kvsim.analyze import _kernels as K
from kvsim.kernels.table import grow_table, new_table
from kvsim.io.trace.columns import Trace

G = 16  #: block granularity of level 1 (any finer block size is still exact: level 2 is per token)
_CHUNK_TOKENS = 1 << 23  # tokens scanned per kernel call (progress updates)
_INITIAL_NODES = 1 << 23  # first size of the level-1 table and node arrays (they grow as needed)
_INITIAL_PARTIALS = 1 << 16  # first size of the level-2 table

Progress = Callable[[int], None]  # called with the number of tokens just processed


@dataclass
class PrefixIndex:
    """Per-request reuse plus the block tree of level 1 (nodes = distinct full G-blocks)."""

    reuse: np.ndarray        # int64 (n,): tokens of the prompt an earlier request had
    source: np.ndarray       # int64 (n,): first request that had that prefix (-1 if reuse == 0)
    lengths: np.ndarray      # int64 (n,): prompt lengths
    blk_off: np.ndarray      # int64 (n+1,): request i's full blocks are ids[blk_off[i]:blk_off[i+1]]
    ids: np.ndarray          # int64: node id of every full block of every cached sequence
    node_key: np.ndarray     # uint64 (nodes,): chained key of each node
    node_first: np.ndarray   # int64 (nodes,): first request that produced the node
    node_parent: np.ndarray  # int64 (nodes,): parent node (-1 for a first block)
    root: np.ndarray         # uint64 (n,): namespace root key of each request
    block: int = G

    @property
    def num_nodes(self) -> int:
        return len(self.node_key)

    @property
    def prompt_blocks(self) -> np.ndarray:
        """Full G-blocks of each prompt (the first ones of each request's ids)."""
        return self.lengths // self.block

    def prompt_block_mask(self) -> np.ndarray:
        """Boolean mask over ``ids``: True for blocks that lie inside the prompt."""
        counts = np.diff(self.blk_off)
        pos = np.arange(len(self.ids), dtype=np.int64) - np.repeat(self.blk_off[:-1], counts)
        return pos < np.repeat(self.prompt_blocks, counts)


def namespace_roots(trace: Trace, salt: bool = True, lora: bool = True) -> np.ndarray:
    """Root key per request: requests share prefixes only under equal roots.

    vLLM puts the cache salt into block 0's extra keys and the LoRA name into every block
    (docs/engines/apc.md §1.3); SGLang's extra_key is cache_salt + lora id
    (docs/engines/radix.md §1.2). Either way a (salt, lora) pair is a separate namespace.
    """
    n = len(trace)
    s = (trace.cache_salt.astype(np.int64) + 1) if salt else np.zeros(n, np.int64)
    a = (trace.lora.astype(np.int64) + 1) if lora else np.zeros(n, np.int64)
    code = (s << np.int64(32)) | a
    return _mix(code.astype(np.uint64) + np.uint64(0x51ED27))


def _mix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    x[x == 0] = 1
    return x


def output_extensions(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """What each request adds to the cache after its prompt: logged outputs minus the last
    token (empty where the output ids are unknown)."""
    n = len(trace)
    lens = np.diff(trace.output_offsets)
    keep = np.where(trace.output_known, np.maximum(lens - 1, 0), 0)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(keep, out=offsets[1:])
    if offsets[-1] == 0:
        return np.zeros(0, np.int64), offsets
    row = np.repeat(np.arange(n), keep)
    src = trace.output_offsets[:-1][row] + (np.arange(offsets[-1]) - offsets[:-1][row])
    return np.asarray(trace.output_tokens, np.int64)[src], offsets


def build_prefix_index(
    tokens: np.ndarray,
    offsets: np.ndarray,
    root: np.ndarray,
    ext_tokens: np.ndarray | None = None,
    ext_offsets: np.ndarray | None = None,
    progress: Progress | None = None,
) -> PrefixIndex:
    """Scan the requests in order and return their reuse and the level-1 block tree."""
    n = len(offsets) - 1
    offsets = np.asarray(offsets, np.int64)
    if ext_tokens is None or ext_offsets is None:
        ext_tokens, ext_offsets = np.zeros(0, tokens.dtype), np.zeros(n + 1, np.int64)
    ext_tokens = np.asarray(ext_tokens).astype(tokens.dtype, copy=False)
    lengths = np.diff(offsets)
    seq_len = lengths + np.diff(ext_offsets)
    blk_off = np.zeros(n + 1, np.int64)
    np.cumsum(seq_len // G, out=blk_off[1:])
    total_blocks = int(blk_off[-1])
    ids = np.empty(total_blocks, np.int64)
    k_blocks = np.zeros(n, np.int64)
    src1 = np.full(n, -1, np.int64)

    # level 1: full blocks
    keys, vals = new_table(2 * max(8, min(total_blocks, _INITIAL_NODES)))
    id_cap = max(8, min(total_blocks, _INITIAL_NODES))
    id_key = np.zeros(id_cap, np.uint64)
    id_first = np.zeros(id_cap, np.int64)
    id_parent = np.zeros(id_cap, np.int64)
    n_ids = 0

    def scan_blocks(i: int, stop: int) -> int:
        nonlocal keys, vals, n_ids, id_key, id_first, id_parent
        i, n_ids = K.scan_blocks(tokens, offsets, ext_tokens, ext_offsets, root, G, i, stop, keys, vals,
                                 n_ids, id_key, id_first, id_parent, blk_off, ids, k_blocks, src1)
        if i < stop:  # the table or the node arrays are full: grow them
            need = n_ids + int(seq_len[i] // G) + 1
            keys, vals = grow_table(keys, vals, max(need, len(keys)))
            if need > len(id_key):
                new_cap = max(2 * len(id_key), need)
                id_key, id_first, id_parent = (_resize(a, new_cap) for a in (id_key, id_first, id_parent))
        return i

    _scan_in_chunks(offsets, scan_blocks, progress, lambda n: n // 2)
    id_key, id_first, id_parent = id_key[:n_ids], id_first[:n_ids], id_parent[:n_ids]
    del keys, vals

    # level 2: tokens inside the first unseen block, under parents where someone stops
    has_query = k_blocks * G < lengths
    is_qparent = np.zeros(max(n_ids, 1), np.bool_)
    qp = k_blocks[has_query] > 0
    q_rows = np.flatnonzero(has_query)[qp]
    is_qparent[ids[blk_off[q_rows] + k_blocks[q_rows] - 1]] = True
    keys, vals = new_table(_INITIAL_PARTIALS)
    extra = np.zeros(n, np.int64)
    src2 = np.full(n, -1, np.int64)
    n_ent = 0

    def scan_tokens(i: int, stop: int) -> int:
        nonlocal keys, vals, n_ent
        i, n_ent = K.scan_tokens(tokens, offsets, ext_tokens, ext_offsets, root, G, i, stop, keys, vals,
                                 n_ent, k_blocks, ids, blk_off, id_key, is_qparent, extra, src2)
        if i < stop:  # the table is full: grow it
            keys, vals = grow_table(keys, vals, 2 * len(keys))
        return i

    _scan_in_chunks(offsets, scan_tokens, progress, lambda n: n - n // 2)
    reuse = k_blocks * G + extra
    source = np.where(extra > 0, src2, src1)
    source[reuse == 0] = -1
    return PrefixIndex(reuse=reuse, source=source, lengths=lengths, blk_off=blk_off, ids=ids,
                       node_key=id_key, node_first=id_first, node_parent=id_parent, root=root)


def _chunks(offsets: np.ndarray):
    """Request ranges of about _CHUNK_TOKENS prompt tokens each."""
    n = len(offsets) - 1
    start = 0
    while start < n:
        stop = int(np.searchsorted(offsets, offsets[start] + _CHUNK_TOKENS, side="right")) - 1
        stop = min(max(stop, start + 1), n)
        yield start, stop
        start = stop


def _scan_in_chunks(offsets: np.ndarray, scan: Callable[[int, int], int], progress: Progress | None,
                    share: Callable[[int], int]) -> None:
    """Run a level's kernel over all requests, chunk by chunk (see :func:`_chunks`).

    ``scan(i, stop)`` scans requests ``i..stop-1`` and returns where it stopped: before
    ``stop`` only when its table was full, which it has grown, so the scan resumes there.
    ``progress`` gets ``share(tokens)`` of each chunk's prompt tokens (the two levels split
    them)."""
    for start, stop in _chunks(offsets):
        i = start
        while i < stop:
            i = scan(i, stop)
        if progress is not None:
            progress(share(int(offsets[stop] - offsets[start])))


def _resize(a: np.ndarray, size: int) -> np.ndarray:
    out = np.zeros(size, a.dtype)
    out[:len(a)] = a
    return out


def reference_reuse(trace_prompts: list[np.ndarray], roots: list[int] | None = None,
                    extensions: list[np.ndarray] | None = None) -> np.ndarray:
    """Obviously-correct slow model: longest common prefix with any earlier cached sequence
    in the same namespace (tests compare the fast scan against it)."""
    out = []
    for i, p in enumerate(trace_prompts):
        best = 0
        for j in range(i):
            if roots is not None and roots[j] != roots[i]:
                continue
            q = trace_prompts[j] if extensions is None else np.concatenate([trace_prompts[j], extensions[j]])
            m = min(len(p), len(q))
            c = 0
            while c < m and p[c] == q[c]:
                c += 1
            best = max(best, c)
        out.append(best)
    return np.asarray(out, np.int64)
