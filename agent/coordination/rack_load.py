"""The rack's median busy GPU, from the trays' load summaries: the reference a straggler tray is judged against.

Why: in a job that spans trays every GPU waits for the slowest, and a tray whose GPUs all run slow (a tray-wide
power cap, a warm cold-plate loop, a firmware clock policy) looks healthy against its own node's median. The
rack sees it: each tray's link vector carries its busy GPUs' median SM clock (agent.coordination.link_vectors),
and every agent takes the median of those tray medians here, so each agent holds the same reference.

A pure function of the vectors and the clock, like the NVLink attribution beside it: only fresh vectors count
(a tray whose vector is older than `max_age` says nothing of now), only trays with at least one busy GPU that
reported a clock, and only when at least `min_trays` of them do (with fewer, one slow tray would be half the
reference). The median of tray medians, not of every GPU: each tray weighs the same, so one tray with many
GPUs cannot pull the reference towards itself. Only the clock, not the power: trays run different jobs at
different operating points, but a clock below the others is what makes a synchronous job wait.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Mapping

from agent.coordination.link_vectors import LinkVector

MIN_TRAYS = 3


@dataclass(frozen=True, slots=True)
class RackLoad:
    sm_clock_hertz: float | None  # the median of the busy trays' median SM clocks; None: no reference
    trays: tuple[str, ...]  # the trays that counted


def rack_load(vectors: Mapping[str, LinkVector], now: float, max_age: float, min_trays: int = MIN_TRAYS) -> RackLoad:
    clocks = {node: v.load.sm_clock_hertz for node, v in vectors.items()
              if now - v.at <= max_age and v.load is not None and v.load.busy > 0 and v.load.sm_clock_hertz}
    trays = tuple(sorted(clocks))
    if len(trays) < min_trays:
        return RackLoad(None, trays)
    return RackLoad(statistics.median(clocks[n] for n in trays), trays)
