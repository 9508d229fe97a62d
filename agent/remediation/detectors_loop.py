"""Detectors of the loop's own health, before its flow fails: pump redundancy, filter, reservoir, service hours.

Why apart from detectors_cooling: those judge what the loop delivers (flow,
supply, dew point) and start the coolant playbooks; these judge the parts
that keep it delivering, each a warning that notifies (a person plans the
service), none destructive. Every CDU, Modbus or Redfish, is read through
cdu_view.py, so one definition serves both. A part the agent cannot read is
unknown (the observation's condition is None: the incident neither opens
nor clears on it), never "fine".
"""

from __future__ import annotations

from typing import Iterator

from agent.snapshot import Snapshot

from .cdu_view import pump_setpoint, pumps, redfish_cdus
from .detectors_base import Context, DetectorBase
from .hysteresis import Observation, Tracker, targets_of
from .settings import DetectorSettings

LOOP_HEALTH = ("pump_redundancy_lost",)


class LoopHealthDetectors(DetectorBase):
    """Pump and loop health, methods of the detector table (`Detectors`)."""

    def __init__(self, settings: DetectorSettings, ctx: Context, clock=None):
        super().__init__(settings, ctx, clock)
        for name in LOOP_HEALTH:
            self.trackers[name] = Tracker(getattr(settings, name))

    def _pump_health(self, snap: Snapshot) -> Iterator[Observation]:
        """One of N pumps stopped, or turning below `pump_speed_low_fraction` of its set point (the CDU's, else
        the fastest pump's speed): the loop runs without its spare. A CDU with one pump has none to lose."""
        s = self.s
        cdus = {r.label("cdu") for r in snap.select("supernode_cdu_pump_running")} | redfish_cdus(snap)
        for cdu in sorted(cdus):
            states = pumps(snap, cdu)
            if len(states) < 2:
                continue
            ref = pump_setpoint(snap, cdu)
            speeds = [p.speed_ratio for p in states if p.running and p.speed_ratio is not None]
            if ref is None and speeds:
                ref = max(speeds)
            stopped = [p.pump for p in states if p.running is False]
            slow, between, unknown = [], [], [p.pump for p in states if p.running is None]
            for p in states:
                if not p.running or p.speed_ratio is None or not ref:
                    continue
                share = p.speed_ratio / ref
                if share < s.pump_speed_low_fraction:
                    slow.append(p.pump)
                elif share < s.pump_speed_clear_fraction:
                    between.append(p.pump)
            cond: bool | None = True if stopped or slow else None if unknown or between else False
            detail = {"pumps": len(states), "pumps_stopped": stopped, "pumps_slow": slow, "pumps_unknown": unknown}
            if ref:
                detail["reference_speed_ratio"] = round(ref, 3)
            yield Observation("pump_redundancy_lost", targets_of(cdu=cdu), "warning", cond, detail=detail)
