"""Detectors of the rack's power: the rack over its budget, a PDU outlet that feeds a node reading off.

Why apart: these read the PDUs over SNMP (and the budget from the inventory)
and target the rack or an outlet; nothing here reads a node's own devices.
"""

from __future__ import annotations

from typing import Iterator

from agent.snapshot import Snapshot

from .detectors_base import DetectorBase
from .hysteresis import Observation, targets_of


class PowerDetectors(DetectorBase):
    """Rack power and PDU outlets, methods of the detector table (`Detectors`)."""

    def _rack_power(self, snap: Snapshot) -> Iterator[Observation]:
        for item in self._ok_or_fault(snap.select("supernode_rack_power_watts")):
            if isinstance(item, Observation):
                yield item
                continue
            budget = snap.value("supernode_rack_power_budget_watts") or self.ctx.power_budget_watts
            if not budget:
                continue
            ratio = item.value / budget
            cond = True if ratio > self.s.rack_power_over_ratio else False if ratio <= self.s.rack_power_clear_ratio else None
            yield Observation("rack_power_over_budget", targets_of(rack=self.ctx.rack), "warning", cond,
                              detail={"power_watts": item.value, "budget_watts": budget})

    # -- PDU outlets -------------------------------------------------------------

    def _outlets(self, snap: Snapshot) -> Iterator[Observation]:
        """An outlet that feeds an inventory node reads off: a tripped breaker or a person's switch. The node
        may run on its other feed, so nothing else notices that its power is no longer redundant."""
        feeds = self.ctx.outlet_feeds
        if not feeds:
            return
        for item in self._ok_or_fault(snap.select("supernode_pdu_outlet_on")):
            if isinstance(item, Observation):
                yield item
                continue
            pdu, outlet = item.label("pdu"), item.label("outlet")
            node = feeds.get((pdu, outlet))
            if node is None:
                continue
            yield Observation("pdu_outlet_off", targets_of(pdu=pdu, outlet=outlet), "warning", item.value < 0.5,
                              detail={"feeds": node})
