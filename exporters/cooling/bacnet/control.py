"""Control points of a BACnet device (a zone valve, a set point): a priority-array aware write, read back, and read.

Why priority-array aware: a commandable BACnet object's present value is the
value at its highest active priority, so a write at the profile's priority
(8 by default) can succeed and change nothing, when a life-safety or BMS
command holds a higher slot. The write is therefore read back, and a value
that did not move is reported as overridden at that priority (a
SourceError naming it), never as done: remediation's valve step then fails
and says why, and the guardrails (approval, journal) stay what they are.
"""

from __future__ import annotations

from typing import Any

from bacpypes3.basetypes import BinaryPV
from bacpypes3.primitivedata import ObjectIdentifier, Real, Unsigned

from exporters.cooling.bacnet.client import BacnetLink, link_for, release_link
from exporters.cooling.bacnet.decode import PropertyProblem
from exporters.cooling.bacnet.profile import ANALOG, BINARY, Point, load_profile
from exporters.model import SourceError


def _typed(p: Point, value: float) -> Any:
    """The device-unit value as the object's present-value type (Real, BinaryPV, Unsigned state number)."""
    if p.object_type in ANALOG:
        return Real((value - p.offset) / p.scale)
    if p.object_type in BINARY:
        return BinaryPV("active" if bool(value) != p.invert else "inactive")
    states = [s for s, v in (p.states or {}).items() if v == value]
    if not states:
        raise ValueError(f"{p.name}: no state of the profile reads {value}")
    return Unsigned(states[0])


def _device_value(p: Point, pv: Any) -> float:
    if p.object_type in ANALOG:
        return float(pv) * p.scale + p.offset
    if p.object_type in BINARY:
        return float((pv == "active") != p.invert)
    return float((p.states or {}).get(int(pv), float("nan")))


def _point(device_cfg: Any, point_name: str) -> Point:
    profile = load_profile(device_cfg.profile)
    p = profile.point(point_name)
    if p.control is None:
        raise ValueError(f"{profile.name}.{point_name}: not a control point")
    return p


def _link(device_cfg: Any, timeout: float) -> BacnetLink:
    return link_for(device_cfg.host, device_cfg.port, device_instance=getattr(device_cfg, "device_instance", None),
                    timeout=timeout, name=getattr(device_cfg, "name", ""))


async def write_control_point(device_cfg: Any, point_name: str, value: float, timeout: float = 2.0) -> float:
    """Write a control point (device unit, within its allowed range) at the profile's priority and read it back.

    Returns the read-back value (device unit). Raises ValueError for a point that is not writable or a value out of
    range, SourceError when the device refuses, does not answer, or a higher priority holds another value."""
    p = _point(device_cfg, point_name)
    assert p.control is not None
    if not p.control.min <= value <= p.control.max:
        raise ValueError(f"{point_name}: {value} outside the allowed range [{p.control.min}, {p.control.max}]")
    link = _link(device_cfg, timeout)
    try:
        await link.identify()
        objid = ObjectIdentifier(p.object)
        await link.write(objid, _typed(p, value), p.control.priority)
        got = await link.read([(objid, ("present-value", "priority-array"))])
    finally:
        await release_link(link)
    pv = got.get(objid, {}).get("present-value")
    if pv is None or isinstance(pv, PropertyProblem):
        raise SourceError("protocol", f"{point_name}: present value not readable after the write ({pv})")
    back = _device_value(p, pv)
    want = float(bool(value)) if p.object_type in BINARY else value
    if not abs(back - want) <= 1e-4 * max(1.0, abs(want)):  # a Real is 32 bits on the wire
        slots = got.get(objid, {}).get("priority-array")
        holder = next((i + 1 for i, v in enumerate(slots) if v is not None), None) \
            if isinstance(slots, list) else None
        if holder is not None and holder < p.control.priority:
            raise SourceError("protocol", f"{point_name}: overridden at priority {holder} (ours is "
                                          f"{p.control.priority}); the device keeps {back:g}")
        raise SourceError("protocol", f"{point_name}: wrote {value:g}, the device reads back {back:g}")
    return back


async def read_control_point(device_cfg: Any, point_name: str, timeout: float = 2.0) -> float:
    """The current value of a control point (device unit): what remediation records before writing."""
    p = _point(device_cfg, point_name)
    link = _link(device_cfg, timeout)
    try:
        await link.identify()
        objid = ObjectIdentifier(p.object)
        got = await link.read([(objid, ("present-value",))])
    finally:
        await release_link(link)
    pv = got.get(objid, {}).get("present-value")
    if pv is None or isinstance(pv, PropertyProblem):
        raise SourceError("protocol", f"{point_name}: present value not readable ({pv})")
    return _device_value(p, pv)
