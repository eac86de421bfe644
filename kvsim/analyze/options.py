"""Settings of ``kvsim analyze`` (the CLI fills them from its options)."""
from __future__ import annotations

from dataclasses import dataclass

from kvsim.errors import ConfigError

DEFAULT_BLOCK_SIZES = (16, 32, 64, 128, 256, 512)


@dataclass
class AnalyzeOptions:
    """What to compute and show. The defaults are what the CLI uses."""

    block_sizes: tuple[int, ...] = DEFAULT_BLOCK_SIZES
    top: int = 10                    # shared prefixes / divergence sites listed
    show_text: bool = False          # raw prompt text in the report (logs are sensitive)
    model: str | None = None         # model shape for GiB figures (kvsim.models)
    progress: bool = False           # progress bar on stderr for long inputs
    # divergence / volatile-content detection
    max_skip: int = 1024             # longest divergent span searched for re-convergence
    window: int = 8                  # tokens that must match to call it re-converged
    min_run: int = 32                # shared tokens after the span for it to matter
    volatile_span: int = 32          # spans up to this long on both sides are "volatile values"
    min_site_requests: int = 2       # requests diverging at a site for it to be reported
    # sessions / scheduling
    burst_seconds: float = 1.0       # reuse from a request this recent needs cache-aware scheduling
    heuristic_chars: int = 200       # the seed article's prefix length (characters)
    warmup: object = None            # kvsim.warmup: these first requests seed reuse but are not counted

    def __post_init__(self) -> None:
        sizes = tuple(int(b) for b in self.block_sizes)
        if not sizes or any(b < 1 for b in sizes):
            raise ConfigError(f"--block-sizes must be positive integers, got {self.block_sizes!r}")
        self.block_sizes = tuple(sorted(set(sizes)))
        if self.top < 1:
            raise ConfigError(f"--top must be at least 1, got {self.top}")
        if self.window < 1 or self.max_skip < 1 or self.min_run < self.window:
            raise ConfigError("divergence settings need window >= 1, max_skip >= 1, min_run >= window")


def parse_block_sizes(text: str) -> tuple[int, ...]:
    """'16,32,64' -> (16, 32, 64), with a clear error for anything else."""
    try:
        sizes = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise ConfigError(f"--block-sizes must be a comma list of integers, got {text!r}") from None
    if not sizes or any(b < 1 for b in sizes):
        raise ConfigError(f"--block-sizes must be positive integers, got {text!r}")
    return sizes
