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
    # cond None because an input is missing now (a source stale, a poll failed), not because the value sits
    # between the thresholds: a tracker with an input-gap grace keeps its fire hold running through it
    input_gap: bool = False
    # This observation's condition fires only once it has held at least this long, even where its detector's own
    # fire hold is shorter: one detector can hold its causes apart (a hung GPU longer than a lost one).
    min_fire_seconds: float = 0.0


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
    gap_since: float | None = None  # the fire hold runs on through an input gap that began then


class Tracker:
    """Hysteresis in time for one detector, per target key.

    `gap_grace` (seconds, 0: none): an observation that is unknown because an input is missing
    (`Observation.input_gap`) keeps a running fire hold going for up to that long, instead of restarting it.
    Why: a slow warning held for minutes (a cold plate's R above its references) whose inputs drop out for a
    few polls on a loaded host (a CDU poll that times out, an NVML read that fails) would otherwise start its
    hold again at every gap and warn late or never. It never fires on a gap: only a True observation fires, and
    a gap longer than the grace restarts the hold as before."""

    def __init__(self, hold: Hold, consecutive: int = 1, gap_grace: float = 0.0):
        self.hold = hold
        self.consecutive = consecutive
        self.gap_grace = gap_grace
        self.keys: dict[Targets, _KeyState] = {}

    def observe(self, obs: Observation, now: float) -> str | None:
        st = self.keys.setdefault(obs.targets, _KeyState())
        new_sample = obs.sample_ts is None or obs.sample_ts != st.last_ts
        st.last_ts = obs.sample_ts if obs.sample_ts is not None else st.last_ts
        if obs.cond is None and obs.input_gap and self.gap_grace > 0 and st.set_since is not None and not st.active:
            st.gap_since = now if st.gap_since is None else st.gap_since
            if now - st.gap_since <= self.gap_grace:
                return None
        st.gap_since = None
        if obs.cond:
            st.clear_since = None
            if new_sample:
                st.count += 1
            if st.set_since is None:
                st.set_since = now
            fire_after = max(self.hold.fire_seconds, obs.min_fire_seconds)
            if not st.active and st.count >= self.consecutive and now - st.set_since >= fire_after:
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
