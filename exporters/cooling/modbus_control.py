"""Control points of a Modbus device (a zone valve, a pump set point): write with read-back, and read.

Why apart from the collector: remediation writes through these, one request
at a time on the shared gateway, while the collector only reads blocks.
"""

from __future__ import annotations

from typing import Any

from exporters.model import SourceError
from exporters.cooling.modbus_client import ModbusExceptionReply, gateway_for, release_gateway
from exporters.cooling.modbus_codec import decode, encode
from exporters.cooling.modbus_profile import Block, load_profile


async def write_control_point(device_cfg: Any, point_name: str, value: float, timeout: float = 2.0) -> float:
    """Write a control point (value in the point's device unit, within its allowed range) and read it back.

    `device_cfg` has `profile`, `host`, `port` and `unit` (the inventory's
    ModbusDevice). Returns the read-back value in the device unit; raises
    ValueError for a point that is not writable or a value out of range, and
    SourceError when the device refuses or does not answer.
    """
    profile = load_profile(device_cfg.profile)
    p = profile.point(point_name)
    if p.control is None:
        raise ValueError(f"{profile.name}.{point_name}: not a control point")
    if not p.control.min <= value <= p.control.max:
        raise ValueError(f"{profile.name}.{point_name}: {value} outside the allowed range "
                         f"[{p.control.min}, {p.control.max}] {p.unit}")
    unit = profile.device.unit if getattr(device_cfg, "unit", None) is None else device_cfg.unit
    raw = (value - p.offset) / p.scale
    words = [1 if raw else 0] if p.type == "bit" else encode(raw, p.type, p.order)
    gw = gateway_for(device_cfg.host, device_cfg.port, timeout)
    try:
        try:
            await gw.write(p.table, p.address, words, unit)
        except ModbusExceptionReply as exc:
            raise SourceError("protocol", str(exc)) from None
        back = await gw.read(Block(p.table, p.address, p.width, (p,)).fc, p.address, p.width, unit)
    finally:
        release_gateway(gw)
    raw_back = back[0] if p.type == "bit" else decode(back, p.type, p.order)
    return raw_back * p.scale + p.offset


async def read_control_point(device_cfg: Any, point_name: str, timeout: float = 2.0) -> float:
    """The current value of a control point (device unit): what remediation records before writing."""
    profile = load_profile(device_cfg.profile)
    p = profile.point(point_name)
    if p.control is None:
        raise ValueError(f"{profile.name}.{point_name}: not a control point")
    unit = profile.device.unit if getattr(device_cfg, "unit", None) is None else device_cfg.unit
    gw = gateway_for(device_cfg.host, device_cfg.port, timeout)
    try:
        try:
            back = await gw.read(Block(p.table, p.address, p.width, (p,)).fc, p.address, p.width, unit)
        except ModbusExceptionReply as exc:
            raise SourceError("protocol", str(exc)) from None
    finally:
        release_gateway(gw)
    raw_back = back[0] if p.type == "bit" else decode(back, p.type, p.order)
    return raw_back * p.scale + p.offset
