"""The one timing loop of the benchmarks: median wall and CPU time of repeated calls."""

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
