"""Device units and their conversion to the base units of the metric names (one table for every profile format).

Profiles (Modbus registers, Redfish fields) state values in the device's own
unit, as its manual or schema does (L/min, kPa, kW, percent); readings are
exported in base units (m^3/s, Pa, W, ratio): base = device * factor + offset.
"""

from __future__ import annotations

UNITS: dict[str, tuple[float, float]] = {
    "celsius": (1.0, 0.0), "fahrenheit": (5.0 / 9.0, -32.0 * 5.0 / 9.0),
    "lpm": (1.0 / 60000.0, 0.0), "lps": (1.0 / 1000.0, 0.0), "gpm": (3.785411784e-3 / 60.0, 0.0),
    "m3h": (1.0 / 3600.0, 0.0), "m3s": (1.0, 0.0),
    "pa": (1.0, 0.0), "kpa": (1e3, 0.0), "bar": (1e5, 0.0), "psi": (6894.757, 0.0),
    "percent": (0.01, 0.0), "ratio": (1.0, 0.0), "rpm": (1.0, 0.0), "hz": (1.0, 0.0),
    "meters": (1.0, 0.0), "feet": (0.3048, 0.0), "us_per_cm": (1e-4, 0.0), "ph": (1.0, 0.0),
    "w": (1.0, 0.0), "kw": (1e3, 0.0), "hours": (3600.0, 0.0), "seconds": (1.0, 0.0),
    "bool": (1.0, 0.0), "count": (1.0, 0.0), "none": (1.0, 0.0),
}


def known_unit(unit: str) -> str:
    """`unit` itself, or ValueError naming the known ones (for a profile validator)."""
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit!r} (known: {', '.join(sorted(UNITS))})")
    return unit


def to_base(value: float, unit: str) -> float:
    factor, offset = UNITS[unit]
    return value * factor + offset


def from_base(value: float, unit: str) -> float:
    factor, offset = UNITS[unit]
    return (value - offset) / factor
