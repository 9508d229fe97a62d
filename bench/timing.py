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


def _reference_work() -> int:
    """A fixed slice of the kind of work the agent does: small tuples and dicts, lookups, arithmetic."""
    counts: dict[tuple[int, str], int] = {}
    for i in range(200_000):
        key = (i & 1023, "gpu")
        counts[key] = counts.get(key, 0) + i
    return len(counts)


def machine_reference(runs: int = 7) -> str:
    """The CPU model and the median CPU time of a fixed pure-Python workload, printed beside a benchmark's figures.

    Why: "% of a core" depends on the core. Two sessions' VMs ran the same commit of the agent at 1.2 % and
    2.2 %, so a figure is only comparable with another one next to the time this same workload took there."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    _, cpu = median_wall_cpu(_reference_work, runs)
    return f"{model}, reference workload {cpu * 1000:.1f} ms (bench/timing.py machine_reference)"
