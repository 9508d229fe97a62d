"""BACnet device profiles: which objects of a device feed which reading, in data (`exporters/profiles/bacnet/`).

A BACnet device names its own points (object type and instance) and says
each analog object's unit (its `units` property, a BACnet engineering unit),
so a profile holds less than a Modbus register map: the object, the family
and labels it feeds, the unit the vendor documents (used when the device
does not report one), an optional scale, the physical range, the states of a
multi-state object, whether the agent subscribes to its changes (COV), and
for a writable point the range and the priority a write may use. A profile
is validated in full when loaded, and a bad one is refused with the file,
the point and the field named, as for every profile format.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from exporters.cooling import modbus_metrics as mm
from exporters.cooling.modbus_profile import Control as ModbusControl, CoolingDevice, check_metric
from exporters.errors import ProfileError
from exporters.profile_files import load_named, point_names
from exporters.validation import validate_document

PROFILE_DIR = Path(__file__).resolve().parent.parent.parent / "profiles" / "bacnet"

ANALOG = ("analog-input", "analog-output", "analog-value")
BINARY = ("binary-input", "binary-output", "binary-value")
MULTISTATE = ("multi-state-input", "multi-state-output", "multi-state-value")
COMMANDABLE = ("analog-output", "analog-value", "binary-output", "binary-value", "multi-state-output",
               "multi-state-value")
OBJECT_TYPES = ANALOG + BINARY + MULTISTATE
MAX_INSTANCE = (1 << 22) - 2  # 4194303 is the "unconfigured" instance of the standard

# BACnet engineering units (ANSI/ASHRAE 135, BACnetEngineeringUnits, as bacpypes3 spells them) -> the unit names
# of exporters/units.py. Only the units a coolant loop reports; another unit is refused by the profile loader and,
# reported by a device at run time, makes that reading a sensor fault (never a value in the wrong unit).
ENGINEERING_UNITS: dict[str, str] = {
    "degrees-celsius": "celsius", "degrees-fahrenheit": "fahrenheit",
    "liters-per-minute": "lpm", "liters-per-second": "lps", "us-gallons-per-minute": "gpm",
    "cubic-meters-per-hour": "m3h", "cubic-meters-per-second": "m3s",
    "pascals": "pa", "kilopascals": "kpa", "bars": "bar", "pounds-force-per-square-inch": "psi",
    "percent": "percent", "percent-relative-humidity": "percent", "revolutions-per-minute": "rpm",
    "hertz": "hz", "watts": "w", "kilowatts": "kw", "hours": "hours", "seconds": "seconds",
    "meters": "meters", "feet": "feet", "no-units": "none",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Control(ModbusControl):
    """A point remediation may write (a zone valve, a set point): the range, and the priority of the write."""

    priority: int = Field(default=8, ge=1, le=16, description=(
        "Priority-array slot the agent writes (8: manual operator, per the standard's table). A value held at a "
        "higher priority (a lower number: life safety, a BMS override) wins over it, and the agent reports the "
        "write as overridden rather than done."))


class Point(_Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    object: str = Field(description="BACnet object as type:instance, e.g. analog-input:3 (the vendor's object list).")
    metric: str = Field(description="The family this point feeds (the cooling families every CDU protocol shares).")
    labels: dict[str, str] = Field(default_factory=dict)
    units: str | None = Field(default=None, description=(
        "Analog objects: the BACnet engineering unit the vendor documents (degrees-celsius, liters-per-minute...); "
        "the device's own `units` property wins when it reports one."))
    scale: float = Field(default=1.0, description="Multiplier applied to the present value (devices that scale).")
    offset: float = Field(default=0.0, description="Added after scale.")
    range: tuple[float, float] | None = Field(default=None, description=(
        "Physical range in the device unit after scale; a value outside is a sensor fault."))
    states: dict[int, float] | None = Field(default=None, description=(
        "Multi-state objects: state number -> the reading's value; a state not listed is a sensor fault."))
    invert: bool = Field(default=False, description="Binary objects: active reads 0 (a normally-closed contact).")
    channel: int | None = Field(default=None, ge=1, description="Leak or valve channel; mapped to a zone by the inventory.")
    cov: bool = Field(default=False, description=(
        "Subscribe to this object's changes (COV): its new value is pushed within one round trip instead of "
        "waiting for the next poll. For leak and alarm points."))
    control: Control | None = None
    note: str | None = None

    @field_validator("object")
    @classmethod
    def _object(cls, v: str) -> str:
        kind, sep, instance = v.partition(":")
        if not sep or kind not in OBJECT_TYPES:
            raise ValueError(f"expected type:instance with type one of {', '.join(OBJECT_TYPES)}, got {v!r}")
        if not instance.isdigit() or int(instance) > MAX_INSTANCE:
            raise ValueError(f"instance must be 0..{MAX_INSTANCE}, got {instance!r}")
        return f"{kind}:{int(instance)}"

    @field_validator("units")
    @classmethod
    def _units(cls, v: str | None) -> str | None:
        if v is not None and v not in ENGINEERING_UNITS:
            raise ValueError(f"unknown engineering unit {v!r} (known: {', '.join(sorted(ENGINEERING_UNITS))})")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "Point":
        kind = self.object_type
        if kind in ANALOG and self.units is None:
            raise ValueError("units: required for an analog object (the unit its vendor documents)")
        if kind not in ANALOG and self.units is not None:
            raise ValueError(f"units: only analog objects have one, not {kind}")
        if (kind in MULTISTATE) != (self.states is not None):
            raise ValueError("states: required for a multi-state object, and only for one")
        if self.invert and kind not in BINARY:
            raise ValueError("invert: only for binary objects")
        if self.control is not None and kind not in COMMANDABLE:
            raise ValueError(f"control: {kind} objects cannot be written (commandable: {', '.join(COMMANDABLE)})")
        if self.range is not None and self.range[0] > self.range[1]:
            raise ValueError(f"range {self.range} is reversed")
        return self

    @property
    def object_type(self) -> str:
        return self.object.partition(":")[0]

    @property
    def instance(self) -> int:
        return int(self.object.partition(":")[2])

    @property
    def unit(self) -> str:
        """The exporters.units name of the documented unit (binary and multi-state points: none)."""
        return ENGINEERING_UNITS[self.units] if self.units is not None else "none"


class DeviceSettings(_Strict):
    max_objects_per_request: int = Field(default=0, ge=0, le=200, description=(
        "Objects in one ReadPropertyMultiple at most; 0: as many as the device's maximum APDU holds."))


class Profile(CoolingDevice):
    device: DeviceSettings = DeviceSettings()
    points: list[Point] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "Profile":
        names: set[str] = set()
        objects: dict[str, str] = {}
        for p in self.points:
            if p.name in names:
                raise ValueError(f"points.{p.name}: name appears twice")
            names.add(p.name)
            if p.object in objects:
                raise ValueError(f"points.{p.name}: object {p.object} is already point {objects[p.object]}")
            objects[p.object] = p.name
            check_metric(p.metric, p.labels, f"points.{p.name}.metric")
            if p.control is not None and p.metric != mm.VALVE_OPEN.name and p.channel is not None:
                raise ValueError(f"points.{p.name}.channel: only a valve's control point has a channel")
        return self

    def point(self, name: str) -> Point:
        for p in self.points:
            if p.name == name:
                return p
        raise ProfileError(f"BACnet profile {self.name}: no point named {name!r}")

    def feeds(self) -> list[tuple[str, dict[str, str]]]:
        """(family, labels) of every reading the profile publishes: what the detectors can read."""
        return [(p.metric, p.labels) for p in self.points]


def parse_profile(data: Any, source: str) -> Profile:
    return validate_document(Profile, data, source, "BACnet profile", ProfileError, point_names(data))


@lru_cache(maxsize=32)
def load_profile(name: str, directory: Path = PROFILE_DIR) -> Profile:
    """Load and validate `<directory>/<name>.yaml` (cached: profiles are read-only data)."""
    return load_named(name, directory, "BACnet profile", parse_profile)
