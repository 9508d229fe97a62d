"""Hysteresis in time: turn per-poll tri-state observations into fire/clear events.

Why apart from the detectors: a detector only reads a Snapshot and says, per
target, True (set threshold met), False (clear threshold met) or None (between
the two: keep the current state). Holding a condition for its hold time (and,
for leaks, for a number of consecutive polls, counted on the readings' own
timestamps so other sources' publishes do not count as polls) is the same
machinery for every detector, and restored incidents seed it directly
(restored.py); none of it knows a metric family.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .settings import Hold

Targets = tuple[tuple[str, str], ...]


def targets_of(**kv: str) -> Targets:
    return tuple(sorted((k, str(v)) for k, v in kv.items()))


@dataclass(frozen=True, slots=True)
class Observation:
    detector: str
    targets: Targets
    severity: str
    cond: bool | None
    sample_ts: float | None = None  # for consecutive-poll counting
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Event:
    kind: str  # fire | clear
    detector: str
    targets: dict[str, str]
    severity: str
    detail: Mapping[str, Any]


@dataclass(slots=True)
class _KeyState:
    active: bool = False
    set_since: float | None = None
    clear_since: float | None = None
    count: int = 0
    last_ts: float | None = None


class Tracker:
    """Hysteresis in time for one detector, per target key."""

    def __init__(self, hold: Hold, consecutive: int = 1):
        self.hold = hold
        self.consecutive = consecutive
        self.keys: dict[Targets, _KeyState] = {}

    def observe(self, obs: Observation, now: float) -> str | None:
        st = self.keys.setdefault(obs.targets, _KeyState())
        new_sample = obs.sample_ts is None or obs.sample_ts != st.last_ts
        st.last_ts = obs.sample_ts if obs.sample_ts is not None else st.last_ts
        if obs.cond:
            st.clear_since = None
            if new_sample:
                st.count += 1
            if st.set_since is None:
                st.set_since = now
            if not st.active and st.count >= self.consecutive and now - st.set_since >= self.hold.fire_seconds:
                st.active = True
                return "fire"
            return None
        if new_sample or obs.cond is False:
            st.count = 0
        st.set_since = None
        if obs.cond is None or not st.active:
            st.clear_since = None if obs.cond is None else st.clear_since
            return None
        if st.clear_since is None:
            st.clear_since = now
        if now - st.clear_since >= self.hold.clear_seconds:
            st.active = False
            st.clear_since = None
            return "clear"
        return None

    def active(self) -> list[Targets]:
        return [k for k, s in self.keys.items() if s.active]
