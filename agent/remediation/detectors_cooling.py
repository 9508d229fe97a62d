"""Detectors of the liquid loop: leaks by scope (tray, zone, loop; tray BMCs rack-wide) and coolant (flow, supply,
dew point).

Why apart: these are the detectors a leak response hangs on, read from the
leak sources and the CDU; nothing here reads a GPU or a link. A leak source
that stops answering turns its zones' state into "unknown"
(fault="source_down"), a critical incident of its own, never a leak.
"""

from __future__ import annotations

from typing import Any, Iterator

from exporters.model import Reading

from agent.snapshot import Snapshot

from .cdu_view import loop_readings, loop_value, pump_setpoint, pumps
from .detectors_base import DetectorBase
from .dry_hold import DRY, UNREADABLE, WET
from .hysteresis import Observation, Targets, targets_of
from .leak_scope import tray_of_sensor, trays_below, zone_evidence

SOURCE_DOWN = "source_down"  # the leak watch's fault label (agent/derived.py): the sensor cannot be read


def _synthetic(r: Reading) -> bool:
    """A fault drill's reading (agent/drill/source.py labels every one `drill="true"`)."""
    return r.label("drill") == "true"


def wet_detail(wet: list[Reading]) -> dict[str, Any]:
    """The wet detectors in a leak incident's detail: `sensors` the real ones (what its undo waits to read dry,
    leak_resume.py), `drill_sensors` a fault drill's synthetic ones apart (they exist only while the drill
    runs), and `drill: true` when only a drill's are wet (the incident is the drill's)."""
    real = sorted({r.label("sensor") for r in wet if not _synthetic(r)})
    synthetic = sorted({r.label("sensor") for r in wet if _synthetic(r)})
    return {"sensors": real, **({"drill_sensors": synthetic} if synthetic else {}),
            **({"drill": True} if synthetic and not real else {})}


class CoolingDetectors(DetectorBase):
    """Leaks and coolant, methods of the detector table (`Detectors`)."""

    # -- leaks -------------------------------------------------------------------

    def _leak(self, snap: Snapshot) -> Iterator[Observation]:
        """Per zone: `leak` (the zone's scope) only on zone evidence, and `leak_tray` per compute tray whose own
        detectors are wet (leak_scope.py); every detector's reading also feeds the dry history."""
        zones: dict[str, list[Reading]] = {}
        seen: list[tuple[str, str]] = []
        for item in self._ok_or_fault(snap.select("supernode_leak_detected")):
            if isinstance(item, Observation):
                if item.cond:
                    labels = dict(item.targets)
                    where = _zone_sensor_from_id(labels["reading"])
                    self.dry.observe(where["zone"], where["sensor"], UNREADABLE, 0.0)
                    seen.append((where["zone"], where["sensor"]))
                    yield Observation("leak_sensor_fault", targets_of(**where),
                                      "warning", True, detail={"quality": item.detail.get("quality")})
                yield item
                continue
            zones.setdefault(item.label("zone"), []).append(item)
        for zone, rs in zones.items():
            wet_rs = [r for r in rs if r.value >= 0.5]
            for r in rs:
                if _synthetic(r):
                    continue  # a drill's sensor exists only while its drill runs: no detector to hold dry
                self.dry.observe(zone, r.label("sensor"), WET if r.value >= 0.5 else DRY, r.timestamp)
                seen.append((zone, r.label("sensor")))
            yield from self._leak_scopes(zone, rs, wet_rs)
        self.dry.vanished(seen)
        faults: dict[Targets, bool] = {}
        unknown: dict[str, list[str]] = {}
        for r in snap.select("supernode_leak_sensor_fault"):
            on = r.ok and r.value >= 0.5
            if on or not r.ok:  # a detector that cannot be read now is not dry (dry_hold.py)
                self.dry.observe(r.label("zone"), r.label("sensor"), UNREADABLE, 0.0)
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

    def _leak_scopes(self, zone: str, rs: list[Reading], wet_rs: list[Reading]) -> Iterator[Observation]:
        """The zone's `leak` on zone evidence only, and one `leak_tray` per compute tray read in the zone."""
        # Consecutive polls are counted on the wet sensors' own readings: another source of the same zone
        # (a tray BMC and the rack's leak rope) publishing in between is not a second poll of the wet one,
        # nor does its newer timestamp hide that wet one's first reading.
        ctx = self.ctx
        wet = sorted(r.label("sensor") for r in wet_rs)
        why = zone_evidence(wet, ctx.tray_bmcs, self.s.zone_leak_trays)
        zone_rs = wet_rs if why else rs
        yield Observation("leak", targets_of(zone=zone), "critical", why is not None,
                          sample_ts=max(r.timestamp for r in zone_rs),
                          detail={**wet_detail(wet_rs), "scope": "zone", **({"evidence": why} if why else {})})
        trays: dict[str, list[Reading]] = {}
        for r in rs:
            tray = tray_of_sensor(r.label("sensor"), ctx.tray_bmcs)
            if tray is not None:
                trays.setdefault(tray, []).append(r)
        for tray, trs in trays.items():
            twet = [r for r in trs if r.value >= 0.5]
            detail: dict[str, Any] = {**wet_detail(twet), "scope": "tray"}
            if twet:
                detail["watched"] = trays_below(ctx.rack_units, tray, ctx.watch_below_trays)
                detail["evidence"] = f"tray {tray}'s own detectors wet"
                if not ctx.rack_units:
                    detail["watched_unknown"] = "inventory.rack_units not set: no tray is known to be below"
            yield Observation("leak_tray", targets_of(zone=zone, tray=tray), "critical", bool(twet),
                              sample_ts=max(r.timestamp for r in (twet or trs)), detail=detail)

    def _leak_loop(self, snap: Snapshot) -> Iterator[Observation]:
        """A detector wet while the loop loses coolant: secondary flow below `flow_low_ratio` of its baseline,
        or supply pressure below the configured floor. Either is named in the evidence; neither readable (no
        baseline yet, no pressure) is no evidence, so the leak stays at its narrower scope."""
        s = self.s
        wet_rs = [r for r in snap.select("supernode_leak_detected") if r.ok and r.value >= 0.5]
        for flow in snap.select("supernode_cdu_flow_cubic_meters_per_second", loop="secondary"):
            if not flow.ok:
                continue
            cdu = flow.label("cdu")
            evidence: dict[str, Any] = {}
            nominal = s.nominal_flow_cubic_meters_per_second or self.flow_baselines.flow(cdu, snap.monotonic)
            if nominal and flow.value / nominal < s.flow_low_ratio:
                evidence["flow_ratio"] = round(flow.value / nominal, 3)
            pressure = snap.value("supernode_cdu_pressure_pascals", cdu=cdu, loop="secondary", point="supply")
            floor = s.leak_loop_pressure_floor_pascals
            if floor is not None and pressure is not None and pressure < floor:
                evidence["supply_pressure_pascals"] = pressure
            yield Observation("leak_loop", targets_of(cdu=cdu), "critical", bool(wet_rs and evidence),
                              detail={**wet_detail(wet_rs), "scope": "loop", **evidence})

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
        """Flow, supply and dew point of every CDU, Modbus or Redfish alike (cdu_view.py translates)."""
        s = self.s
        flows = loop_readings(snap, "supernode_cdu_flow_cubic_meters_per_second", loop="secondary")
        for item in self._ok_or_fault(flows):
            if isinstance(item, Observation):
                yield item
                continue
            obs = self._flow_low(snap, item)
            if obs is not None:
                yield obs
        supplies = loop_readings(snap, "supernode_cdu_temperature_celsius", loop="secondary", point="supply")
        for item in self._ok_or_fault(supplies):
            if isinstance(item, Observation):
                yield item
                continue
            v = item.value
            cond = True if v > s.supply_hot_celsius else False if v <= s.supply_hot_clear_celsius else None
            yield Observation("coolant_supply_hot", targets_of(cdu=item.label("cdu")), "critical", cond,
                              detail={"supply_celsius": v, **loop_evidence(snap, item.label("cdu"))})
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
        setpoint = pump_setpoint(snap, cdu)
        if setpoint is not None:
            base.setpoint(cdu, setpoint, now)
        if base.settling(cdu, now):
            return Observation("coolant_flow_low", targets_of(cdu=cdu), "critical", None,
                               detail={"settling_after_setpoint": setpoint})
        sup = loop_value(snap, "supernode_cdu_temperature_celsius", cdu=cdu, loop="secondary", point="supply")
        ret = loop_value(snap, "supernode_cdu_temperature_celsius", cdu=cdu, loop="secondary", point="return")
        delta_t = ret - sup if sup is not None and ret is not None else None
        nominal = s.nominal_flow_cubic_meters_per_second or base.flow(cdu, now)
        if nominal is None:  # the first sample starts the baseline
            base.add(cdu, flow.timestamp, flow.value, delta_t, now)
            return None
        if nominal <= 0:
            return None
        ratio = flow.value / nominal
        cond: bool | None = True if ratio < s.flow_low_ratio else False if ratio >= s.flow_clear_ratio else None
        detail: dict[str, Any] = {"flow_ratio": round(ratio, 3), "baseline_cubic_meters_per_second": nominal,
                                  **({"drill": True} if _synthetic(flow) else {})}  # a drill's stand-in flow
        if cond:  # which part of the loop failed: the reliability report counts a pump or the CDU
            detail.update(_pump_evidence(snap, cdu))
            detail.update(loop_evidence(snap, cdu))
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
    stopped = sorted(p.pump for p in pumps(snap, cdu) if p.running is False)
    alarms = sorted(r.label("alarm") for r in snap.select("supernode_cdu_alarm_active", cdu=cdu)
                    if r.ok and r.value >= 0.5 and "pump" in r.label("alarm"))
    return {k: v for k, v in (("pumps_stopped", stopped), ("pump_alarms", alarms)) if v}


def loop_evidence(snap: Snapshot, cdu: str) -> dict[str, float]:
    """What the derate by margin needs of the loop (agent/remediation/derate.py), as the incident's detail:
    secondary flow, supply and return (a missing one is left out: the derate then falls back to flat), and the
    rack's power and PDU budget when known."""
    temp = "supernode_cdu_temperature_celsius"
    out = {"flow_cubic_meters_per_second": loop_value(snap, "supernode_cdu_flow_cubic_meters_per_second", cdu=cdu,
                                                      loop="secondary"),
           "supply_celsius": loop_value(snap, temp, cdu=cdu, loop="secondary", point="supply"),
           "return_celsius": loop_value(snap, temp, cdu=cdu, loop="secondary", point="return"),
           # the rack's draw against its PDU budget: the derate sheds at least what is over it
           "rack_power_watts": snap.value("supernode_rack_power_watts"),
           "power_budget_watts": snap.value("supernode_rack_power_budget_watts")}
    return {k: v for k, v in out.items() if v is not None}


def _zone_sensor_from_id(reading_id: str) -> dict[str, str]:
    parts = dict(p.split("=", 1) for p in reading_id.split(",")[1:] if "=" in p)
    return {"zone": parts.get("zone", ""), "sensor": parts.get("sensor", "")}
