"""Renders the snapshot as Prometheus metric families: the only path from readings to `/metrics`.

A custom collector on an explicit registry (never the global one), so a
scrape reads memory only and never touches a device. Readings that are not
`ok` are not exported as values; `supernode_reading_quality` says why.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.snapshot import SnapshotStore
from exporters.model import READING_QUALITY, Quality, Reading, counter, gauge, info
from exporters.render import render_text

if TYPE_CHECKING:
    from agent.config import Inventory

AGENT_INFO = info("supernode_agent_info", "Agent identity and remediation mode; rack and node as configured.",
                  ("rack", "node", "role", "version", "mode"))
SOURCE_UP = gauge("supernode_source_up", "1 if the last poll of this source device succeeded.", ("source", "device"))
SOURCE_DURATION = gauge("supernode_source_duration_seconds", "Wall time of the last poll of this source device, in seconds.",
                        ("source", "device"), "seconds")
SOURCE_LAST_SUCCESS = gauge("supernode_source_last_success_timestamp_seconds",
                            "Unix time of the last successful poll (values are polled, not read at scrape time).",
                            ("source", "device"), "seconds")
SOURCE_ERRORS = counter("supernode_source_errors_total", "Failed polls and partial read errors, by kind.",
                        ("source", "device", "kind"))
SOURCE_INTERVAL = gauge("supernode_source_interval_seconds", "Configured poll interval of this source, in seconds.",
                        ("source", "device"), "seconds")
LEAK_ZONE_INFO = info("supernode_leak_zone_info", "Which nodes a leak zone endangers (from the inventory).",
                      ("zone", "nodes"))



class SnapshotCollector(Collector):
    def __init__(self, store: SnapshotStore, agent_info: Callable[[], dict[str, str]],
                 hidden: Callable[[], frozenset[tuple[str, str]]] = frozenset):
        self._store = store
        self._agent_info = agent_info
        self._hidden = hidden  # (source, device) whose entry holds another agent's polls (coordination)

    def collect(self) -> Iterator[Metric]:
        snap = self._store.snapshot()
        ident = self._agent_info()
        fam = GaugeMetricFamily(AGENT_INFO.name, AGENT_INFO.help, labels=list(AGENT_INFO.labels))
        fam.add_metric([ident.get(k, "") for k in AGENT_INFO.labels], 1.0)
        yield fam

        up = GaugeMetricFamily(SOURCE_UP.name, SOURCE_UP.help, labels=["source", "device"])
        dur = GaugeMetricFamily(SOURCE_DURATION.name, SOURCE_DURATION.help, labels=["source", "device"])
        last = GaugeMetricFamily(SOURCE_LAST_SUCCESS.name, SOURCE_LAST_SUCCESS.help, labels=["source", "device"])
        interval = GaugeMetricFamily(SOURCE_INTERVAL.name, SOURCE_INTERVAL.help, labels=["source", "device"])
        errors = CounterMetricFamily(SOURCE_ERRORS.name, SOURCE_ERRORS.help, labels=["source", "device", "kind"])
        quality = GaugeMetricFamily(READING_QUALITY.name, READING_QUALITY.help,
                                    labels=["source", "device", "reading", "quality"])
        quality_seen: set[tuple[str, str, str, str]] = set()
        hidden = self._hidden()
        for st in sorted(snap.sources, key=lambda s: (s.source, s.device)):
            if hidden and (st.source, st.device) in hidden:
                continue
            ids = [st.source, st.device]
            fresh = st.fresh(snap.taken_at)
            up.add_metric(ids, 1.0 if st.up and fresh else 0.0)
            interval.add_metric(ids, st.interval)
            if st.last_duration is not None:
                dur.add_metric(ids, st.last_duration)
            if st.last_success is not None:
                last.add_metric(ids, st.last_success)
            for kind, n in sorted(st.errors.items()):
                errors.add_metric(ids + [kind], float(n))
            marks: list[tuple[str, str]] = [(rid, "unsupported") for rid in st.unsupported]
            if fresh:
                marks += [(r.reading_id(), r.quality.value) for r in st.readings if r.quality is not Quality.OK]
            elif st.last_success is not None:
                marks += [(r.reading_id(), Quality.STALE.value) for r in st.readings]
            for rid, q in sorted(marks):
                key = (st.source, st.device, rid, q)
                if key not in quality_seen:
                    quality_seen.add(key)
                    quality.add_metric(list(key), 1.0)
        yield from (up, dur, last, interval, errors, quality)
        # The readings themselves are formatted by render_text (see render_metrics): same text, less time.


def build_registry(store: SnapshotStore, agent_info: Callable[[], dict[str, str]],
                   extra: Iterable[Collector] = (),
                   hidden: Callable[[], frozenset[tuple[str, str]]] = frozenset) -> CollectorRegistry:
    """The agent's own families (identity, per-source health, remediation); readings are added by render_metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(store, agent_info, hidden))
    for collector in extra:
        registry.register(collector)
    return registry


__all__ = ["build_registry", "SnapshotCollector"]


def inventory_readings(inventory: "Inventory") -> list[Reading]:
    """Static facts of the rack inventory that dashboards join against (leak zone -> nodes)."""
    return [Reading(LEAK_ZONE_INFO, 1.0, {"zone": z.name, "nodes": ",".join(z.nodes)}) for z in inventory.leak_zones]


def render_metrics(registry: CollectorRegistry, store: SnapshotStore, static: Iterable[Reading] = (),
                   hidden: frozenset[tuple[str, str]] = frozenset(),
                   budget: Callable[[list[Reading]], list[Reading]] | None = None) -> bytes:
    """The whole /metrics body: the registry's families, then every fresh reading and the static facts.

    `hidden`: shared sources whose readings here are another agent's polls (rack coordination): the
    agent that polled the device exports them, so a rack's dashboards see each device once per poller.
    `budget`: the series budget (agent/series_budget.py), applied here only: the snapshot keeps every reading."""
    snap = store.snapshot()
    readings = list(snap.readings)
    if hidden:
        readings = [r for st in snap.sources if (st.source, st.device) not in hidden and st.fresh(snap.taken_at)
                    for r in st.readings]
    if budget is not None:
        readings = budget(readings)
    return generate_latest(registry) + render_text(readings + list(static)).encode()
