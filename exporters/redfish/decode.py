"""Readings from Redfish resources, with the quality rules every source follows.

- `Status.State` Absent or Disabled (the profile's unsupported_states): the
  resource's readings are `unsupported`, not faults; a disabled detector is
  not a wired leak input, so it feeds no `supernode_leak_detected`.
- `Status.State` UnavailableOffline (fault_states), a missing or unknown
  `DetectorState`, a `null` or non-numeric Reading, or a detector whose own
  Health is worse than its DetectorState (the schema says they equate while
  the detector works; a short or a cut cable shows as Health and Conditions)
  are `sensor_fault`: never a real zero, never a leak.
- `Status.Health` is exported as a number (0 OK, 1 Warning, 2 Critical).
A field the resource does not carry at all is not a reading (this device
has no such sensor); a field it carries as null is a sensor fault.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

from exporters.cooling import modbus_metrics as mm
from exporters.model import Quality, Reading, make_reading
from exporters.redfish import metrics as rm
from exporters.redfish.discovery import Found
from exporters.redfish.profile import Profile

DETECTOR_FAULT = "detector"  # the fault label of supernode_leak_sensor_fault for a Redfish detector's own fault
NAN = float("nan")


def sensor_name(bmc: str, found: Found) -> str:
    """The `sensor` label of a Redfish detector's leak series: unique over the rack's services."""
    return f"{bmc}/{found.chassis}/{found.rid}"


def _status(res: dict[str, Any]) -> dict[str, Any]:
    status = res.get("Status")
    return status if isinstance(status, dict) else {}


def state_quality(res: dict[str, Any], profile: Profile) -> Quality:
    state = _status(res).get("State")
    if state in profile.status.unsupported_states:
        return Quality.UNSUPPORTED
    if state in profile.status.fault_states:
        return Quality.SENSOR_FAULT
    return Quality.OK


def health_value(res: dict[str, Any], profile: Profile) -> int | None:
    health = _status(res).get("Health")
    return profile.status.health.get(health) if isinstance(health, str) else None


def _number(value: Any, key: str = "Reading") -> float | None:
    if isinstance(value, dict):
        value = value.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return None if math.isnan(value) or math.isinf(value) else value


def detector_readings(bmc: str, zone: str, found: Found, res: dict[str, Any], profile: Profile,
                      now: float) -> list[Reading]:
    """DetectorState (0/1/2), the detector's health, and its leak series in its zone."""
    rules = profile.leak_detector
    q = state_quality(res, profile)
    raw = res.get(rules.state_field)
    state = rules.states.get(raw) if isinstance(raw, str) else None
    health = health_value(res, profile)
    if q is Quality.OK and (state is None or (health is not None and health > state)):
        q = Quality.SENSOR_FAULT
    labels = {"bmc": bmc, "chassis": found.chassis, "detector": found.rid, "type": found.type}
    value = float(state) if state is not None else NAN
    out = [make_reading(rm.DETECTOR_STATE, value, labels, q, now)]
    out.extend(_health(bmc, found, res, profile, now))
    if q is Quality.UNSUPPORTED:
        return out  # nothing wired there: no leak input, no fault of one
    leak = {"zone": zone, "sensor": sensor_name(bmc, found)}
    wet = 1.0 if state is not None and rules.wet(state) else 0.0
    out.append(make_reading(mm.LEAK_DETECTED, wet if q is Quality.OK else value, leak, q, now))
    out.append(make_reading(mm.LEAK_FAULT, 1.0 if q is Quality.SENSOR_FAULT else 0.0,
                            {**leak, "fault": DETECTOR_FAULT}, Quality.OK, now))
    return out


def _health(bmc: str, found: Found, res: dict[str, Any], profile: Profile, now: float) -> Iterator[Reading]:
    health = health_value(res, profile)
    if health is not None and state_quality(res, profile) is not Quality.UNSUPPORTED:
        yield make_reading(rm.HEALTH, float(health), {"bmc": bmc, "equipment": found.equipment, "kind": found.kind,
                                                      "resource": found.rid}, Quality.OK, now)


def _own_labels(bmc: str, found: Found) -> dict[str, str]:
    labels = {"bmc": bmc, "equipment": found.equipment}
    if found.kind == "connector":
        labels.update(connector=found.rid, loop=found.loop or "")
    elif found.kind in ("pump", "reservoir", "sensor"):
        labels[found.kind] = found.rid
    return labels


def resource_readings(bmc: str, found: Found, res: dict[str, Any], profile: Profile, now: float) -> list[Reading]:
    """The profile's reading fields of one connector, pump, filter, reservoir or sensor, and its health (a
    chassis: its health alone)."""
    out = list(_health(bmc, found, res, profile, now))
    q_state = state_quality(res, profile)
    own = _own_labels(bmc, found)
    for fname, rule in profile.fields.get(found.kind, {}).items():  # type: ignore[call-overload]
        if fname not in res:
            continue  # this device has no such sensor
        value = _number(res[fname], rule.key)
        q = q_state if q_state is not Quality.OK else (Quality.OK if value is not None else Quality.SENSOR_FAULT)
        base = rule.to_base(value) if value is not None else NAN
        spec = rm.ALL[rule.metric]
        labels = {**own, **rule.labels}
        if "resource" in spec.labels:  # a family over resource kinds (service time): kind and id, not the kind's label
            labels = {"bmc": bmc, "equipment": found.equipment, "kind": found.kind, "resource": found.rid}
        out.append(make_reading(spec, base, labels, q, now))
    return out

