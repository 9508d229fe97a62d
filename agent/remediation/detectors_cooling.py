"""Detectors of the liquid loop: leaks (zone sensors, tray BMCs rack-wide) and coolant (flow, supply, dew point).

Why apart: these are the detectors a leak response hangs on, read from the
leak sources and the CDU; nothing here reads a GPU or a link. A leak source
that stops answering turns its zones' state into "unknown"
(fault="source_down"), a critical incident of its own, never a leak.
"""

from __future__ import annotations

from typing import Any, Iterator

from exporters.model import Reading

from agent.snapshot import Snapshot

from .detectors_base import DetectorBase
from .hysteresis import Observation, Targets, targets_of

SOURCE_DOWN = "source_down"  # the leak watch's fault label (agent/derived.py): the sensor cannot be read


class CoolingDetectors(DetectorBase):
    """Leaks and coolant, methods of the detector table (`Detectors`)."""

    # -- leaks -------------------------------------------------------------------

    def _leak(self, snap: Snapshot) -> Iterator[Observation]:
        zones: dict[str, list[Reading]] = {}
        for item in self._ok_or_fault(snap.select("supernode_leak_detected")):
            if isinstance(item, Observation):
                if item.cond:
                    labels = dict(item.targets)
                    yield Observation("leak_sensor_fault", targets_of(**_zone_sensor_from_id(labels["reading"])),
                                      "warning", True, detail={"quality": item.detail.get("quality")})
                yield item
                continue
            zones.setdefault(item.label("zone"), []).append(item)
        for zone, rs in zones.items():
            wet_rs = [r for r in rs if r.value >= 0.5]
            # Consecutive polls are counted on the wet sensors' own readings: another source of the same zone
            # (a tray BMC and the rack's leak rope) publishing in between is not a second poll of the wet one,
            # nor does its newer timestamp hide that wet one's first reading.
            yield Observation("leak", targets_of(zone=zone), "critical", bool(wet_rs),
                              sample_ts=max(r.timestamp for r in (wet_rs or rs)),
                              detail={"sensors": sorted(r.label("sensor") for r in wet_rs),
                                      # a fault drill's synthetic sensor (agent.drill): its incident says so
                                      **({"drill": True} if wet_rs and all(r.label("drill") == "true"
                                                                           for r in wet_rs) else {})})
        faults: dict[Targets, bool] = {}
        unknown: dict[str, list[str]] = {}
        for r in snap.select("supernode_leak_sensor_fault"):
            on = r.ok and r.value >= 0.5
            if r.label("fault") == SOURCE_DOWN:
                # The agent cannot read this sensor at all: the zone's state is unknown (critical, notify only).
                down = unknown.setdefault(r.label("zone"), [])
                if on:
                    down.append(r.label("sensor"))
                continue
            key = targets_of(zone=r.label("zone"), sensor=r.label("sensor"))
            faults[key] = faults.get(key, False) or on
        for key, on in faults.items():
            yield Observation("leak_sensor_fault", key, "warning", on)
        for zone, sensors in unknown.items():
            yield Observation("leak_source_down", targets_of(zone=zone), "critical", bool(sensors),
                              detail={"sensors": sorted(sensors)})

    def _tray_rack(self, snap: Snapshot) -> Iterator[Observation]:
        """More than `rack_tray_leaks` trays (Redfish services of kind tray) with a wet detector: the rack.

        Counted on what this agent reads: its own tray, and every tray when it is the rack leader with
        `sources.redfish.watch_rack_trays` (else the alert SupernodeRackTrayLeaks carries the count, rack-wide,
        through the webhook). A detector that is not ok (a sensor fault) never counts.
        """
        trays = {r.label("bmc") for r in snap.select("supernode_redfish_service_info", kind="tray") if r.ok}
        if not trays:
            return
        wet = sorted({r.label("bmc") for r in snap.select("supernode_leak_detector_state")
                      if r.ok and r.value >= 1 and r.label("bmc") in trays})
        yield Observation("tray_leak_rack", targets_of(rack=self.ctx.rack), "critical",
                          len(wet) > self.s.rack_tray_leaks, detail={"trays": wet, "watched": len(trays)})

    # -- coolant -----------------------------------------------------------------

    def _coolant(self, snap: Snapshot) -> Iterator[Observation]:
        s = self.s
        for item in self._ok_or_fault(snap.select("supernode_cdu_flow_cubic_meters_per_second", loop="secondary")):
            if isinstance(item, Observation):
                yield item
                continue
            obs = self._flow_low(snap, item)
            if obs is not None:
                yield obs
        for item in self._ok_or_fault(snap.select("supernode_cdu_temperature_celsius", loop="secondary", point="supply")):
            if isinstance(item, Observation):
                yield item
                continue
            v = item.value
            cond = True if v > s.supply_hot_celsius else False if v <= s.supply_hot_clear_celsius else None
            yield Observation("coolant_supply_hot", targets_of(cdu=item.label("cdu")), "critical", cond,
                              detail={"supply_celsius": v})
        for item in self._ok_or_fault(snap.select("supernode_cdu_dew_point_margin_celsius")):
            if isinstance(item, Observation):
                yield item
                continue
            v = item.value
            cond = True if v < s.condensation_margin_celsius else False if v >= s.condensation_clear_margin_celsius else None
            yield Observation("condensation_risk", targets_of(cdu=item.label("cdu")), "warning", cond,
                              detail={"margin_celsius": v})

    def _flow_low(self, snap: Snapshot, flow: Reading) -> Observation | None:
        """Flow against the configured nominal or the rolling baseline, confirmed by a rising ΔT.

        A pump set point change is not a fault: the baseline restarts once the
        new flow has settled, and no decision is taken meanwhile. Only healthy
        samples (at or above the clear ratio) feed the baseline.
        """
        s, base, now = self.s, self.flow_baselines, snap.monotonic
        cdu = flow.label("cdu")
        setpoint = snap.value("supernode_cdu_pump_speed_setpoint_ratio", cdu=cdu)
        if setpoint is not None:
            base.setpoint(cdu, setpoint, now)
        if base.settling(cdu, now):
            return Observation("coolant_flow_low", targets_of(cdu=cdu), "critical", None,
                               detail={"settling_after_setpoint": setpoint})
        sup = snap.value("supernode_cdu_temperature_celsius", cdu=cdu, loop="secondary", point="supply")
        ret = snap.value("supernode_cdu_temperature_celsius", cdu=cdu, loop="secondary", point="return")
        delta_t = ret - sup if sup is not None and ret is not None else None
        nominal = s.nominal_flow_cubic_meters_per_second or base.flow(cdu, now)
        if nominal is None:  # the first sample starts the baseline
            base.add(cdu, flow.timestamp, flow.value, delta_t, now)
            return None
        if nominal <= 0:
            return None
        ratio = flow.value / nominal
        cond: bool | None = True if ratio < s.flow_low_ratio else False if ratio >= s.flow_clear_ratio else None
        detail: dict[str, Any] = {"flow_ratio": round(ratio, 3), "baseline_cubic_meters_per_second": nominal}
        if cond:  # which part of the loop failed: the reliability report counts a pump or the CDU
            detail.update(_pump_evidence(snap, cdu))
        mean_dt = base.delta_t(cdu, now)
        if cond and s.flow_confirm_delta_t and delta_t is not None and mean_dt is not None:
            detail.update(delta_t_celsius=round(delta_t, 2), baseline_delta_t_celsius=round(mean_dt, 2))
            if delta_t < mean_dt + s.flow_confirm_delta_t_rise_celsius:
                cond = None  # flow reads low but the loop carries heat as before: a meter, not the loop
        if cond is False:
            base.add(cdu, flow.timestamp, flow.value, delta_t, now)
        return Observation("coolant_flow_low", targets_of(cdu=cdu), "critical", cond, detail=detail)


def _pump_evidence(snap: Snapshot, cdu: str) -> dict[str, Any]:
    """The CDU's own word on its pumps while flow is low: pumps reading stopped, pump alarms active."""
    stopped = sorted(r.label("pump") for r in snap.select("supernode_cdu_pump_running", cdu=cdu)
                     if r.ok and r.value < 0.5)
    alarms = sorted(r.label("alarm") for r in snap.select("supernode_cdu_alarm_active", cdu=cdu)
                    if r.ok and r.value >= 0.5 and "pump" in r.label("alarm"))
    return {k: v for k, v in (("pumps_stopped", stopped), ("pump_alarms", alarms)) if v}


def _zone_sensor_from_id(reading_id: str) -> dict[str, str]:
    parts = dict(p.split("=", 1) for p in reading_id.split(",")[1:] if "=" in p)
    return {"zone": parts.get("zone", ""), "sensor": parts.get("sensor", "")}
