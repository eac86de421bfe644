"""LMCache 0.5.6 under vLLM, readable (``docs/engines/offload.md §2``).

1. Keys: the prompt is cut into ``chunk_size`` chunks (256 by default); chunk k's key chains
   the keys of chunks 0..k-1 and hashes tokens only (no LoRA, no cache salt: LMCache ignores
   extra keys); a trailing partial chunk has no key unless ``save_unfull_chunk`` (offload.md §2.2).
2. Storage: a local CPU tier, LRU over chunks, each chunk in a slot of
   ``round_up(chunk bytes, 4096)``; a store allocates one slot per chunk, evicting the least
   recent unpinned chunk while the pool is full, and stops at the first chunk it cannot
   place; a chunk already present is not put again and keeps its place (offload.md §2.3).
3. Lookup across tiers: each tier counts the consecutive chunks it holds from where the
   previous one stopped (a tier with none is skipped); vLLM's lookup pins the hits and
   moves them to the recent end, tail first, so the head is the most recent (offload.md §2.4).
4. What vLLM is told: ``need = hit - GPU hit``, minus one on a full-prompt hit, 0 below
   ``min_retrieve_tokens``, capped to whole chunks by ``max_tokens_per_load`` (offload.md §2.6).
5. What is saved: full chunks of the prompt as it is computed, skipping what LMCache held at
   the lookup; the tail and decode tokens only with ``save_unfull_chunk`` /
   ``save_decode_cache`` (offload.md §2.7).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from kvsim.errors import ConfigError

ALIGNMENT = 4096                 # the local CPU allocator's slot alignment


@dataclass(frozen=True)
class LMCacheSettings:
    """``LMCacheEngineConfig`` and the vLLM adapter's knobs (offload.md §2.1)."""

    chunk_bytes: int                     # KV bytes of one full chunk (layers x K,V x chunk x heads x dim x dtype)
    chunk_size: int = 256
    max_local_cpu_size: float = 5.0      # GiB (the config's "GB" is 2**30 bytes)
    save_unfull_chunk: bool = False
    save_decode_cache: bool = False
    min_retrieve_tokens: int = 0
    max_tokens_per_load: int = 0         # 0: no cap ("lmcache.max_tokens_per_load")

    def __post_init__(self) -> None:
        if self.chunk_size <= 0 or self.chunk_bytes <= 0:
            raise ConfigError("LMCache chunk_size and chunk bytes must be positive")
        if self.max_local_cpu_size < 0:
            raise ConfigError("max_local_cpu_size must be >= 0")

    @property
    def cpu_chunks(self) -> int:
        return num_cpu_chunks(self.max_local_cpu_size, self.chunk_bytes)


def num_cpu_chunks(max_local_cpu_size_gib: float, chunk_bytes: int) -> int:
    """Full chunks the local CPU tier holds: its bytes over 4 KiB-aligned slots (offload.md §2.3)."""
    slot = -(-chunk_bytes // ALIGNMENT) * ALIGNMENT
    return int(max_local_cpu_size_gib * 1024**3) // slot


def chunk_keys(tokens: Sequence[int], chunk_size: int, save_unfull_chunk: bool = False) -> list[int]:
    """LMCache's prefix-hash chain over chunks, tokens only (offload.md §2.2)."""
    end = len(tokens) if save_unfull_chunk else len(tokens) - len(tokens) % chunk_size
    keys, parent = [], 0
    for start in range(0, end, chunk_size):
        parent = hash((parent, tuple(tokens[start:start + chunk_size])))
        keys.append(parent)
    return keys


class LRUTier:
    """One storage tier: chunks oldest first, each with its pin count (``LocalCPUBackend``)."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self.chunks: OrderedDict[Hashable, int] = OrderedDict()   # key -> pins
        self.evictions = 0

    def __len__(self) -> int:
        return len(self.chunks)

    def prefix_hits(self, keys: Sequence[Hashable]) -> int:
        n = 0
        for k in keys:
            if k not in self.chunks:
                break
            n += 1
        return n

    def put(self, key: Hashable) -> bool:
        """Insert at the recent end; a chunk already present keeps its place."""
        if key in self.chunks:
            return False
        self.chunks[key] = 0
        return True

    def evict_one(self) -> bool:
        """Remove the least recent unpinned chunk, if any."""
        for k, pins in self.chunks.items():
            if pins == 0:
                del self.chunks[k]
                self.evictions += 1
                return True
        return False


@dataclass
class StoreResult:
    stored: list[Hashable] = field(default_factory=list)      # newly put
    present: list[Hashable] = field(default_factory=list)     # already there (not moved)
    dropped: list[Hashable] = field(default_factory=list)     # no slot: this and every later chunk


class LMCacheStorage:
    """``StorageManager`` over the local CPU tier (the allocator) and optional further tiers."""

    def __init__(self, cpu_chunks: int, more: Sequence[LRUTier] = ()) -> None:
        self.cpu = LRUTier("LocalCPUBackend", cpu_chunks)
        self.tiers = [self.cpu, *more]
        self._pins: dict[str, list[tuple[LRUTier, list[Hashable]]]] = {}

    def batched_contains(self, keys: Sequence[Hashable]) -> list[tuple[LRUTier, int]]:
        """Per tier, the chunks of the hit it holds: a hit may span tiers (offload.md §2.4)."""
        out, i = [], 0
        for tier in self.tiers:
            n = tier.prefix_hits(keys[i:])
            if n == 0:
                continue            # this tier holds none from here: the next one may
            out.append((tier, n))
            i += n
            if i == len(keys):
                break
        return out

    def lookup(self, keys: Sequence[Hashable], lookup_id: str | None = None, pin: bool = False) -> int:
        """Chunks of ``keys`` held as a prefix; with ``pin`` (vLLM's lookup) the hits are pinned
        until :meth:`lookup_unpin` and moved to the recent end tail first."""
        parts = self.batched_contains(keys)
        if pin:
            assert lookup_id is not None
            pinned, i = [], 0
            for tier, n in parts:
                got = list(keys[i:i + n])
                for k in got:
                    tier.chunks[k] += 1
                pinned.append((tier, got))
                i += n
            self._pins[lookup_id] = pinned   # a second lookup of the same id replaces the record
            for tier, got in pinned:
                if tier.name in ("LocalCPUBackend", "LocalDiskBackend"):
                    for k in reversed(got):
                        tier.chunks.move_to_end(k)
        return sum(n for _, n in parts)

    def lookup_unpin(self, lookup_id: str) -> None:
        for tier, got in self._pins.pop(lookup_id, []):
            for k in got:
                if k in tier.chunks and tier.chunks[k] > 0:
                    tier.chunks[k] -= 1

    def store(self, keys: Sequence[Hashable]) -> StoreResult:
        """``LMCacheEngine.store`` of these chunks: a slot per chunk first (evicting as needed;
        the first chunk without one ends the store), then the puts (offload.md §2.3)."""
        cpu, res = self.cpu, StoreResult()
        allocated = 0
        for k in keys:
            while len(cpu) + allocated >= cpu.capacity:
                if not cpu.evict_one():
                    break
            if len(cpu) + allocated >= cpu.capacity:
                res.dropped = list(keys[allocated:])
                break
            allocated += 1
        for k in keys[:allocated]:
            for tier in self.tiers[1:]:     # further tiers: written through, own LRU (not run here)
                if k not in tier.chunks and len(tier) >= tier.capacity and not tier.evict_one():
                    continue
                tier.put(k)
            (res.stored if cpu.put(k) else res.present).append(k)
        return res


def need_tokens(hit: int, local: int, num_tokens: int, settings: LMCacheSettings) -> tuple[int, int]:
    """(tokens vLLM loads, tokens LMCache counts as held) for a lookup hit (offload.md §2.6).

    ``hit``: LMCache's prefix hit in tokens; ``local``: vLLM's GPU hit; ``num_tokens``: the
    request's tokens (the prompt, for a new request)."""
    need = hit - local
    if hit == num_tokens:
        need -= 1                           # a full-prompt hit recomputes its last token
    below_min = settings.min_retrieve_tokens > 0 and need < settings.min_retrieve_tokens
    held, c = hit, settings.chunk_size
    if settings.max_tokens_per_load > 0 and need > settings.max_tokens_per_load:
        cap = settings.max_tokens_per_load // c * c
        need, held = cap, (local + cap) // c * c
    if below_min or need <= 0:
        return 0, held
    return need, held


class SaveTracker:
    """The adapter's save rule for one request (``RequestTracker`` + ``ReqMeta``, offload.md §2.7)."""

    def __init__(self, prompt_len: int, held: int, settings: LMCacheSettings) -> None:
        self.prompt_len = prompt_len
        self.saved = held                  # num_saved_tokens starts at what LMCache held
        self.settings = settings
        self.decode = False

    def step(self, tokens_after_step: int, new_tokens: int, first: bool = False) -> tuple[int, int] | None:
        """Scheduled ``new_tokens`` reaching ``tokens_after_step`` (``first``: the request's
        first scheduling): the token range ``[skip, end)`` to store this step, or None."""
        s, c = self.settings, self.settings.chunk_size
        if not first and new_tokens == 1:   # one token on a later step: "decode phase", for good
            self.decode = True
        boundary = -(-(self.saved + 1) // c) * c
        if (self.saved > 0 and tokens_after_step < boundary) or (self.decode and not s.save_decode_cache):
            return None
        last_prefill = tokens_after_step >= self.prompt_len
        end = tokens_after_step if last_prefill and s.save_unfull_chunk else tokens_after_step // c * c
        skip = self.saved
        self.saved = end
        if skip >= end:
            return None
        return skip // c * c, end
