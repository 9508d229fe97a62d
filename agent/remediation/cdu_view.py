"""One view of every CDU's loop, whichever protocol serves it: what the coolant detectors read.

An SNMP CDU (exporters/cooling/snmp_cdu.py) needs no translation: its profile maps its MIB onto the Modbus CDU's
own families. Why a mapping layer and not a second set of series for Redfish: a Modbus CDU publishes
`supernode_cdu_*{cdu, loop, point}`; a Redfish CDU publishes what its
resources are (`supernode_coolant_connector_*{bmc, equipment, connector,
loop}`, `supernode_coolant_pump_speed_ratio{bmc, equipment, pump}`, each
resource's `supernode_redfish_health`). Re-exporting the Redfish values under
the Modbus names would put every quantity twice in /metrics (twice in any
sum over CDUs) and lose the resource labels a person needs to find the part.
So the exposition stays what each device says, and this module translates
at the reading level, for the detectors only: the same families and labels
(`cdu`, `loop`, `point`, `pump`) out of either source, so one detector
definition serves both. A Redfish service is a CDU when the inventory says
so (`supernode_redfish_service_info{kind="cdu"}`); its `bmc` is the `cdu`.

A Redfish reading that is not ok is handed on unchanged (its sensor-fault
observation names the real series); only ok readings are translated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import exporters.cooling.modbus_metrics as mm
from exporters.model import MetricSpec, Quality, Reading, make_reading

from agent.snapshot import Snapshot

# The Redfish families the view reads (the detector table's INPUTS name them, with the Modbus ones). Family
# names are written out where they are read, as everywhere in the detectors: the detector table's test
# collects them from the code.
REDFISH_FAMILIES = frozenset({
    "supernode_coolant_connector_flow_cubic_meters_per_second", "supernode_coolant_connector_temperature_celsius",
    "supernode_coolant_connector_pressure_pascals", "supernode_coolant_pump_speed_ratio",
    "supernode_coolant_pump_speed_setpoint_ratio", "supernode_redfish_health", "supernode_redfish_service_info"})


def redfish_cdus(snap: Snapshot) -> frozenset[str]:
    """The Redfish services the inventory names as CDUs (their `bmc` label)."""
    return frozenset(r.label("bmc") for r in snap.select("supernode_redfish_service_info", kind="cdu") if r.ok)


def loop_readings(snap: Snapshot, family: str, **labels: str) -> Iterator[Reading]:
    """`family` (a Modbus CDU's flow, temperature or pressure) from every CDU: the Modbus readings as they are,
    a Redfish CDU's coolant connectors as readings of that family with `cdu` = its bmc. `labels` filter (cdu,
    loop, point) on the translated labels."""
    redfish_of = {"supernode_cdu_flow_cubic_meters_per_second": "supernode_coolant_connector_flow_cubic_meters_per_second",
                  "supernode_cdu_temperature_celsius": "supernode_coolant_connector_temperature_celsius",
                  "supernode_cdu_pressure_pascals": "supernode_coolant_connector_pressure_pascals"}
    spec: MetricSpec = mm.ALL[family]
    want_cdu = labels.get("cdu")
    yield from snap.select(family, **labels)
    rf_labels = {k: v for k, v in labels.items() if k != "cdu"}
    for bmc in sorted(redfish_cdus(snap)):
        if want_cdu is not None and bmc != want_cdu:
            continue
        for r in snap.select(redfish_of[family], bmc=bmc, **rf_labels):
            if not r.ok:
                yield r
                continue
            out = {"cdu": bmc, "loop": r.label("loop")}
            if "point" in spec.labels:
                out["point"] = r.label("point")
            yield make_reading(spec, r.value, out, Quality.OK, r.timestamp)


def loop_value(snap: Snapshot, family: str, **labels: str) -> float | None:
    """The one ok value of `family` for these labels from either source, or None (missing or not ok)."""
    return next((r.value for r in loop_readings(snap, family, **labels) if r.ok), None)


def pump_setpoint(snap: Snapshot, cdu: str) -> float | None:
    """The CDU's pump speed set point: Modbus reports one per CDU; a Redfish CDU one per pump
    (SpeedControlPercent.SetPoint), of which the highest stands for the CDU (a change of any is a change)."""
    v = snap.value("supernode_cdu_pump_speed_setpoint_ratio", cdu=cdu)
    if v is not None or cdu not in redfish_cdus(snap):
        return v
    per_pump = [r.value for r in snap.select("supernode_coolant_pump_speed_setpoint_ratio", bmc=cdu) if r.ok]
    return max(per_pump) if per_pump else None


@dataclass(frozen=True)
class PumpState:
    """A pump as the detectors see it: running (None: unknown) and its speed as a ratio (None: not read)."""

    pump: str
    running: bool | None
    speed_ratio: float | None


def pumps(snap: Snapshot, cdu: str) -> list[PumpState]:
    """Every pump of one CDU. Modbus: `supernode_cdu_pump_running` and `_speed_ratio`. Redfish: a pump whose
    Status is UnavailableOffline (its speed reads as a sensor fault) or whose Health is Critical is stopped;
    one whose speed reads ok with Health below Critical runs."""
    out: dict[str, PumpState] = {}
    for r in snap.select("supernode_cdu_pump_running", cdu=cdu):
        speed = snap.value("supernode_cdu_pump_speed_ratio", cdu=cdu, pump=r.label("pump"))
        out[r.label("pump")] = PumpState(r.label("pump"), (r.value >= 0.5) if r.ok else None, speed)
    if out or cdu not in redfish_cdus(snap):
        return sorted(out.values(), key=lambda p: p.pump)
    health = {r.label("resource"): r.value for r in snap.select("supernode_redfish_health", bmc=cdu, kind="pump")
              if r.ok}
    for r in snap.select("supernode_coolant_pump_speed_ratio", bmc=cdu):
        pump = r.label("pump")
        critical = health.get(pump, 0.0) >= 2
        if r.quality is Quality.SENSOR_FAULT or critical:
            out[pump] = PumpState(pump, False, r.value if r.ok else None)
        elif r.ok:
            out[pump] = PumpState(pump, True, r.value)
        else:
            out[pump] = PumpState(pump, None, None)
    return sorted(out.values(), key=lambda p: p.pump)
