"""Redfish profiles: where resources are (chains of links from the service root) and how fields decode.

Device knowledge lives in `exporters/profiles/redfish/<name>.yaml`; this module
only knows the format. A profile is validated in full when loaded (every metric
name and label checked against exporters/redfish/metrics.py), so a vendor's
deviation is a data change that fails early, with the file and field named.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from exporters.redfish import metrics as rm
from exporters import profile_files
from exporters.profile_files import load_named
from exporters.units import known_unit, to_base
from exporters.validation import validate_document
from exporters.errors import ProfileError

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles" / "redfish"

Chain = list[str]  # property names followed from a resource, a collection expanded on the way
ResourceKind = Literal["leak_detector", "connector", "pump", "filter", "reservoir", "chassis", "sensor"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _chains(v: list[Chain]) -> list[Chain]:
    for chain in v:
        if not chain or any(not isinstance(p, str) or not p or "/" in p for p in chain):
            raise ValueError(f"chain {chain!r}: property names only (no paths, none empty)")
    return v


class Walk(_Strict):
    """Chains from the service root to the collections the agent needs."""

    chassis: list[Chain] = Field(min_length=1)
    equipment: dict[str, list[Chain]] = Field(default_factory=dict, description="Equipment kind -> chains.")
    systems: list[Chain] = Field(default_factory=list)
    sessions: list[Chain] = Field(default_factory=list)
    event_service: list[Chain] = Field(default_factory=list)

    @field_validator("chassis", "systems", "sessions", "event_service")
    @classmethod
    def _ok(cls, v: list[Chain]) -> list[Chain]:
        return _chains(v)

    @field_validator("equipment")
    @classmethod
    def _ok_equipment(cls, v: dict[str, list[Chain]]) -> dict[str, list[Chain]]:
        for chains in v.values():
            _chains(chains)
        return v


class ResourceRule(_Strict):
    kind: ResourceKind
    under: Literal["chassis", "equipment"]
    path: Chain = Field(description="Chain from the holder; empty (kind chassis only): the holder itself.")
    loop: str | None = Field(default=None, description="Coolant loop label of connectors found here.")
    reading_type: str | None = Field(default=None, description=(
        "Kind sensor: keep only the members whose Sensor.ReadingType is this (Temperature), so a BMC's power "
        "and fan sensors are neither read nor labelled as temperatures."))

    @field_validator("path")
    @classmethod
    def _ok(cls, v: Chain) -> Chain:
        return _chains([v])[0] if v else v

    @model_validator(mode="after")
    def _loop_for_connectors(self) -> "ResourceRule":
        if (self.kind == "connector") != (self.loop is not None):
            raise ValueError("loop: required for connector rules, and only for them")
        if not self.path and self.kind != "chassis":
            raise ValueError("path: empty only for kind chassis (the chassis' own Status)")
        if (self.kind == "sensor") != (self.reading_type is not None):
            raise ValueError("reading_type: required for sensor rules, and only for them")
        return self


class StatusRules(_Strict):
    health: dict[str, int] = Field(min_length=1, description="Status.Health value -> exported number.")
    unsupported_states: list[str] = Field(default_factory=list)
    fault_states: list[str] = Field(default_factory=list)


class DetectorRules(_Strict):
    state_field: str = "DetectorState"
    states: dict[str, int] = Field(min_length=1)
    wet_from: str

    @model_validator(mode="after")
    def _wet_known(self) -> "DetectorRules":
        if self.wet_from not in self.states:
            raise ValueError(f"wet_from: {self.wet_from!r} is not one of states ({', '.join(self.states)})")
        return self

    def wet(self, value: int) -> bool:
        return value >= self.states[self.wet_from]


class FieldRule(_Strict):
    metric: str
    unit: str = "none"
    # the member of an excerpt that holds the value: Reading for a sensor excerpt, SetPoint for a control's
    key: Literal["Reading", "SetPoint"] = "Reading"
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("unit")
    @classmethod
    def _unit(cls, v: str) -> str:
        return known_unit(v)

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        if v not in rm.ALL:
            raise ValueError(f"unknown metric {v!r}")
        return v

    def to_base(self, value: float) -> float:
        return to_base(value, self.unit)


class EventRules(_Strict):
    event_types: list[str] = Field(default_factory=lambda: ["Alert"])
    message_keys: list[str] = Field(default_factory=list)


class PowerRules(_Strict):
    action: str = "#ComputerSystem.Reset"
    off_type: str = "ForceOff"
    on_type: str = "On"


class Profile(_Strict):
    name: str = Field(min_length=1)
    vendor: str
    description: str = ""
    sources: list[str] = Field(min_length=1, description="Where the facts came from (schema, mockup, commit).")
    walk: Walk
    resources: list[ResourceRule] = Field(min_length=1)
    status: StatusRules
    leak_detector: DetectorRules
    fields: dict[ResourceKind, dict[str, FieldRule]] = Field(default_factory=dict)
    events: EventRules = EventRules()
    power: PowerRules = PowerRules()

    @model_validator(mode="after")
    def _labels_fit(self) -> "Profile":
        for kind, rules in self.fields.items():
            for fname, rule in rules.items():
                spec = rm.ALL[rule.metric]
                own = set(spec.labels) - rm.AUTO_LABELS
                if set(rule.labels) != own:
                    raise ValueError(f"fields.{kind}.{fname}: {rule.metric} needs labels {sorted(own)}, "
                                     f"got {sorted(rule.labels)}")
        return self

    def rules(self, under: str, kind: str | None = None) -> list[ResourceRule]:
        return [r for r in self.resources if r.under == under and (kind is None or r.kind == kind)]


def parse_profile(data: Any, source: str) -> Profile:
    return validate_document(Profile, data, source, "Redfish profile", ProfileError)


def list_profiles(directory: Path = PROFILE_DIR) -> list[str]:
    return profile_files.list_profiles(directory)


@lru_cache(maxsize=16)
def load_profile(name: str, directory: Path = PROFILE_DIR) -> Profile:
    """Load and validate `<directory>/<name>.yaml` (cached: profiles are read-only data)."""
    return load_named(name, directory, "Redfish profile", parse_profile)
