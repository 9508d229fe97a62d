"""The snapshot store: latest readings per (source, device), with the staleness rule applied.

Collectors write here; `/metrics`, the detectors and the API read here and
only here, so they agree. A source that has not succeeded for
`stale_after_intervals` of its interval has its readings dropped from every
view: old values are never served as fresh.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

from exporters.model import Quality, Reading


def by_family(readings: Iterable[Reading]) -> dict[str, list[Reading]]:
    """Readings grouped by metric family name, in their order."""
    index: dict[str, list[Reading]] = {}
    for r in readings:
        index.setdefault(r.spec.name, []).append(r)
    return index


@dataclass(slots=True)
class SourceState:
    """Bookkeeping for one (source, device): feeds the per-source `up`, duration and error metrics."""

    source: str
    device: str
    interval: float
    stale_after: float
    readings: list[Reading] = field(default_factory=list)
    up: bool = False
    last_success: float | None = None
    last_attempt: float | None = None
    last_duration: float | None = None
    errors: Counter = field(default_factory=Counter)
    last_error: str | None = None
    # Readings once marked unsupported stay listed (quality gauge), never re-polled as errors.
    unsupported: dict[str, Reading] = field(default_factory=dict)
    # The last published readings by metric family: snapshots merge these per family instead of indexing
    # every reading again on every publish; the keys say which detectors a publish concerns.
    index: dict[str, list[Reading]] = field(default_factory=dict)

    @property
    def families(self) -> frozenset[str]:
        return frozenset(self.index)

    def fresh(self, now: float) -> bool:
        return self.last_success is not None and now - self.last_success <= self.stale_after

    def as_dict(self, now: float) -> dict:
        return {
            "source": self.source,
            "device": self.device,
            "up": self.up,
            "fresh": self.fresh(now),
            "interval_seconds": self.interval,
            "last_success": self.last_success,
            "last_attempt": self.last_attempt,
            "last_duration_seconds": self.last_duration,
            "errors": dict(self.errors),
            "last_error": self.last_error,
        }


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An immutable view of every fresh reading at one moment; what detectors evaluate.

    Readings are indexed by metric name once, when the snapshot is taken: the
    detectors look up dozens of families per evaluation, and a scan of every
    reading per lookup was most of the agent's CPU.
    """

    taken_at: float
    readings: tuple[Reading, ...]
    sources: tuple[SourceState, ...]
    by_name: dict[str, list[Reading]] = field(default_factory=dict, compare=False, repr=False)
    # When it was taken on a clock that never jumps: detector holds and windows measure time with it, so a
    # wall-clock step (NTP, a person's `date -s`) neither fires nor clears anything. Default: taken_at.
    monotonic: float | None = None

    def __post_init__(self) -> None:
        if self.monotonic is None:
            object.__setattr__(self, "monotonic", self.taken_at)
        if not self.by_name and self.readings:
            object.__setattr__(self, "by_name", by_family(self.readings))

    def select(self, metric: str, **labels: str) -> Iterator[Reading]:
        family = self.by_name.get(metric, ())
        if not labels:
            yield from family
            return
        for r in family:
            if all(r.labels.get(k) == v for k, v in labels.items()):
                yield r

    def value(self, metric: str, **labels: str) -> float | None:
        """The value of the one OK reading that matches, or None (missing or not OK)."""
        for r in self.select(metric, **labels):
            if r.ok:
                return r.value
        return None

    def families_of(self, origin: str) -> frozenset[str] | None:
        """Metric families the source `origin` ("source/device") published last; None if unknown (all apply)."""
        source, _, device = origin.partition("/")
        for s in self.sources:
            if s.source == source and s.device == device:
                return s.families or None
        return None

    def source_up(self, source: str, device: str | None = None) -> bool:
        return any(s.up and s.fresh(self.taken_at) for s in self.sources
                   if s.source == source and (device is None or s.device == device))


Listener = Callable[[Snapshot, str], None]


class SnapshotStore:
    """Thread-safe store; `publish` replaces one source's readings and notifies listeners.

    Listeners (the detectors) are called synchronously right after a source
    publishes, so a leak reading reaches a detector without waiting for any
    scrape or timer.
    """

    def __init__(self, clock: Callable[[], float] = time.time, monotonic: Callable[[], float] | None = None):
        self._lock = threading.Lock()
        # A test that drives the wall clock drives hold times with it too.
        self._mono = monotonic or (time.monotonic if clock is time.time else clock)
        self._states: dict[tuple[str, str], SourceState] = {}
        self._listeners: list[Listener] = []
        self._clock = clock

    def register(self, source: str, device: str, interval: float, stale_after_intervals: float) -> SourceState:
        with self._lock:
            state = self._states.get((source, device))
            if state is None:
                state = SourceState(source, device, interval, interval * stale_after_intervals)
                self._states[(source, device)] = state
            else:
                state.interval = interval
                state.stale_after = interval * stale_after_intervals
            return state

    def unregister(self, source: str, device: str) -> None:
        with self._lock:
            self._states.pop((source, device), None)

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def publish(self, source: str, device: str, readings: Iterable[Reading], duration: float,
                partial_errors: dict[str, int] | None = None) -> None:
        now = self._clock()
        with self._lock:
            state = self._states[(source, device)]
            kept: list[Reading] = []
            for r in readings:
                if r.quality is Quality.UNSUPPORTED:
                    state.unsupported.setdefault(r.reading_id(), r)
                else:
                    kept.append(r)
            state.readings = kept
            state.index = by_family(kept)
            state.up = True
            state.last_success = now
            state.last_attempt = now
            state.last_duration = duration
            state.last_error = None
            for kind, n in (partial_errors or {}).items():
                state.errors[kind] += n
        self._notify(f"{source}/{device}")

    def touch(self, source: str, device: str) -> None:
        """The source is alive and its last readings still hold (an event stream between events): fresh
        again, without replacing its readings or notifying anyone, since nothing a detector reads changed."""
        now = self._clock()
        with self._lock:
            state = self._states[(source, device)]
            if not state.up or state.last_success is None:
                return  # only a stream that published and has not failed since is vouched for by a keepalive
            state.last_success = now
            state.last_attempt = now

    def fail(self, source: str, device: str, kind: str, message: str, duration: float) -> None:
        now = self._clock()
        with self._lock:
            state = self._states[(source, device)]
            state.up = False
            state.last_attempt = now
            state.last_duration = duration
            state.errors[kind] += 1
            state.last_error = message
        self._notify(f"{source}/{device}")

    def _notify(self, origin: str) -> None:
        if not self._listeners:
            return
        snap = self.snapshot()
        for listener in list(self._listeners):
            listener(snap, origin)

    def states(self) -> list[SourceState]:
        with self._lock:
            return list(self._states.values())

    def snapshot(self) -> Snapshot:
        now = self._clock()
        with self._lock:
            readings: list[Reading] = []
            by_name: dict[str, list[Reading]] = {}
            states: list[SourceState] = []
            for state in self._states.values():
                if state.fresh(now):
                    readings.extend(state.readings)
                    for name, family in state.index.items():
                        merged = by_name.get(name)
                        if merged is None:
                            by_name[name] = family  # shared, never mutated: publish swaps in new lists
                        else:
                            by_name[name] = merged + family
                states.append(state)
        return Snapshot(now, tuple(readings), tuple(states), by_name, self._mono())
