"""Readings derived from other sources' readings (rack power from every PDU inlet).

A derived source reads the snapshot, never a device, so it inherits the
staleness rule: when the PDUs go stale, their inlets leave the snapshot and
the rack total disappears with them instead of freezing at its last value.
"""

from __future__ import annotations

from agent.snapshot import SnapshotStore
from exporters.model import PollResult
from exporters.pdu import INLET_POWER, rack_power_readings


class RackPowerSource:
    name = "derived"
    device = "rack_power"

    def __init__(self, store: SnapshotStore, budget_watts: float | None):
        self.store = store
        self.budget_watts = budget_watts

    async def poll(self) -> PollResult:
        inlets = list(self.store.snapshot().select(INLET_POWER.name))
        return PollResult(rack_power_readings(inlets, self.budget_watts))

    async def close(self) -> None:
        return None
