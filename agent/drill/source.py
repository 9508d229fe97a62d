"""The drill's readings: a synthetic device publishing into the snapshot store, where a real sensor's poll would.

Why the store and not the engine: the detectors, their hold times, the guardrails, coordination and the
playbooks then see the fault exactly as a real one. Every reading carries `drill="true"`, so `/metrics`, the
status page and the journal say what it is, and the shipped alert rules (which match `drill!="true"`) never
page anyone for it.
"""

from __future__ import annotations

import asyncio
import time

from agent.snapshot import SnapshotStore
from exporters.cooling import modbus_metrics  # the module, not the spec: the catalogue credits its source
from exporters.model import Quality, Reading, gauge

from .plan import DrillPlan, LeakScenario

DRILL_ACTIVE = gauge("supernode_drill_active", "1 while a fault drill runs on this agent (its synthetic readings "
                     "carry the label drill=\"true\"); absent otherwise.", ["drill", "scenario"])
SOURCE, DEVICE = "drill", "drill"
SENSOR = "drill"  # the synthetic sensor's name: a real sensor of the zone is never overwritten


class DrillSource:
    """Publishes the plan's fault every `interval` seconds while wet; dry (0) once the drill ends."""

    def __init__(self, store: SnapshotStore, plan: DrillPlan, interval: float = 0.25):
        if not isinstance(plan.scenario, LeakScenario):
            raise ValueError(f"scenario.kind: {plan.scenario.kind}: no synthetic source for it in this version "
                             "(leak only)")
        self.store, self.plan, self.interval = store, plan, interval
        self.wet = True
        self._task: asyncio.Task | None = None

    def readings(self) -> list[Reading]:
        sc = self.plan.scenario
        now = time.time()
        labels = {"zone": sc.zone, "sensor": SENSOR, "drill": "true"}  # type: ignore[union-attr]
        return [Reading(modbus_metrics.LEAK_DETECTED, 1.0 if self.wet else 0.0, labels, Quality.OK, now),
                Reading(DRILL_ACTIVE, 1.0, {"drill": self.plan.name, "scenario": sc.kind}, Quality.OK, now)]

    def start(self) -> None:
        # stale after 4 intervals: a drill whose task died leaves the snapshot within a second
        self.store.register(SOURCE, DEVICE, self.interval, 4)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="drill-source")

    async def _run(self) -> None:
        while True:
            self.store.publish(SOURCE, DEVICE, self.readings(), 0.0)
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.store.unregister(SOURCE, DEVICE)
