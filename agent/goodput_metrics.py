"""The agent's own goodput series: its node's out-of-service seconds by cause, and whether it is in service now.

Why from journal rows, fed as they are written: the report (agent/goodput.py) reads outages from the journal,
and the counters must count the same outages the same way (the first cause that took the node out gets the
time), so the tracker keeps the journal rows that make outages (drain and node_reboot intents and results,
maintenance rows, the incidents' latest rows) and derives them with the report's own functions at each scrape.
It is fed the journal's rows at the engine's start (a drain from before a restart is still out of service) and
then every row the journal accepts (`Journal.on_append`); rows are keyed by seq, so a row seen twice counts once.

Only this agent's node: every agent exports its own (Prometheus adds `rack` and `node` as target labels), so a
rack's sum never counts a node twice. The counter counts from the agent's start (a restart resets it, which
`increase()` handles); `supernode_node_in_service` is 0 while an outage of the node is open.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Iterable

from exporters.model import counter, gauge

from .goodput import CAUSES, GoodputError, attribute, outages

log = logging.getLogger("supernode.goodput")

OUT_OF_SERVICE = counter("supernode_node_out_of_service_seconds_total",
                         "Seconds this agent's node was out of service (drained or rebooting by the agent, or in "
                         "maintenance) since the agent started, by cause class (agent.goodput); overlapping "
                         "outages count once, to the cause that took the node out first.", ("cause",), unit="seconds")
IN_SERVICE = gauge("supernode_node_in_service",
                   "1 while this agent's node is in service, 0 while an outage of it (drain, reboot, maintenance) "
                   "is open.")
OUTAGE_ACTIONS = ("drain", "node_reboot")


def _relevant(e: Any) -> bool:
    return (e.kind == "maintenance" or e.kind == "incident"
            or (e.kind in ("intent", "result") and e.action in OUTAGE_ACTIONS))


class OutOfServiceTracker:
    def __init__(self, node: str, clock: Callable[[], float] = time.time):
        self.node = node
        self.clock = clock
        self.since = clock()
        self._lock = threading.Lock()  # rows arrive on any thread that appends to the journal
        self._rows: dict[int, Any] = {}
        self._incidents: dict[str, Any] = {}  # incident id -> its latest row (the cause is read from it)
        self._changed = True  # rows fed since the outages were last derived
        self._outages: list[Any] = []

    def feed(self, e: Any) -> None:
        if not _relevant(e):
            return
        with self._lock:
            if e.kind == "incident":
                held = self._incidents.get(e.incident_id or "")
                if held is None or held.seq <= e.seq:
                    self._incidents[e.incident_id or ""] = e
            else:
                self._rows[e.seq] = e
            self._changed = True

    def load(self, entries: Iterable[Any]) -> None:
        for e in entries:
            self.feed(e)

    def seconds(self) -> tuple[dict[str, float], bool]:
        """(seconds out of service since the start by cause, in service now)."""
        with self._lock:
            changed, self._changed = self._changed, False
            rows = sorted([*self._rows.values(), *self._incidents.values()], key=lambda e: e.seq) if changed else []
        if changed:  # derived again only when a row came (a scrape between incidents only splits the time)
            self._outages = [o for o in outages(rows) if o.node == self.node]
        now = self.clock()
        mine = self._outages
        attribute(mine, self.since, now)
        by_cause = dict.fromkeys(CAUSES, 0.0)
        for o in mine:
            by_cause[o.cause] += o.attributed_seconds
        in_service = not any(o.start <= now and (o.end is None or o.end > now) for o in mine)
        return by_cause, in_service

    def families(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        try:
            by_cause, in_service = self.seconds()
        except GoodputError as exc:  # a row of ours it cannot read: no series rather than a wrong one
            log.error("goodput series not exported", extra={"error": str(exc)})
            return
        oos = CounterMetricFamily(OUT_OF_SERVICE.name.removesuffix("_total"), OUT_OF_SERVICE.help, labels=["cause"])
        for cause in CAUSES:  # every cause zero-started: increase() sees a series' first outage
            oos.add_metric([cause], by_cause[cause])
        yield oos
        yield GaugeMetricFamily(IN_SERVICE.name, IN_SERVICE.help, value=1 if in_service else 0)
