"""Timing a callable on the device: CUDA events on a GPU, wall clock elsewhere."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def median_seconds(fn: Callable[[], Any], device: Any, repeats: int, warmup: int = 0) -> float:
    """Median seconds of ``fn()`` over ``repeats`` calls after ``warmup`` untimed ones."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)
