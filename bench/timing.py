"""The timing helpers of the benchmarks: median wall and CPU time of repeated calls, latency percentiles, waits."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def median_wall_cpu(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds of this process) over `runs` calls of `fn`."""
    walls, cpus = [], []
    for _ in range(runs):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus)


def percentiles(samples: list[float]) -> tuple[float, float]:
    """(p50, p99) of latency samples (p99: the sample at the 99th rank, the largest of fewer than 100)."""
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def until(cond: Callable[[], object], timeout: float, what: str, step: float = 0.01):
    """The first truthy value of `cond`, polled every `step` s; TimeoutError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(step)
    return value
