"""The dry history of every leak detector: when it last read wet, since when it has read dry without a gap.

Why: nothing a leak did may be undone (a resume, a power on, a valve opened) until every detector of the
leak's scope has read dry for `leak_scope.dry_hold_seconds`, and the person who approves it must see why
that is so. A detector that cannot be read (not ok, a sensor fault, its source down, its series gone) is not
dry: its dry time starts again at its next dry reading. Times are the readings' own timestamps, so the rule
runs on whatever clock the readings carry (a test's, the agent's); the hold is judged against the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

DRY, WET, UNREADABLE = "dry", "wet", "unreadable"


@dataclass
class DetectorHistory:
    zone: str
    sensor: str
    state: str = UNREADABLE
    last_wet_at: float | None = None
    dry_since: float | None = None  # first dry reading after the last wet or unreadable one
    last_read_at: float | None = None

    def as_dict(self, now: float) -> dict[str, Any]:
        dry_for = now - self.dry_since if self.state == DRY and self.dry_since is not None else 0.0
        return {"zone": self.zone, "sensor": self.sensor, "state": self.state, "last_wet_at": self.last_wet_at,
                "dry_since": self.dry_since if self.state == DRY else None, "dry_seconds": round(max(dry_for, 0.0), 1),
                "last_read_at": self.last_read_at}


class DryHistory:
    """Fed by the leak detector on every pass (detectors_cooling.py), read by the resume gate (leak_resume.py)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], DetectorHistory] = {}

    def observe(self, zone: str, sensor: str, state: str, ts: float) -> None:
        row = self.rows.setdefault((zone, sensor), DetectorHistory(zone, sensor))
        if state == WET:
            row.last_wet_at = ts if row.last_wet_at is None else max(row.last_wet_at, ts)
            row.dry_since = None
            row.last_read_at = ts
        elif state == DRY:
            if row.state != DRY or row.dry_since is None:
                row.dry_since = ts
            row.last_read_at = ts
        else:
            row.dry_since = None
        row.state = state

    def vanished(self, seen: Iterable[tuple[str, str]]) -> None:
        """Detectors known before but without any reading now: unreadable (their source went stale).

        Except a Redfish service's stand-in (sensor = the BMC alone: its detectors unnamed before its first walk,
        the leak watch's `source_down` for the whole service) once detectors of that BMC are read by name: it is
        superseded, not unreadable, and kept it would hold every dry hold of its scope unreadable for good."""
        present = set(seen)
        named = {(zone, sensor.split("/", 1)[0]) for zone, sensor in present if "/" in sensor}
        for key, row in list(self.rows.items()):
            if key in present:
                continue
            if "/" not in row.sensor and key in named:
                del self.rows[key]
            elif row.state != UNREADABLE:
                self.observe(row.zone, row.sensor, UNREADABLE, 0.0)

    def verdict(self, member: Callable[[str, str], bool], required: Iterable[tuple[str, str]], now: float,
                hold: float) -> tuple[bool, list[dict[str, Any]]]:
        """(every detector of the scope dry for `hold`, each one's history). `member(zone, sensor)` picks the
        scope's detectors among those read; `required` (the ones that fired the leak) count even if never read
        here (then they are unreadable: not dry)."""
        keys = {k for k in self.rows if member(*k)} | set(required)
        rows = [self.rows.get(k) or DetectorHistory(*k) for k in sorted(keys)]
        views = [r.as_dict(now) for r in rows]
        dry = bool(rows) and all(r.state == DRY and r.dry_since is not None and now - r.dry_since >= hold
                                 for r in rows)
        return dry, views
