"""Readings derived from the snapshot, never from a device: rack power, the state of the leak sources, and each
GPU's cold-plate thermal resistance (agent/derived_thermal.py).

A derived source reads the snapshot, never a device, so it inherits the
staleness rule: when the PDUs go stale, their inlets leave the snapshot and
the rack total disappears with them instead of freezing at its last value.

The leak watch is the one place where silence is dangerous: when a leak
source stops answering, its `supernode_leak_detected` series go stale and
vanish, and a vanished series cannot fire an alert or a detector. So for
every leak input a leak source polls, the watch exports
`supernode_leak_sensor_fault{zone, sensor, fault="source_down"}`: 0 while
that source answers, 1 once its readings went stale (the moment they leave
/metrics). The zone's state is then explicitly unknown, not missing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Protocol

from agent.snapshot import Snapshot, SnapshotStore
from exporters.cooling import modbus_metrics
from exporters.cooling.modbus_metrics import LEAK_FAULT
from exporters.model import PollResult, Reading
from exporters.power.pdu import INLET_POWER, pdus_not_summed, rack_power_readings

if TYPE_CHECKING:
    from agent.config import LoadedConfig
    from agent.runtime import ScheduledSource

log = logging.getLogger("supernode.derived")
SOURCE_DOWN = "source_down"


class RackPowerSource:
    """The rack's power, summed over the inventory's PDUs only while each of them is read (rack_power_readings):
    a PDU that stops answering makes the rack's power unknown, said once in the log, never a partial sum."""

    name = "derived"
    device = "rack_power"

    def __init__(self, store: SnapshotStore, budget_watts: float | None, pdus: list[str] | None = None):
        self.store = store
        self.budget_watts = budget_watts
        self.pdus = list(pdus or [])
        self._not_summed: list[str] = []
        self._summed_once = False  # before the PDUs' first polls the rack power is unknown too: not worth a warning

    async def poll(self) -> PollResult:
        inlets = list(self.store.snapshot().select(INLET_POWER.name))
        missing = pdus_not_summed(inlets, self.pdus)
        if not missing:
            if self._not_summed and self._summed_once:
                log.info("rack power summed again: every PDU read", extra={"pdus": self.pdus})
            self._summed_once = True
        elif self._summed_once and missing != self._not_summed:
            log.warning("rack power unknown: a PDU's inlets are not read", extra={"pdus": missing})
        self._not_summed = missing
        return PollResult(rack_power_readings(inlets, self.budget_watts, self.pdus))

    async def close(self) -> None:
        return None


class LeakSource(Protocol):
    name: str
    device: str

    def leak_sensors(self) -> list[tuple[str, str]]: ...


class LeakWatchSource:
    """`fault="source_down"` per leak input: 1 while its source is stale, 0 while it answers.

    `idle()` names the sources this agent has but does not read now (rack coordination: the other trays'
    BMCs while it does not lead): their silence is not a fault here."""

    name = "derived"
    device = "leak_sources"

    def __init__(self, store: SnapshotStore, leak_sources: list[LeakSource],
                 idle: Callable[[], frozenset[tuple[str, str]]] | None = None):
        self.store = store
        # Asked at each poll: a Redfish service knows its detectors only once it has been walked.
        self.sources = {(s.name, s.device): s for s in leak_sources}
        self.idle = idle or frozenset
        self._failing_since: dict[tuple[str, str], float] = {}
        self._learnt: dict[tuple[str, str], list[tuple[str, str]]] = {}  # detectors seen in another poller's facts
        self._last: list[tuple[tuple[str, str], bool, str, str]] | None = None  # what the last poll said

    @property
    def sensors(self) -> dict[tuple[str, str], list[tuple[str, str]]]:
        return {key: s.leak_sensors() for key, s in self.sources.items()}

    def _sensors_of(self, snap: Snapshot) -> dict[tuple[str, str], list[tuple[str, str]]]:
        """Each source's leak inputs; a Redfish service this agent never walked (another agent polls it and
        shares its polls) has them from those polls' readings, not the service-wide stand-in."""
        out = self.sensors
        for st in snap.sources:
            key = (st.source, st.device)
            src = self.sources.get(key)
            if src is None or getattr(src, "leak_sensors_known", True):
                continue
            seen = sorted({(r.label("zone"), r.label("sensor")) for r in st.readings
                           if r.spec.name == modbus_metrics.LEAK_DETECTED.name})
            if seen:
                self._learnt[key] = seen
            if key in self._learnt:
                out[key] = self._learnt[key]
        return out

    def down(self, snap: Snapshot) -> dict[tuple[str, str], bool]:
        """Per watched source: True once its readings are stale; absent before its first try.

        Stale is the store's own rule (no success for `stale_after_intervals`
        intervals): the moment its leak series leave /metrics, the unknown
        state takes their place, and one slow poll on a busy host does not
        page anyone. A source that has never answered counts from its first try.
        """
        out: dict[tuple[str, str], bool] = {}
        now = snap.taken_at
        for st in snap.sources:
            key = (st.source, st.device)
            if key not in self.sources or st.last_attempt is None:
                continue
            if st.last_success is not None:
                self._failing_since.pop(key, None)
                out[key] = not st.fresh(now)
            else:
                since = self._failing_since.setdefault(key, st.last_attempt)
                out[key] = now - since > st.stale_after
        return out

    async def poll(self) -> PollResult:
        snap = self.store.snapshot()
        now = snap.taken_at
        sensors = self._sensors_of(snap)
        idle = self.idle()
        rows = [(key, is_down, zone, sensor) for key, is_down in sorted(self.down(snap).items()) if key not in idle
                for zone, sensor in sensors[key]]
        readings = [Reading(LEAK_FAULT, 1.0 if is_down else 0.0, {"zone": zone, "sensor": sensor, "fault": SOURCE_DOWN},
                            timestamp=now)
                    for _, is_down, zone, sensor in rows]
        # Twice a second, and the same nearly always: a change (a source went stale or came back, a detector
        # learnt, a source idle) is published at once; the same rows again only keep the entry fresh (no
        # snapshot, no leak detector pass).
        unchanged, self._last = rows == self._last, rows
        return PollResult(readings, unchanged=unchanged)

    async def close(self) -> None:
        return None


def derived_sources(store: SnapshotStore, loaded: "LoadedConfig", sources: list["ScheduledSource"],
                    idle: Callable[[], frozenset[tuple[str, str]]] | None = None) -> list["ScheduledSource"]:
    """The derived sources a config needs: rack power when PDUs are polled, the leak watch when leaks are
    (`idle`: the sources rack coordination has this agent not read now)."""
    from agent.runtime import ScheduledSource

    cfg = loaded.config
    out: list[ScheduledSource] = []
    if cfg.inventory.pdus:
        out.append(ScheduledSource(RackPowerSource(store, cfg.inventory.power_budget_watts,
                                                   [p.name for p in cfg.inventory.pdus]), cfg.sources.pdu))
    if cfg.sources.nvml.enabled and cfg.sources.thermal_resistance.enabled:
        out.append(_thermal_resistance(store, loaded))
    leaks = [s.source for s in sources if s.source.name in ("leak", "redfish") and hasattr(s.source, "leak_sensors")]
    if leaks:
        # On the leak schedule: an unknown zone shows within two leak intervals of the first failed poll.
        out.append(ScheduledSource(LeakWatchSource(store, leaks, idle), cfg.sources.leak))
    return out


def _thermal_resistance(store: SnapshotStore, loaded: "LoadedConfig") -> "ScheduledSource":
    """Each GPU's cold-plate thermal resistance and its persisted baseline (agent/derived_thermal.py)."""
    from agent.derived_thermal import thermal_resistance_source
    from agent.runtime import ScheduledSource

    cfg = loaded.config
    settings = cfg.sources.thermal_resistance
    return ScheduledSource(thermal_resistance_source(store, cfg.inventory, settings, cfg.agent.node,
                                                     cfg.agent.state_dir), settings)
