"""Modbus device profiles: the YAML format, its validation, and request planning.

Device knowledge (register maps, types, word order, scaling, sentinels)
lives in `exporters/profiles/modbus/<name>.yaml`; this module only knows the
format. A profile is validated in full when loaded, and a bad one is refused
with the file, the point and the field named, so adding a CDU model is a data
change that fails early. Units are the device's own (as in its manual); the
loader converts to the base units of METRICS.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from exporters.cooling import modbus_metrics
from exporters import profile_files
from exporters.errors import ProfileError
from exporters.profile_files import load_named, point_names
from exporters.units import from_base, known_unit, to_base
from exporters.validation import validate_document
from exporters.cooling.modbus_codec import WIDTH

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles" / "modbus"

Table = Literal["coil", "discrete", "input", "holding"]

# Function codes used to read each table.
READ_FC = {"coil": 1, "discrete": 2, "holding": 3, "input": 4}
MODICON_BASE = {"coil": 0, "discrete": 10000, "input": 30000, "holding": 40000}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Control(_Strict):
    """A writable control point (used by remediation), with the range a write may set."""
    min: float = Field(description="Lowest value a write may set, in the point's device unit.")
    max: float = Field(description="Highest value a write may set, in the point's device unit.")

    @model_validator(mode="after")
    def _ordered(self) -> "Control":
        if self.min > self.max:
            raise ValueError(f"min {self.min} > max {self.max}")
        return self


class Bit(_Strict):
    """One named bit of a status register: its own series (alarm, leak, fault)."""
    name: str = Field(min_length=1)
    metric: str
    labels: dict[str, str] = Field(default_factory=dict)


class Repeat(_Strict):
    """Expands one point into `count` points `stride` registers apart ({i} in name/labels)."""
    count: int = Field(ge=1, le=256)
    stride: int = Field(ge=1)
    first: int = Field(default=1, description="Index of the first copy; also the first channel.")


class Point(_Strict):
    name: str = Field(min_length=1)
    table: Table
    address: int = Field(ge=0, le=65535, description="0-based wire (PDU) address.")
    modicon: int | None = Field(default=None, description="Vendor's Modicon number, for humans; checked.")
    type: Literal["u16", "i16", "u32", "i32", "f32", "bit"] = "u16"
    order: Literal["ABCD", "CDAB", "BADC", "DCBA"] = "ABCD"
    scale: float = Field(default=1.0, description="Multiplier applied to the raw value.")
    offset: float = Field(default=0.0, description="Added after scale.")
    unit: str = Field(default="none", description="Device unit after scale and offset.")
    enum: dict[int, str] | None = Field(default=None, description="Known raw values; others are sensor faults.")
    bits: dict[int, Bit] | None = Field(default=None, description="Named bits of a status register.")
    invalid: list[float | str] = Field(default_factory=list, description="Raw sentinels meaning no reading (NaN ok).")
    range: tuple[float, float] | None = Field(default=None, description="Physical range in the device unit.")
    metric: str | None = None
    info: Literal["firmware"] | None = Field(
        default=None, description="A static fact exported as this label of the device's _info metric, not as a value.")
    labels: dict[str, str] = Field(default_factory=dict)
    channel: int | None = Field(default=None, description="Leak channel; mapped to a zone by the inventory.")
    control: Control | None = None
    repeat: Repeat | None = None
    note: str | None = None

    @field_validator("unit")
    @classmethod
    def _unit(cls, v: str) -> str:
        return known_unit(v)

    @field_validator("invalid")
    @classmethod
    def _invalid(cls, v: list) -> list:
        for s in v:
            if isinstance(s, str) and s.lower() != "nan":
                raise ValueError(f"sentinel {s!r}: use a number or 'NaN'")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "Point":
        is_bit_table = self.table in ("coil", "discrete")
        if is_bit_table != (self.type == "bit"):
            raise ValueError(f"type {self.type} does not fit table {self.table} (bit tables hold type bit only)")
        if self.modicon is not None:
            expected = MODICON_BASE[self.table] + self.address + 1
            if self.repeat is None and self.modicon != expected:
                raise ValueError(f"modicon {self.modicon} does not match {self.table} address {self.address} "
                                 f"(expected {expected})")
        if self.bits is not None and self.type not in ("u16", "i16"):
            raise ValueError("bits need a 16-bit register type (u16)")
        if self.bits is not None and any(not 0 <= b <= 15 for b in self.bits):
            raise ValueError("bit numbers must be 0..15")
        if self.metric is None and self.bits is None and self.control is None and self.info is None:
            raise ValueError("point feeds nothing: give a metric, bits, a control or an info label")
        if self.control is not None and self.table not in ("holding", "coil"):
            raise ValueError(f"control points must be holding registers or coils, not {self.table}")
        if self.range is not None and self.range[0] > self.range[1]:
            raise ValueError(f"range {self.range} is reversed")
        return self

    @property
    def width(self) -> int:
        return WIDTH[self.type]

    def is_sentinel(self, raw: float) -> bool:
        for s in self.invalid:
            if isinstance(s, str):
                if isinstance(raw, float) and math.isnan(raw):
                    return True
            elif raw == s or (self.type.startswith("i") and s >= 0 and raw == s - (1 << (16 * self.width))):
                return True
        return isinstance(raw, float) and (math.isnan(raw) or math.isinf(raw))

    def to_base(self, device_value: float) -> float:
        return to_base(device_value, self.unit)

    def from_base(self, base_value: float) -> float:
        return from_base(base_value, self.unit)


class DeviceSettings(_Strict):
    unit: int = Field(default=1, ge=0, le=255, description="Modbus unit (slave) id.")
    max_registers: int = Field(default=125, ge=1, le=125, description="Most registers in one read request.")
    max_bits: int = Field(default=2000, ge=1, le=2000, description="Most coils/inputs in one read request.")
    max_gap: int = Field(default=0, ge=0, le=64, description="Unused registers a request may span to join blocks.")
    gap_ms: float = Field(default=0.0, ge=0, le=5000, description="Idle time between requests (RTU gateways).")


class CoolingDevice(_Strict):
    """What every cooling profile says of its device, whatever the protocol (the Modbus and BACnet formats)."""

    name: str = Field(min_length=1)
    kind: Literal["cdu", "leak"]
    vendor: str
    model: str
    description: str = ""
    sources: list[str] = Field(min_length=1, description="Where the facts came from (manual, page, table, commit).")


class Profile(CoolingDevice):
    device: DeviceSettings = DeviceSettings()
    points: list[Point] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "Profile":
        seen: set[str] = set()
        for p in self.expanded():
            if p.name in seen:
                raise ValueError(f"points.{p.name}: name appears twice")
            seen.add(p.name)
            for metric, labels, where in _feeds(p):
                check_metric(metric, labels, f"points.{where}")
        return self

    def expanded(self) -> list[Point]:
        """Points with `repeat` unrolled (copies named and labelled with their index)."""
        out: list[Point] = []
        for p in self.points:
            if p.repeat is None:
                out.append(p)
                continue
            r = p.repeat
            for k in range(r.count):
                i = r.first + k
                data = p.model_dump(exclude={"repeat", "modicon"})
                data["name"] = p.name.replace("{i}", str(i)) if "{i}" in p.name else f"{p.name}_{i}"
                data["address"] = p.address + k * r.stride
                data["labels"] = {key: v.replace("{i}", str(i)) for key, v in p.labels.items()}
                data["channel"] = (p.channel if p.channel is not None else r.first) + k
                if p.bits:
                    data["bits"] = {b: {**bit.model_dump(),
                                        "labels": {kk: vv.replace("{i}", str(i)) for kk, vv in bit.labels.items()}}
                                    for b, bit in p.bits.items()}
                out.append(Point.model_validate(data))
        return out

    def point(self, name: str) -> Point:
        for p in self.expanded():
            if p.name == name:
                return p
        raise ProfileError(f"profile {self.name}: no point named {name!r}")

    def feeds(self) -> list[tuple[str, dict[str, str]]]:
        """(family, labels) of every reading the profile publishes, bits included: what the detectors can read."""
        return [(metric, labels) for p in self.expanded() for metric, labels, _ in _feeds(p)]


def _feeds(p: Point) -> list[tuple[str, dict[str, str], str]]:
    out = []
    if p.metric is not None:
        out.append((p.metric, p.labels, f"{p.name}.metric"))
    for n, bit in (p.bits or {}).items():
        out.append((bit.metric, {**p.labels, **bit.labels}, f"{p.name}.bits.{n}"))
    return out


def check_metric(metric: str, labels: dict[str, str], where: str) -> None:
    """A cooling family the collector knows, with exactly the labels a profile must give it (every cooling profile
    format, Modbus or BACnet, feeds the same families)."""
    spec = modbus_metrics.ALL.get(metric)
    if spec is None:
        raise ValueError(f"{where}: unknown metric {metric!r}")
    bad = set(labels) & modbus_metrics.AUTO_LABELS
    if bad:
        raise ValueError(f"{where}: labels {sorted(bad)} are filled by the collector, do not set them")
    expected = set(spec.labels) - modbus_metrics.AUTO_LABELS
    if set(labels) != expected:
        raise ValueError(f"{where}: {metric} needs labels {sorted(expected)}, got {sorted(labels)}")


def parse_profile(data: Any, source: str) -> Profile:
    return validate_document(Profile, data, source, "Modbus profile", ProfileError, point_names(data))


@lru_cache(maxsize=64)
def load_profile(name: str, directory: Path = PROFILE_DIR) -> Profile:
    """Load and validate `<directory>/<name>.yaml` (cached: profiles are read-only data)."""
    return load_named(name, directory, "Modbus profile", parse_profile)


def list_profiles(directory: Path = PROFILE_DIR) -> list[str]:
    return profile_files.list_profiles(directory)


@dataclass(frozen=True)
class Block:
    """One read request: a table, a start address, a count and the points it covers."""
    table: str
    start: int
    count: int
    points: tuple[Point, ...]

    @property
    def fc(self) -> int:
        return READ_FC[self.table]


def plan_blocks(profile: Profile, points: list[Point] | None = None) -> list[Block]:
    """Coalesce points into as few requests as the device's block size and gap rules allow.

    Points are grouped per table and sorted by address; a point joins the
    current block when it starts at most `max_gap` units after the block's
    end and the block stays within `max_registers` (or `max_bits`).
    """
    dev = profile.device
    pts = points if points is not None else profile.expanded()
    blocks: list[Block] = []
    for table in ("coil", "discrete", "holding", "input"):
        limit = dev.max_bits if table in ("coil", "discrete") else dev.max_registers
        cur: list[Point] = []
        start = end = 0
        for p in sorted((p for p in pts if p.table == table), key=lambda p: p.address):
            p_end = p.address + p.width
            if cur and p.address <= end + dev.max_gap and max(end, p_end) - start <= limit:
                cur.append(p)
                end = max(end, p_end)
                continue
            if cur:
                blocks.append(Block(table, start, end - start, tuple(cur)))
            cur, start, end = [p], p.address, p_end
        if cur:
            blocks.append(Block(table, start, end - start, tuple(cur)))
    return blocks
