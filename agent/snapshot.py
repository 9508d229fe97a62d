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


# A fault drill's source (agent/drill/source.py): its readings carry drill="true", and one that has the labels of
# a real reading besides stands in for it in the detectors' view (`Snapshot.select`) while the drill runs; the
# flat `readings` (/metrics, the API) keep both, so Prometheus sees the real series and the labelled drill one.
DRILL_SOURCE = "drill"


def _identity(r: Reading) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in r.labels.items() if k != "drill"))


def _stand_in(by_name: dict[str, list[Reading]], drill: dict[str, list[Reading]]) -> None:
    """Each family the drill publishes, without the real readings a drill reading stands in for."""
    for name, family in drill.items():
        ids = {_identity(r) for r in family}
        by_name[name] = [r for r in by_name.get(name, ()) if r.labels.get("drill") == "true" or _identity(r) not in ids]


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


class Snapshot:
    """An immutable view of every fresh reading at one moment; what detectors evaluate.

    Readings are indexed by metric name once, when the snapshot is taken: the
    detectors look up dozens of families per evaluation, and a scan of every
    reading per lookup was most of the agent's CPU. The flat `readings`
    tuple is built on first use only (the exposition and the API want it;
    the detectors, which take a snapshot per publish, never do).
    """

    __slots__ = ("taken_at", "sources", "by_name", "monotonic", "_readings", "_parts")

    def __init__(self, taken_at: float, readings: Iterable[Reading] = (), sources: Iterable[SourceState] = (),
                 by_name: dict[str, list[Reading]] | None = None, monotonic: float | None = None,
                 parts: list[list[Reading]] | None = None):
        self.taken_at = taken_at
        self.sources: tuple[SourceState, ...] = tuple(sources)
        # When it was taken on a clock that never jumps: detector holds and windows measure time with it, so a
        # wall-clock step (NTP, a person's `date -s`) neither fires nor clears anything. Default: taken_at.
        self.monotonic: float = taken_at if monotonic is None else monotonic
        self._parts = parts  # the readings as per-source lists (from the store), flattened on first use
        self._readings: tuple[Reading, ...] | None = None if parts is not None else tuple(readings)
        if by_name is None or (not by_name and self._readings):
            by_name = by_family(self.readings)
        self.by_name: dict[str, list[Reading]] = by_name

    @property
    def readings(self) -> tuple[Reading, ...]:
        if self._readings is None:
            self._readings = tuple(r for part in self._parts or () for r in part)
        return self._readings

    def __repr__(self) -> str:
        return f"Snapshot(taken_at={self.taken_at}, families={len(self.by_name)}, sources={len(self.sources)})"

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
    scrape or timer. A listener that names the metric families it reads is
    called only for publishes that touch one of them (the PDU's outlets
    concern no detector).

    The merged family index of the fresh sources is kept between snapshots
    and rebuilt only when a source published or came or left the fresh set:
    the derived sources, a scrape and the API take snapshots between
    publishes too.
    """

    def __init__(self, clock: Callable[[], float] = time.time, monotonic: Callable[[], float] | None = None):
        self._lock = threading.Lock()
        # A test that drives the wall clock drives hold times with it too.
        self._mono = monotonic or (time.monotonic if clock is time.time else clock)
        self._states: dict[tuple[str, str], SourceState] = {}
        self._listeners: list[tuple[Listener, frozenset[str] | None]] = []
        self._touch_listeners: list[Callable[[str], None]] = []
        self._clock = clock
        self._generation = 0  # bumped whenever some source's readings (or the set of sources) change
        self._view: tuple[int, tuple[int, ...], dict[str, list[Reading]], list[list[Reading]]] | None = None

    def register(self, source: str, device: str, interval: float, stale_after_intervals: float) -> SourceState:
        with self._lock:
            state = self._states.get((source, device))
            if state is None:
                state = SourceState(source, device, interval, interval * stale_after_intervals)
                self._states[(source, device)] = state
                self._generation += 1
            else:
                state.interval = interval
                state.stale_after = interval * stale_after_intervals
            return state

    def family(self, name: str, without_source: str | None = None) -> list[Reading]:
        """The fresh readings of one family as their sources published them (no drill stands in for any),
        without those of `without_source`: what a drill's stand-in is computed from."""
        now = self._clock()
        with self._lock:
            return [r for s in self._states.values() if s.source != without_source and s.fresh(now)
                    for r in s.index.get(name, ())]

    def unregister(self, source: str, device: str) -> None:
        with self._lock:
            if self._states.pop((source, device), None) is not None:
                self._generation += 1

    def add_listener(self, listener: Listener, families: Iterable[str] | None = None) -> None:
        """Call `listener(snapshot, "source/device")` after each publish or failure, or only after those
        of sources that publish (or published) one of `families`."""
        self._listeners.append((listener, None if families is None else frozenset(families)))

    def add_touch_listener(self, listener: Callable[[str], None]) -> None:
        """Call `listener("source/device")` after each `touch` that vouched a source fresh. Why apart from the
        publish listeners: nothing a detector reads changed, so they have nothing to do; but the agents that read
        a shared device from this one's polls must hear that it is still alive (agent.coordination: the facts'
        heartbeat), or their copy ages out while this agent's own stays fresh (a Redfish BMC whose event stream
        is up is polled only every `confirmed_interval`)."""
        self._touch_listeners.append(listener)

    def publish(self, source: str, device: str, readings: Iterable[Reading], duration: float,
                partial_errors: dict[str, int] | None = None) -> None:
        now = self._clock()
        unsupported = Quality.UNSUPPORTED
        with self._lock:
            state = self._states[(source, device)]
            before = state.index
            kept: list[Reading] = []
            index: dict[str, list[Reading]] = {}
            for r in readings:  # one pass: filtered and indexed by family (an NVML publish is ~1,500 readings)
                if r.quality is unsupported:
                    state.unsupported.setdefault(r.reading_id(), r)
                    continue
                kept.append(r)
                family = index.get(r.spec.name)
                if family is None:
                    index[r.spec.name] = [r]
                else:
                    family.append(r)
            state.readings = kept
            state.index = index
            state.up = True
            state.last_success = now
            state.last_attempt = now
            state.last_duration = duration
            state.last_error = None
            for kind, n in (partial_errors or {}).items():
                state.errors[kind] += n
            self._generation += 1
        self._notify(f"{source}/{device}", index.keys() | before.keys())

    def touch(self, source: str, device: str, duration: float | None = None) -> bool:
        """The source is alive and its last readings still hold (an event stream between events, a poll
        that read the same): fresh again, without replacing its readings or notifying anyone, since
        nothing a detector reads changed. False (nothing done) unless its last word was a publish."""
        now = self._clock()
        with self._lock:
            state = self._states[(source, device)]
            if not state.up or state.last_success is None:
                return False  # only a source that published and has not failed since is vouched for
            state.last_success = now
            state.last_attempt = now
            if duration is not None:
                state.last_duration = duration
        for listener in list(self._touch_listeners):
            listener(f"{source}/{device}")
        return True

    def fail(self, source: str, device: str, kind: str, message: str, duration: float) -> None:
        now = self._clock()
        with self._lock:
            state = self._states[(source, device)]
            state.up = False
            state.last_attempt = now
            state.last_duration = duration
            state.errors[kind] += 1
            state.last_error = message
            families = frozenset(state.index)
        self._notify(f"{source}/{device}", families)

    def _notify(self, origin: str, families: Iterable[str]) -> None:
        snap = None
        for listener, wants in list(self._listeners):
            if wants is not None and wants.isdisjoint(families):
                continue
            if snap is None:
                snap = self.snapshot()
            listener(snap, origin)

    def states(self) -> list[SourceState]:
        with self._lock:
            return list(self._states.values())

    def snapshot(self) -> Snapshot:
        now = self._clock()
        with self._lock:
            states = tuple(self._states.values())
            fresh = tuple(s for s in states if s.fresh(now))
            ids = tuple(map(id, fresh))  # by identity (SourceState compares by value)
            view = self._view
            if view is None or view[0] != self._generation or view[1] != ids:
                by_name: dict[str, list[Reading]] = {}
                for state in fresh:
                    for name, family in state.index.items():
                        merged = by_name.get(name)
                        if merged is None:
                            by_name[name] = family  # shared, never mutated: publish swaps in new lists
                        else:
                            by_name[name] = merged + family
                for state in fresh:
                    if state.source == DRILL_SOURCE:
                        _stand_in(by_name, state.index)
                view = self._view = (self._generation, ids, by_name, [s.readings for s in fresh])
        # the index is shared between snapshots of one view: nobody mutates it (publish builds new lists)
        return Snapshot(now, (), states, view[2], self._mono(), parts=view[3])
