"""Compiled inner loops of the analyzer (numba): an open-addressing hash table, the
two-level longest-earlier-prefix scan, sequence alignment and LRU stack distances. Prefix
keys are APC's chained 64-bit hash (:mod:`kvsim.engines.vllm.hashing`): a block's key from
its parent's and its tokens, a partial block's from the same state after fewer tokens.
Spans (a system message, an alignment window) get an unchained fingerprint (``step``),
which also names the shared prefixes in the report. Everything here works on flat numpy arrays; the modules around it give the
numbers their meaning.

Hash tables are arrays ``keys`` (uint64, 0 = empty slot) and ``vals`` (int64), with a
power-of-two capacity and linear probing. Kernels that insert stop *before* a request
that could push the load over one half and return its index; the caller grows the table
(:func:`grow_table`) and calls again from there.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from kvsim.engines.vllm.hashing import block_end, block_start, block_token
from kvsim.kernels.table import probe

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)
_K1 = np.uint64(0xD6E8FEB86659FD93)
_K2 = np.uint64(0xA0761D6478BD642F)
H0 = np.uint64(0x243F6A8885A308D3)  # start value of a span fingerprint


@nb.njit(inline="always")
def mix64(x):
    """splitmix64 finalizer: a bijective 64-bit mixer."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


@nb.njit(inline="always")
def step(h, tok, t):
    """Add token ``tok`` at position ``t`` to a span fingerprint (an order-aware sum of
    mixed terms; not a prefix key: those are APC's chained hash)."""
    return h + mix64(nb.uint64(nb.int64(tok)) * _K1 + nb.uint64(t) * _GOLD + _K2)


@nb.njit(inline="always")
def _tok(tok, off, ext, eoff, i, L, p):
    """Token p of request i's cached sequence: prompt, then the extension (outputs)."""
    if p < L:
        return tok[off[i] + p]
    return ext[eoff[i] + p - L]


@nb.njit(cache=True)
def scan_blocks(tok, off, ext, eoff, root, G, start, stop, keys, vals, n_ids,
                id_key, id_first, id_parent, blk_off, ids_flat, k_out, src_out):
    """Level 1: chained keys of every full G-token block, in arrival order.

    For request i: ``k_out[i]`` = leading full prompt blocks some earlier request also had,
    ``src_out[i]`` = the first request that had the prefix of k_out[i] blocks (-1 if none).
    Every full block of the cached sequence (prompt + extension) gets a dense node id in
    ``ids_flat[blk_off[i] + b]``; a new node records its key, first request and parent id.
    Returns (next request, node count); stops early when the table or id arrays are full.
    """
    cap = len(keys)
    for i in range(start, stop):
        L = off[i + 1] - off[i]
        S = L + (eoff[i + 1] - eoff[i])
        nfull = S // G
        if 2 * (n_ids + nfull) > cap or n_ids + nfull > len(id_key):
            return i, n_ids
        qfull = L // G
        parent = root[i]
        parent_id = -1
        matching = True
        k = 0
        src = -1
        for b in range(nfull):
            h = block_start(parent, 0, 0)
            base = b * G
            if base + G <= L:
                o = off[i] + base
                for t in range(G):
                    h = block_token(h, tok[o + t], t)
            else:
                for t in range(G):
                    h = block_token(h, _tok(tok, off, ext, eoff, i, L, base + t), t)
            key = block_end(h, G)
            s = probe(keys, key)
            if keys[s] == key:
                vid = vals[s]
                if matching and b < qfull:
                    k += 1
                    src = id_first[vid]
                else:
                    matching = False
            else:
                matching = False
                vid = n_ids
                keys[s] = key
                vals[s] = vid
                id_key[vid] = key
                id_first[vid] = i
                id_parent[vid] = parent_id
                n_ids += 1
            ids_flat[blk_off[i] + b] = vid
            parent = key
            parent_id = vid
        k_out[i] = k
        src_out[i] = src
    return stop, n_ids


@nb.njit(cache=True)
def scan_tokens(tok, off, ext, eoff, root, G, start, stop, keys, vals, n_ent,
                k_blocks, ids_flat, blk_off, id_key, is_qparent, extra_out, src_out):
    """Level 2: refine each request's reuse inside its first unseen block, token by token.

    Request i looks up the partial prefixes of prompt block ``k_blocks[i]`` (keyed by the
    parent block); ``extra_out[i]`` = how many of its tokens an earlier request also had
    under that parent, ``src_out[i]`` = the first such request. Partial prefixes are
    stored only for new blocks whose parent is some request's query parent
    (``is_qparent``) or the root, which is all the queries can ever ask for.
    Returns (next request, entry count).
    """
    cap = len(keys)
    for i in range(start, stop):
        L = off[i + 1] - off[i]
        S = L + (eoff[i + 1] - eoff[i])
        k = k_blocks[i]
        nall = (S + G - 1) // G
        need = 0
        for b in range(k, nall):
            if b == 0 or is_qparent[ids_flat[blk_off[i] + b - 1]]:
                need += min(G, S - b * G)
        if 2 * (n_ent + need) > cap:
            return i, n_ent
        e = 0
        src = -1
        if k * G < L:
            parent = root[i] if k == 0 else id_key[ids_flat[blk_off[i] + k - 1]]
            h = block_start(parent, 0, 0)
            o = off[i] + k * G
            for t in range(min(G, L - k * G)):
                h = block_token(h, tok[o + t], t)
                pk = block_end(h, t + 1)
                s = probe(keys, pk)
                if keys[s] != pk:
                    break
                e = t + 1
                src = vals[s]
        extra_out[i] = e
        src_out[i] = src
        for b in range(k, nall):
            if b > 0 and not is_qparent[ids_flat[blk_off[i] + b - 1]]:
                continue
            parent = root[i] if b == 0 else id_key[ids_flat[blk_off[i] + b - 1]]
            h = block_start(parent, 0, 0)
            for t in range(min(G, S - b * G)):
                h = block_token(h, _tok(tok, off, ext, eoff, i, L, b * G + t), t)
                pk = block_end(h, t + 1)
                s = probe(keys, pk)
                if keys[s] != pk:
                    keys[s] = pk
                    vals[s] = i
                    n_ent += 1
    return stop, n_ent


@nb.njit(cache=True)
def span_hashes(tok, starts, lens):
    """One 64-bit content hash per token span (e.g. a system message)."""
    out = np.empty(len(starts), np.uint64)
    for i in range(len(starts)):
        h = H0
        for t in range(lens[i]):
            h = step(h, tok[starts[i] + t], t)
        out[i] = mix64(h + nb.uint64(lens[i]))
    return out


@nb.njit(cache=True)
def common_prefix(a, a0, a1, b, b0, b1):
    """Length of the common prefix of a[a0:a1] and b[b0:b1]."""
    n = min(a1 - a0, b1 - b0)
    for t in range(n):
        if a[a0 + t] != b[b0 + t]:
            return t
    return n


@nb.njit(cache=True)
def realign(a, a0, a1, b, b0, b1, max_skip, window):
    """Where a[a0:a1] and b[b0:b1] (which differ at their first token) run together again.

    Finds skips (da, db), both <= max_skip, with the smallest da + db such that ``window``
    tokens match at a0 + da and b0 + db, and returns (da, db, run) where run is the length
    of the common run from there; (-1, -1, 0) when there is none.
    """
    na = min(a1 - a0 - window, max_skip)
    nb_ = min(b1 - b0 - window, max_skip)
    if na < 0 or nb_ < 0:
        return -1, -1, 0
    # window hashes of b, sorted, for binary search
    hb = np.empty(nb_ + 1, np.uint64)
    for j in range(nb_ + 1):
        h = H0
        for t in range(window):
            h = step(h, b[b0 + j + t], t)
        hb[j] = h
    order = np.argsort(hb, kind="mergesort")  # stable: equal hashes keep increasing db
    sh = hb[order]
    best_a, best_b = -1, -1
    for da in range(na + 1):
        if best_a >= 0 and da >= best_a + best_b:
            break
        h = H0
        for t in range(window):
            h = step(h, a[a0 + da + t], t)
        lo, hi = 0, nb_ + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if sh[mid] < h:
                lo = mid + 1
            else:
                hi = mid
        while lo <= nb_ and sh[lo] == h:
            db = order[lo]
            if best_a >= 0 and da + db >= best_a + best_b:
                break
            same = True
            for t in range(window):
                if a[a0 + da + t] != b[b0 + db + t]:
                    same = False
                    break
            if same:
                best_a, best_b = da, db
                break
            lo += 1
    if best_a < 0:
        return -1, -1, 0
    run = common_prefix(a, a0 + best_a, a1, b, b0 + best_b, b1)
    return best_a, best_b, run


@nb.njit(cache=True)
def realign_many(tok, off, rows, cand, pos, max_skip, window, da_out, db_out, run_out):
    """:func:`realign` for request rows[k] against request cand[k], both from pos[k]."""
    for k in range(len(rows)):
        i = rows[k]
        j = cand[k]
        p = pos[k]
        if j < 0 or off[i] + p >= off[i + 1] or off[j] + p >= off[j + 1]:
            da_out[k], db_out[k], run_out[k] = -1, -1, 0
            continue
        da, db, run = realign(tok, off[i] + p, off[i + 1], tok, off[j] + p, off[j + 1], max_skip, window)
        da_out[k], db_out[k], run_out[k] = da, db, run


@nb.njit(cache=True)
def find_anchor(tok, off, rows, pos, anchor, max_skip):
    """First position q in [pos, pos + max_skip] of each request where ``anchor`` starts
    (-1 when absent)."""
    out = np.full(len(rows), -1, np.int64)
    w = len(anchor)
    for k in range(len(rows)):
        i = rows[k]
        base = off[i] + pos
        last = min(off[i + 1] - w, base + max_skip)
        for q in range(base, last + 1):
            same = True
            for t in range(w):
                if tok[q + t] != anchor[t]:
                    same = False
                    break
            if same:
                out[k] = q - off[i]
                break
    return out


@nb.njit(cache=True)
def rotate_spans(tok, off, rows, lo, hi, end):
    """In place: move tokens [lo, hi) of each request to just before ``end`` (so the
    tokens [hi, end) come first)."""
    for k in range(len(rows)):
        o = off[rows[k]]
        span = tok[o + lo[k]:o + hi[k]].copy()
        n_after = end[k] - hi[k]
        for t in range(n_after):
            tok[o + lo[k] + t] = tok[o + hi[k] + t]
        for t in range(len(span)):
            tok[o + end[k] - len(span) + t] = span[t]


@nb.njit(cache=True)
def runs_against(tok, off, rows, at, ref_start, ref_end):
    """Common run of each request from its position ``at`` with tok[ref_start:ref_end]."""
    out = np.zeros(len(rows), np.int64)
    for k in range(len(rows)):
        i = rows[k]
        out[k] = common_prefix(tok, off[i] + at[k], off[i + 1], tok, ref_start, ref_end)
    return out


@nb.njit(cache=True)
def pair_prefixes(tok, off, a_rows, ext_tok, ext_off, b_rows, b_use_ext, max_skip, window, out):
    """For each pair (a, b): compare prompt a with prompt b followed by b's extension.

    out[k] = (common prefix, length of b's sequence, da, db, run) where (da, db, run)
    is :func:`realign` after the first difference (-1 when none).
    """
    for k in range(len(a_rows)):
        a = a_rows[k]
        b = b_rows[k]
        la = off[a + 1] - off[a]
        lb = off[b + 1] - off[b]
        le = ext_off[b + 1] - ext_off[b] if b_use_ext[k] else 0
        seq = np.empty(lb + le, tok.dtype)
        seq[:lb] = tok[off[b]:off[b + 1]]
        if le > 0:
            for t in range(le):
                seq[lb + t] = ext_tok[ext_off[b] + t]
        c = common_prefix(tok, off[a], off[a + 1], seq, 0, lb + le)
        out[k, 0] = c
        out[k, 1] = lb + le
        if c < la and c < lb + le:
            da, db, run = realign(tok, off[a] + c, off[a + 1], seq, c, lb + le, max_skip, window)
        else:
            da, db, run = -1, -1, 0
        out[k, 2] = da
        out[k, 3] = db
        out[k, 4] = run
