"""From what a BACnet device said about an object to readings with their quality: pure, so it is fuzzed directly.

Each value is cast to the type the standard gives that property of that
object type, one at a time: a present value that comes back as a character
string, a status-flags bit string of two bits, an enumeration no table
names, faults that one reading (a sensor fault) instead of the poll.

Quality, as for every source (the model's rules):
- `fault` in Status_Flags, or a Reliability other than no-fault-detected:
  sensor_fault (a leak input's reliability also names its fault: an
  open-loop rope is a cable break);
- `out-of-service` (flag or property) or `overridden`: stale. The present
  value is then what someone set or forced, not what the sensor measures,
  so it never drives an action, however plausible;
- a value that is not finite, out of the profile's physical range, in a unit
  the agent cannot convert, or a state the profile does not list: sensor_fault;
- an object the device does not have: unsupported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from exporters.cooling import modbus_metrics as mm
from exporters.cooling.bacnet.profile import ANALOG, BINARY, ENGINEERING_UNITS, Point
from exporters.model import MetricSpec, Quality, Reading, make_reading
from exporters.units import to_base

PROPS_ANALOG = ("present-value", "status-flags", "reliability", "out-of-service", "units")
PROPS_OTHER = ("present-value", "status-flags", "reliability", "out-of-service")
# Reliability of a leak input -> the fault label of supernode_leak_sensor_fault (the Modbus profiles' names where
# they mean the same; any other reliability is "unreliable").
LEAK_FAULTS = {"open-loop": "cable_break", "shorted-loop": "short_circuit", "no-sensor": "no_sensor",
               "communication-failure": "comm_loss"}
LEAK_FAULT_LABELS = frozenset(LEAK_FAULTS.values()) | {"unreliable"}
MAX_TEXT = 64


@dataclass(frozen=True)
class PropertyProblem:
    """A property the device did not give as asked: `error` (it answered an error for it) or `decode` (a value
    that is not of the property's type)."""

    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


_TYPES: dict[tuple[str, str], Any] = {}


def _property_type(object_type: str, prop: str) -> Any:
    key = (object_type, prop)
    if key not in _TYPES:
        from bacpypes3.primitivedata import ObjectType
        from bacpypes3.vendor import get_vendor_info

        try:
            cls = get_vendor_info(0).get_object_class(ObjectType(object_type))
            _TYPES[key] = cls.get_property_type(prop) if cls is not None else None
        except (ValueError, KeyError, TypeError, AttributeError):
            _TYPES[key] = None
    return _TYPES[key]


def cast_value(object_type: str, prop: str, value: Any) -> Any:
    """The property's value as plain Python (float, int, bool, str, tuple of flags, list), or a PropertyProblem."""
    kind = _property_type(object_type, prop)
    if kind is None:
        return PropertyProblem("decode", f"{object_type}.{prop}: no standard type")
    try:
        typed = value.cast_out(kind)
        return plain(prop, typed)
    except Exception as exc:  # a hostile value can raise anything out of the codec: it faults this value only
        return PropertyProblem("decode", f"{object_type}.{prop}: {type(exc).__name__}: {str(exc)[:80]}")


def plain(prop: str, typed: Any) -> Any:
    if prop == "status-flags":
        bits = list(typed)
        if len(bits) != 4:
            raise ValueError(f"status-flags of {len(bits)} bits")
        return tuple(bool(b) for b in bits)
    if prop in ("reliability", "units"):
        return str(typed)
    if prop == "present-value":
        from bacpypes3.primitivedata import Enumerated

        if isinstance(typed, Enumerated):  # BinaryPV: active / inactive
            return str(typed)
        if isinstance(typed, float):  # a Real has 24 bits of mantissa: its 7 digits, not float32's binary tail
            return float(f"{float(typed):.7g}") if math.isfinite(typed) else float(typed)
        if isinstance(typed, int) and not isinstance(typed, bool):
            return int(typed)
        raise TypeError(f"present-value of type {type(typed).__name__}")
    if prop == "out-of-service":
        return bool(typed)
    if prop == "protocol-services-supported":
        return [bool(b) for b in typed]
    if prop == "priority-array":
        return [_priority_value(v) for v in typed]
    if isinstance(typed, str):
        return typed[:MAX_TEXT]
    return typed


def _priority_value(v: Any) -> Any:
    """One slot of a priority array: None when relinquished (Null), else its value."""
    if v is None or getattr(v, "null", None) is not None:
        return None
    for attr in ("real", "unsigned", "enumerated", "boolean", "integer", "double"):
        got = getattr(v, attr, None)
        if got is not None:
            return str(got) if attr == "enumerated" else got
    return None


class PointPlan:
    """One wired profile point as every poll reads it: its object, the properties asked, its family and labels."""

    __slots__ = ("point", "props", "spec", "labels", "fault_labels")

    def __init__(self, point: Point, labels: Mapping[str, str]):
        self.point = point
        self.props = PROPS_ANALOG if point.object_type in ANALOG else PROPS_OTHER
        self.spec: MetricSpec = mm.ALL[point.metric]
        self.labels = labels
        self.fault_labels = ({"zone": labels["zone"], "sensor": labels.get("sensor", "")}
                             if self.spec is mm.LEAK_DETECTED else None)

    def readings(self, got: Mapping[str, Any], now: float) -> list[Reading]:
        """This point's reading (and a leak input's fault) from the properties read or pushed for its object."""
        value, quality, reliability = judge(self.point, got)
        out = [make_reading(self.spec, value, self.labels, quality, now)]
        if self.fault_labels is not None and reliability is not None:
            out.append(make_reading(mm.LEAK_FAULT, 1.0, {**self.fault_labels, "fault": reliability}, Quality.OK, now))
        return out


def judge(p: Point, got: Mapping[str, Any]) -> tuple[float, Quality, str | None]:
    """(value in base units, its quality, a leak fault name or None) of one point from its properties."""
    pv = got.get("present-value")
    if pv is None or isinstance(pv, PropertyProblem):
        missing = pv is None or (pv.kind == "error" and "unknown-object" in pv.detail)
        return math.nan, Quality.UNSUPPORTED if missing else Quality.SENSOR_FAULT, None
    flags = got.get("status-flags")
    fault = False
    stale = False
    if isinstance(flags, tuple):
        _, fault, overridden, oos = flags
        stale = overridden or oos
    elif isinstance(flags, PropertyProblem) and flags.kind == "decode":
        fault = True  # a mangled status word cannot vouch for the value
    reliability = got.get("reliability")
    leak_fault = None
    if isinstance(reliability, str) and reliability not in ("no-fault-detected", "0"):
        fault = True
        leak_fault = LEAK_FAULTS.get(reliability, "unreliable")
    elif isinstance(reliability, PropertyProblem) and reliability.kind == "decode":
        fault = True
    if fault and leak_fault is None:
        leak_fault = "unreliable"
    if got.get("out-of-service") is True:
        stale = True
    value, bad = _value(p, pv, got.get("units"))
    if fault or bad:
        return value, Quality.SENSOR_FAULT, leak_fault if fault else None
    return value, Quality.STALE if stale else Quality.OK, None


def _value(p: Point, pv: Any, units: Any) -> tuple[float, bool]:
    """(value in base units, whether it is not a usable value) of a present value."""
    kind = p.object_type
    if kind in BINARY:
        if pv not in ("active", "inactive"):
            return math.nan, True
        on = (pv == "active") != p.invert
        return (1.0 if on else 0.0), False
    if kind not in ANALOG:  # multi-state: the profile's states, nothing else
        if isinstance(pv, bool) or not isinstance(pv, int) or pv not in (p.states or {}):
            return math.nan, True
        return float((p.states or {})[pv]), False
    if isinstance(pv, bool) or not isinstance(pv, (int, float)) or not math.isfinite(pv):
        return math.nan, True
    unit = p.unit
    if isinstance(units, str):  # the device's own unit wins over the documented one
        if units not in ENGINEERING_UNITS:
            return math.nan, True
        unit = ENGINEERING_UNITS[units]
    device_value = float(pv) * p.scale + p.offset
    if p.range is not None and unit == p.unit and not p.range[0] <= device_value <= p.range[1]:
        return to_base(device_value, unit), True
    base = to_base(device_value, unit)
    if p.range is not None and unit != p.unit:  # range is in the documented unit: compare in base units
        lo, hi = to_base(p.range[0], p.unit), to_base(p.range[1], p.unit)
        if not lo <= base <= hi:
            return base, True
    return base, False
