"""Incidents: one per (detector or alertname, targets), with a lifecycle and timestamps.

open -> mitigating -> an outcome (mitigated, partial, failed or observed)
-> resolved. Re-firing an open incident only refreshes it (its playbook
never runs twice); MTTR per detector comes from opened_at -> resolved_at of
incidents that were really mitigated (an outcome other than `mitigated`
says the agent did not fix it, so it must not flatter the MTTR). Every transition is journaled so open incidents
survive a restart with the same id (and so the same action ids).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from .journal import Journal

OUTCOMES = ("mitigated", "partial", "failed", "observed")
STATES = ("open", "mitigating", *OUTCOMES, "resolved")
# Lifecycle rank: an incident only moves forward; the outcomes share one rank.
RANK = {"open": 0, "mitigating": 1, **{o: 2 for o in OUTCOMES}, "resolved": 3}
# Seconds from open to resolved. No incident resolves faster than its detector's clear hold (>= 10 s); one bucket
# per kind of repair: within a minute (the agent's own mitigation, a cap or a valve, and its clear hold), an hour
# (a person at hand: a reset, a reboot), a day (a part replaced); longer is +Inf. Not the 13 buckets of before, of
# which the first two were always empty: with 23 detectors and 8 classes zeroed, each bucket costs 31 series a
# node. Nothing reads a quantile of them; MTTR is _sum / _count, which no bucket choice changes.
DURATION_BUCKETS = (60, 3600, 86400)


def incident_key(detector: str, targets: Mapping[str, str]) -> str:
    return detector + "|" + ",".join(f"{k}={v}" for k, v in sorted(targets.items()))


@dataclass
class Incident:
    id: str
    detector: str
    targets: dict[str, str]
    severity: str
    source: str  # local or alertmanager
    opened_at: float
    state: str = "open"
    mitigating_at: float | None = None
    mitigated_at: float | None = None
    outcome_at: float | None = None  # when the playbook ended, whatever its outcome
    resolved_at: float | None = None
    last_seen: float = 0.0
    playbook: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return incident_key(self.detector, self.targets)

    def duration(self, now: float | None = None) -> float:
        end = self.resolved_at if self.resolved_at is not None else (now if now is not None else time.time())
        return max(0.0, end - self.opened_at)

    def as_dict(self, now: float | None = None) -> dict[str, Any]:
        return {"id": self.id, "detector": self.detector, "targets": self.targets, "severity": self.severity,
                "source": self.source, "state": self.state, "opened_at": self.opened_at,
                "mitigating_at": self.mitigating_at, "mitigated_at": self.mitigated_at,
                "outcome_at": self.outcome_at,
                "resolved_at": self.resolved_at, "duration_seconds": round(self.duration(now), 3),
                "playbook": self.playbook, "detail": self.detail}


class IncidentBook:
    """Thread-safe registry of incidents; also holds the counters the collector exports."""

    def __init__(self, journal: Journal, clock=time.time, keep_resolved: int = 200):
        self.journal = journal
        self.clock = clock
        self._lock = threading.Lock()
        self._open: dict[str, Incident] = {}
        self._recent: list[Incident] = []
        self._keep = keep_resolved
        self.opened_total: dict[tuple[str, str], int] = {}
        self.outcomes_total: dict[tuple[str, str], int] = {}  # (detector, outcome)
        # Histogram of durations per detector: bucket counts, sum, count.
        self.durations: dict[str, tuple[list[int], float, int]] = {}

    def restore(self) -> int:
        """Rebuild open incidents from the journal (called once on start)."""
        latest: dict[str, dict] = {}
        for e in self.journal.entries():
            if e.kind == "incident" and e.incident_id:
                latest[e.incident_id] = {**latest.get(e.incident_id, {}), **e.detail, "state": e.result}
        with self._lock:
            for iid, d in latest.items():
                if d.get("state") == "resolved" or "detector" not in d:
                    continue
                inc = Incident(id=iid, detector=d["detector"], targets=d["targets"], severity=d["severity"],
                               source=d.get("source", "local"), opened_at=d["opened_at"], state=d["state"],
                               mitigating_at=d.get("mitigating_at"), mitigated_at=d.get("mitigated_at"),
                               outcome_at=d.get("outcome_at"),
                               last_seen=self.clock(), playbook=d.get("playbook"),
                               detail=dict(d.get("detail") or {}))
                self._open[inc.key] = inc
            return len(self._open)

    def _log(self, inc: Incident) -> None:
        self.journal.append("incident", incident_id=inc.id, playbook=inc.playbook, result=inc.state,
                            target=json.dumps(inc.targets, sort_keys=True), detail=inc.as_dict())

    def fire(self, detector: str, targets: Mapping[str, str], severity: str, source: str = "local",
             detail: Mapping[str, Any] | None = None) -> tuple[Incident, bool]:
        """Open an incident or refresh the open one; returns (incident, newly_opened)."""
        key = incident_key(detector, targets)
        now = self.clock()
        with self._lock:
            inc = self._open.get(key)
            if inc is not None:
                inc.last_seen = now
                return inc, False
            digest = hashlib.sha1(f"{key}|{now!r}".encode()).hexdigest()[:8]
            inc = Incident(id=f"{detector}-{digest}", detector=detector, targets=dict(targets), severity=severity,
                           source=source, opened_at=now, last_seen=now, detail=dict(detail or {}))
            self._open[key] = inc
            self.opened_total[(detector, severity)] = self.opened_total.get((detector, severity), 0) + 1
        self._log(inc)
        return inc, True

    def transition(self, inc: Incident, state: str) -> None:
        if state not in STATES or RANK[state] <= RANK[inc.state] and state != "resolved":
            return
        now = self.clock()
        with self._lock:
            if inc.state == "resolved":
                return
            inc.state = state
            if state in OUTCOMES:
                inc.outcome_at = now
                key = (inc.detector, state)
                self.outcomes_total[key] = self.outcomes_total.get(key, 0) + 1
            if state in ("mitigating", "mitigated", "resolved"):
                setattr(inc, f"{state}_at", now)
            if state == "resolved":
                self._open.pop(inc.key, None)
                self._recent.append(inc)
                del self._recent[:-self._keep]
            if state == "resolved" and inc.mitigated_at is not None:  # MTTR: real mitigations only
                buckets, total, count = self.durations.get(inc.detector, ([0] * len(DURATION_BUCKETS), 0.0, 0))
                d = inc.duration()
                for i, b in enumerate(DURATION_BUCKETS):
                    if d <= b:
                        buckets[i] += 1
                self.durations[inc.detector] = (buckets, total + d, count + 1)
        self._log(inc)

    def get(self, key_or_id: str) -> Incident | None:
        with self._lock:
            if key_or_id in self._open:
                return self._open[key_or_id]
            for inc in list(self._open.values()) + self._recent:
                if inc.id == key_or_id:
                    return inc
        return None

    def find(self, detector: str, targets: Mapping[str, str]) -> Incident | None:
        with self._lock:
            return self._open.get(incident_key(detector, targets))

    def open_incidents(self) -> list[Incident]:
        with self._lock:
            return list(self._open.values())

    def recent(self) -> list[Incident]:
        with self._lock:
            return list(self._recent)

    def all(self) -> Iterable[Incident]:
        return self.open_incidents() + self.recent()
