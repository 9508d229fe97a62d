"""Shared facts: one poll of a shared device as a compact JSON document, and back into readings.

Why the whole poll and not a summary: an agent that does not poll the leak
controller must run the same detectors on the same numbers as one that does
(a leak in its zone, the leak watch's "unknown", the coolant summary, the
PDU's phase load and the rack power derived from it). So a poller publishes
what its poll put in its own store (readings, with their quality and the
device's own timestamps, or the failure), and every other agent puts it in
its store under the same (source, device): detectors, derived sources and
the API cannot tell the difference. Metric specs travel by value, so a
profile-defined family needs no registry on the receiving side.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from exporters.model import Kind, MetricSpec, Quality, Reading, make_reading

VERSION = 1
_QUALITY = {q.value: q for q in Quality}
# The leak family's name (exporters.cooling.modbus_metrics.LEAK_DETECTED, which the Redfish trays fill too), by
# name: importing the spec here would make the metric catalogue name this module as its source.
LEAK_DETECTED = "supernode_leak_detected"


@dataclass(slots=True)
class Fact:
    """One poll of one (source, device) by one poller."""

    node: str
    source: str
    device: str
    up: bool
    readings: list[Reading] = field(default_factory=list)
    duration: float = 0.0
    error_kind: str = ""
    error: str = ""
    partial_errors: dict[str, int] = field(default_factory=dict)
    at: float = 0.0  # the poller's wall clock when it published


def is_wet(fact: Fact) -> bool:
    """Does this poll read a leak? (What a safety input's standby publishes although it is not the first poller.)"""
    return fact.up and any(r.spec.name == LEAK_DETECTED and r.ok and r.value >= 0.5 for r in fact.readings)


def poll_started(raw: bytes) -> float | None:
    """When an encoded fact's poll started, by its poller's wall clock; None when it cannot be read."""
    try:
        doc = json.loads(raw)
        return float(doc["at"]) - float(doc.get("duration", 0.0))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def encode(fact: Fact) -> bytes:
    specs: dict[str, list[Any]] = {}
    rows = []
    for r in fact.readings:
        s = r.spec
        if s.name not in specs:
            specs[s.name] = [s.kind.value, s.help, list(s.labels), s.unit]
        rows.append([s.name, r.value, dict(r.labels), r.quality.value, r.timestamp])
    doc = {"v": VERSION, "node": fact.node, "source": fact.source, "device": fact.device, "up": fact.up,
           "duration": fact.duration, "at": fact.at, "specs": specs, "r": rows}
    if not fact.up:
        doc["error_kind"], doc["error"] = fact.error_kind, fact.error[:500]
    if fact.partial_errors:
        doc["partial"] = fact.partial_errors
    return json.dumps(doc, separators=(",", ":"), allow_nan=True).encode()


class Decoder:
    """Decodes facts, keeping one MetricSpec object per distinct declaration (facts arrive many times a second)."""

    def __init__(self) -> None:
        self._specs: dict[tuple, MetricSpec] = {}

    def _spec(self, name: str, decl: list[Any]) -> MetricSpec:
        key = (name, decl[0], decl[1], tuple(decl[2]), decl[3])
        spec = self._specs.get(key)
        if spec is None:
            spec = self._specs[key] = MetricSpec(name, Kind(decl[0]), str(decl[1]), tuple(decl[2]), str(decl[3]))
        return spec

    def decode(self, raw: bytes) -> Fact:
        """A Fact, or ValueError naming what is wrong (a fact from a newer agent, a cut value)."""
        try:
            doc = json.loads(raw)
            if doc.get("v") != VERSION:
                raise ValueError(f"fact version {doc.get('v')!r}, this agent reads {VERSION}")
            specs = {name: self._spec(name, decl) for name, decl in doc["specs"].items()}
            readings = [make_reading(specs[name], float(value), labels, _QUALITY[quality], float(ts))
                        for name, value, labels, quality, ts in doc["r"]]
            return Fact(str(doc["node"]), str(doc["source"]), str(doc["device"]), bool(doc["up"]), readings,
                        float(doc.get("duration", 0.0)), str(doc.get("error_kind", "")), str(doc.get("error", "")),
                        {str(k): int(v) for k, v in (doc.get("partial") or {}).items()}, float(doc.get("at", 0.0)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"unreadable fact: {type(exc).__name__}: {exc}"[:300]) from None


class FactExchange:
    """Both ends of shared facts in one agent, whatever carries them (etcd keys, a static peer's stream).

    Out: after this agent's own poll of a shared source it polls, `outgoing` gives the Fact to send.
    In: `ingest` puts another poller's fact in this agent's store under the same (source, device), so
    detectors, derived sources and the API see it as if polled here; a poller's failure is applied only
    when no other poller of that device read it fine within its staleness window (one poller's trouble is
    not the device's). `hidden` names the shared sources whose entry holds another agent's facts: not
    exported here, so a device's series come from its pollers only. A safety input's wet poll is taken from
    whichever poller read it (etcd: the standby polls half an interval out of the first's phase, so either
    may read a leak first); a poll older than the one in the store, from another poller, is dropped.
    """

    def __init__(self, node: str, jobs: dict[str, str], stale_after_intervals: float, clock,
                 safety: frozenset[str] = frozenset()):
        self.node = node
        self.jobs = jobs  # job id -> shared device
        self.safety = safety  # jobs whose wet polls are taken from any poller
        self.held: dict[str, tuple[float, str, float]] = {}  # job -> (poll start, poller, monotonic when taken)
        self.stale_after = stale_after_intervals
        self.clock = clock
        self.store: Any = None
        self.runners: dict[str, Any] = {}
        self.local: dict[str, bool] = {}  # job -> its store entry holds our own poll (not a fact)
        self.status: dict[str, dict[str, tuple[bool, float]]] = {}  # job -> poller -> (up, monotonic when)
        self.decoder = Decoder()
        self.ingesting = False
        self.published = 0
        self.received = 0

    def hidden(self) -> frozenset[tuple[str, str]]:
        return frozenset(tuple(j.split("/", 1)) for j in self.jobs if not self.local.get(j, False))

    def outgoing(self, snap: Any, origin: str, polling: bool) -> Fact | None:
        """Store listener side: the fact of our own poll of `origin`, or None (not shared, not ours, a fact in)."""
        if self.ingesting or origin not in self.jobs:
            return None
        self.local[origin] = True
        if not polling:
            return None
        source, _, device = origin.partition("/")
        st = next((s for s in snap.sources if s.source == source and s.device == device), None)
        if st is None:
            return None
        return Fact(self.node, source, device, st.up, list(st.readings) if st.up else [], st.last_duration or 0.0,
                    "" if st.up else "poll", st.last_error or "", {}, self.clock())

    def forget(self, job: str, poller: str) -> None:
        self.status.get(job, {}).pop(poller, None)

    def ingest(self, job: str | None, poller: str | None, raw: bytes, polling: Any) -> str | None:
        """Take another poller's fact (of `job` by `poller`, or as the fact itself says); the reason when it is not
        taken (a bad one is named, never raised). `polling(device)`: whether this agent reads that device itself."""
        if job is not None and (poller == self.node or job not in self.jobs or self.store is None
                                or (polling(self.jobs[job]) and self.local.get(job))):
            return "not for us"
        try:
            fact = self.decoder.decode(raw)
        except ValueError as exc:
            return str(exc)
        if job is None:
            job, poller = f"{fact.source}/{fact.device}", fact.node
            if poller == self.node or job not in self.jobs or self.store is None \
                    or (polling(self.jobs[job]) and self.local.get(job)):
                return "not for us"
        now = time.monotonic()
        status = self.status.setdefault(job, {})
        status[poller] = (fact.up, now)
        self.received += 1
        runner = self.runners.get(job)
        interval = runner.settings.interval if runner is not None else 1.0
        window = interval * self.stale_after
        if not fact.up and any(ok and now - at <= window for p, (ok, at) in status.items() if p != poller):
            return None  # another poller reads it fine: one poller's trouble is not the device's
        started = fact.at - fact.duration
        held = self.held.get(job)
        if held is not None and held[1] != poller and now - held[2] <= window and started < held[0]:
            return None  # an older poll than the one in the store, from another poller: the newer one stands
        if fact.up and not (job in self.safety and is_wet(fact)) \
                and any(ok and p < poller and now - at <= window for p, (ok, at) in status.items()):
            return None  # the device's first poller answers: one copy of each poll is enough (half the work)
        self.ingesting = True
        try:
            if fact.up:
                self.store.publish(fact.source, fact.device, fact.readings, fact.duration, fact.partial_errors)
            else:
                self.store.fail(fact.source, fact.device, "remote", f"{poller}: {fact.error}", fact.duration)
            self.local[job] = False
            self.held[job] = (started, poller, now)
        except KeyError:  # a device this agent's config does not list
            return "not in this agent's inventory"
        finally:
            self.ingesting = False
        return None
