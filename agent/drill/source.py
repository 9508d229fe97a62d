"""The drill's readings: a synthetic device publishing into the snapshot store, where a real sensor's poll would.

Why the store and not the engine: the detectors, their hold times, the guardrails, coordination and the
playbooks then see the fault exactly as a real one. Every reading carries `drill="true"`, so `/metrics`, the
status page and the journal say what it is, and the shipped alert rules (which match `drill!="true"`) never
page anyone for it.

Two kinds of reading: one of its own (a leak detector named `drill`, an XID series, a switch chip's verdict),
and one standing in for a real series (a link's state, a CDU's flow and return temperature): that one carries
the real reading's labels plus `drill="true"`, and the store's view for the detectors shows it in the real
one's place while the drill runs (agent/snapshot.py); /metrics keeps both. A stand-in follows its real series
(a flow loss is a share of the flow read now), so it is computed from the store on every publish.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agent.coordination.link_share import NVLINK_SWITCH_FAULT
from agent.snapshot import DRILL_SOURCE, SnapshotStore
from exporters.cooling import modbus_metrics  # the module, not the spec: the catalogue credits its source
from exporters.gpu import nvml_metrics
from exporters.gpu.xid_actions import immediate_actions
from exporters.model import Quality, Reading, gauge

from .plan import DrillPlan
from .scenarios import (FlowLossScenario, LeakScenario, LinkDownScenario, Rack, SwitchFaultScenario,
                        TrayLeakScenario, XidScenario, zone_of)

DRILL_ACTIVE = gauge("supernode_drill_active", "1 while a fault drill runs on this agent (its synthetic readings "
                     "carry the label drill=\"true\"); absent otherwise.", ["drill", "scenario"])
SOURCE, DEVICE = DRILL_SOURCE, "drill"
SENSOR = "drill"  # the synthetic leak sensor's name: a real sensor of the zone is never overwritten
MARK = {"drill": "true"}


class DrillSource:
    """Publishes the plan's fault every `interval` seconds while `faulty`; the healthy value once the drill ends
    (a dry leak sensor, the link up, the real flow), until it stops."""

    def __init__(self, store: SnapshotStore, plan: DrillPlan, rack: Rack, interval: float = 0.25):
        self.store, self.plan, self.rack, self.interval = store, plan, rack, interval
        self.faulty = True
        self._task: asyncio.Task | None = None
        self.readings()  # a stand-in with no real series to stand for refuses the drill here (ValueError)

    def _real(self, family: str, **labels: str) -> Reading | None:
        """The real (not drill) ok reading of `family` with these labels, as the store holds it now."""
        for r in self.store.family(family, without_source=SOURCE):
            if r.ok and all(r.label(k) == v for k, v in labels.items()):
                return r
        return None

    def readings(self) -> list[Reading]:
        sc, now, on = self.plan.scenario, time.time(), self.faulty
        out = [Reading(DRILL_ACTIVE, 1.0, {"drill": self.plan.name, "scenario": sc.kind}, Quality.OK, now)]
        if isinstance(sc, (LeakScenario, TrayLeakScenario)):
            zone = sc.zone if isinstance(sc, LeakScenario) else zone_of(sc.node, self.rack)
            sensor = SENSOR if isinstance(sc, LeakScenario) else f"{self.rack.tray_bmcs[sc.node]}/{SENSOR}"
            out.append(Reading(modbus_metrics.LEAK_DETECTED, 1.0 if on else 0.0, {"zone": zone, "sensor": sensor,
                                                                                 **MARK}, Quality.OK, now))
        elif isinstance(sc, XidScenario) and on:  # its series goes with the fault (the detectors judge it apart)
            gpu = self._real("supernode_gpu_up", gpu=str(sc.gpu))
            if gpu is None:
                raise ValueError(f"scenario.gpu: GPU {sc.gpu} is not read by this agent's NVML source")
            # a series of its own, counting one XID: the detectors take its first value as one new event
            out.append(Reading(nvml_metrics.XID, 1.0, {"gpu": str(sc.gpu), "uuid": gpu.label("uuid"), "xid": str(sc.xid),
                                                       "action": immediate_actions().get(sc.xid, "unknown"), **MARK},
                               Quality.OK, now))
        elif isinstance(sc, LinkDownScenario):
            link = self._real("supernode_nvlink_up", gpu=str(sc.gpu), link=str(sc.link))
            if link is None:
                raise ValueError(f"scenario.link: NVLink {sc.link} of GPU {sc.gpu} is not read by this agent")
            out.append(Reading(link.spec, 0.0 if on else link.value, {**link.labels, **MARK}, Quality.OK, now))
        elif isinstance(sc, FlowLossScenario):
            out += self._flow(sc, now)
        elif isinstance(sc, SwitchFaultScenario):
            out.append(Reading(NVLINK_SWITCH_FAULT, 1.0 if on else 0.0, {"switch_chip": str(sc.switch_chip),
                                                                          "switch_tray": sc.switch_tray, **MARK},
                               Quality.OK, now))
        return out

    def _flow(self, sc: FlowLossScenario, now: float) -> list[Reading]:
        """The CDU's secondary flow cut by `loss`, and its return temperature risen as the same heat load is
        carried by less coolant (ΔT x 1/(1 - loss)): the two readings the coolant detector confirms a flow loss
        by. Healthy again (the real values) once the drill ends."""
        flow = self._real("supernode_cdu_flow_cubic_meters_per_second", cdu=sc.cdu, loop="secondary")
        sup = self._real("supernode_cdu_temperature_celsius", cdu=sc.cdu, loop="secondary", point="supply")
        ret = self._real("supernode_cdu_temperature_celsius", cdu=sc.cdu, loop="secondary", point="return")
        if flow is None or sup is None or ret is None:
            raise ValueError(f"scenario.cdu: {sc.cdu}'s secondary flow, supply and return are not all read by this "
                             "agent now")
        kept = 1.0 - sc.loss if self.faulty else 1.0
        rise = (ret.value - sup.value) / kept
        return [Reading(flow.spec, flow.value * kept, {**flow.labels, **MARK}, Quality.OK, now),
                Reading(ret.spec, sup.value + rise, {**ret.labels, **MARK}, Quality.OK, now)]

    def start(self) -> None:
        # stale after 4 intervals: a drill whose task died leaves the snapshot within a second
        self.store.register(SOURCE, DEVICE, self.interval, 4)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="drill-source")

    async def _run(self) -> None:
        while True:
            try:
                readings: list[Any] = self.readings()
            except ValueError:  # the real series it stands in for went (its source failed): publish none now
                readings = []
            self.store.publish(SOURCE, DEVICE, readings, 0.0)
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.store.unregister(SOURCE, DEVICE)
