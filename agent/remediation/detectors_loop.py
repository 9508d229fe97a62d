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

LOOP_HEALTH = ("pump_redundancy_lost", "filter_clogging", "reservoir_low", "coolant_service_due")


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

    def _filter(self, snap: Snapshot) -> Iterator[Observation]:
        """The strainer's pressure drop (a Modbus CDU's filter differential point; DMTF's Filter carries no
        pressure) at or above `filter_dp_high_pascals`: it clogs, and the flow falls with it. The rise per
        second since the last sample goes with it (how soon it chokes the loop)."""
        s = self.s
        for item in self._ok_or_fault(snap.select("supernode_cdu_pressure_pascals", point="filter_differential")):
            if isinstance(item, Observation):
                yield item
                continue
            v = item.value
            cond = True if v >= s.filter_dp_high_pascals else False if v < s.filter_dp_clear_pascals else None
            rise = self.rates.rate(item)
            detail = {"filter_dp_pascals": v, **({"rise_pascals_per_second": round(rise, 1)} if rise else {})}
            yield Observation("filter_clogging", targets_of(cdu=item.label("cdu")), "warning", cond, detail=detail)

    def _reservoir(self, snap: Snapshot) -> Iterator[Observation]:
        """The reservoir low: a Modbus CDU's level below `reservoir_low_ratio` (clear at reservoir_clear_ratio);
        a Redfish CDU's Reservoir, whose FluidLevelStatus a CDU reports as its Status.Health, Warning or worse
        (its FluidLevelPercent, where served, against the same ratios)."""
        s = self.s
        levels = list(self._ok_or_fault(snap.select("supernode_cdu_reservoir_level_ratio")))
        levels += self._ok_or_fault(snap.select("supernode_coolant_reservoir_level_ratio"))
        seen: set[str] = set()
        for item in levels:
            if isinstance(item, Observation):
                yield item
                continue
            cdu = item.label("cdu") or item.label("bmc")
            seen.add(cdu)
            v = item.value
            cond = True if v < s.reservoir_low_ratio else False if v >= s.reservoir_clear_ratio else None
            yield Observation("reservoir_low", targets_of(cdu=cdu), "warning", cond, detail={"level_ratio": v})
        for r in snap.select("supernode_redfish_health", kind="reservoir"):
            if r.ok and r.label("bmc") not in seen and r.label("bmc") in redfish_cdus(snap):
                yield Observation("reservoir_low", targets_of(cdu=r.label("bmc")), "warning", r.value >= 1,
                                  detail={"reservoir": r.label("resource"), "health": r.value})

    def _service_hours(self, snap: Snapshot) -> Iterator[Observation]:
        """A Redfish filter (or pump) with a rated service life, in service for `service_due_fraction` of it or
        more: due for service (DMTF Filter ServiceHours against RatedServiceHours)."""
        s = self.s
        rated = {(r.label("bmc"), r.label("kind"), r.label("resource")): r.value
                 for r in snap.select("supernode_coolant_rated_service_seconds") if r.ok and r.value > 0}
        for r in snap.select("supernode_coolant_service_seconds"):
            key = (r.label("bmc"), r.label("kind"), r.label("resource"))
            if key not in rated:
                continue  # no rated life: nothing to judge against
            cond = (r.value / rated[key] >= s.service_due_fraction) if r.ok else None
            yield Observation("coolant_service_due", targets_of(cdu=key[0], kind=key[1], resource=key[2]), "warning",
                              cond, detail={"service_seconds": r.value, "rated_service_seconds": rated[key]})
