"""SNMP device profiles: which table columns to walk and how a raw integer becomes a metric.

All device knowledge (OIDs, index layout, scaling, enums, counter width)
lives in `exporters/profiles/snmp/*.yaml`; this module only defines the
format and refuses a bad profile at load with the path of the bad field.

Format (see the shipped profiles for complete examples)::

    profile: raritan-pdu2            # must equal the file stem
    vendor: Raritan
    sources: [...]                   # where every OID and scale was read
    info: {model: <oid>, firmware: <oid>}          # optional scalars (GET)
    tables:
      inlet:
        index: [pdu_id, inlet, sensor]             # names of the index parts
        columns:
          value: {oid: 1.3.6.1.4.1.13742.6.5.2.3.1.4}
          digits: {oid: 1.3.6.1.4.1.13742.6.3.3.4.1.7, slow: true}   # refreshed rarely
    metrics:
      - metric: supernode_pdu_inlet_power_watts
        table: inlet
        column: value
        where: {sensor: 5}           # keep rows whose index part equals this
        when: {type: [6]}            # keep rows whose column (same table) has one of these values
        labels: {inlet: "{inlet}"}   # templates over the index parts and id columns of the table
                                     # (APC rPDU2: {module}.{number}, columns of a row-index table)
        unit: W                      # the device's unit, for the reader
        scale: 1                     # value = raw * scale * row_scale + offset
        row_scale: {decimal_digits: digits}   # or {entity_scale: s, entity_precision: p}
        unsupported: [-1]            # raw values meaning "not supported"
        enum: {7: 1, 8: 0}           # raw -> value; other raw values are a sensor fault
        counter_bits: 32             # counters only: device counter width for wrap detection
        fallback: false              # true: only where the other maps of this metric give no ok reading
    outlet_control:                  # optional, switched PDUs
      table: outlet_switch           # column read back after a SET
      state_column: state
      command_oid: <column oid>      # SET <command_oid>.<index>
      index: "{pdu_id}.{outlet}"     # how the outlet id becomes the index suffix
      defaults: {pdu_id: 1}
      power_on: {command: 1, state: 7}    # (not 'on'/'off': YAML reads those as booleans)
      power_off: {command: 0, state: 8}
"""

from __future__ import annotations

import re
import string
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from exporters.errors import ProfileError
from exporters.model import Kind
from exporters.power.pdu_metrics import PROFILE_METRICS
from exporters.safe_yaml import InputError, load_yaml_file
from exporters.validation import validate_document

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles" / "snmp"
_OID = re.compile(r"^1(\.(0|[1-9][0-9]*))+$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def check_oid(v: str) -> str:
    v = str(v).strip().lstrip(".")
    if not _OID.match(v):
        raise ValueError(f"expected a numeric OID like 1.3.6.1..., got {v!r}")
    return v


def template_fields(template: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(template) if f}


class Column(_Strict):
    oid: str = Field(description="Numeric OID of the column (no index).")
    slow: bool = Field(default=False, description="Rarely changing (scale digits): re-read every scale_refresh seconds.")

    _oid = field_validator("oid")(classmethod(lambda cls, v: check_oid(v)))


class Table(_Strict):
    index: list[str] = Field(min_length=1, description="Names of the index components, in OID order.")
    columns: dict[str, Column] = Field(min_length=1)


class RowScale(_Strict):
    decimal_digits: str | None = Field(default=None, description="Column giving digits d: value × 10^-d (Raritan PDU2).")
    entity_scale: str | None = Field(default=None, description="entPhySensorScale column (SI prefix, 9 = units).")
    entity_precision: str | None = Field(default=None, description="entPhySensorPrecision column (decimal places).")

    @model_validator(mode="after")
    def _one_kind(self) -> "RowScale":
        entity = self.entity_scale is not None or self.entity_precision is not None
        if (self.decimal_digits is not None) == entity:
            raise ValueError("give either decimal_digits or entity_scale/entity_precision")
        return self

    def columns(self) -> list[str]:
        return [c for c in (self.decimal_digits, self.entity_scale, self.entity_precision) if c]


class MetricMap(_Strict):
    metric: str
    table: str
    column: str
    where: dict[str, int] = Field(default_factory=dict)
    when: dict[str, list[int]] = Field(default_factory=dict, description=(
        "Keep rows whose column (of the same table) has one of these values."))
    labels: dict[str, str] = Field(default_factory=dict)
    unit: str = Field(min_length=1, description="The device's unit (documentation: W, 0.1 A, Wh, hundredths of kW...).")
    scale: float = 1.0
    offset: float = 0.0
    row_scale: RowScale | None = None
    unsupported: list[int] = Field(default_factory=list)
    enum: dict[int, float] | None = None
    counter_bits: int | None = Field(default=None, ge=8, le=64)
    fallback: bool = Field(default=False, description=(
        "Used only where no other map of this metric gives an ok reading with the same labels (legacy APC rPDU "
        "scalars for units that answer -1 = not supported in rPDU2)."))

    def label_columns(self, index: list[str]) -> list[str]:
        """Names in the label templates that are table columns, not index parts (ids read per row)."""
        fields: set[str] = set()
        for tmpl in self.labels.values():
            fields |= template_fields(tmpl)
        return sorted(fields - set(index))

    @field_validator("metric")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in PROFILE_METRICS:
            raise ValueError(f"unknown metric {v!r}; known: {sorted(PROFILE_METRICS)}")
        return v


class Command(_Strict):
    command: int
    state: int


class OutletControl(_Strict):
    table: str
    state_column: str
    command_oid: str
    index: str = Field(description="Template building the index suffix from the outlet id ({outlet}), or from the "
                                   "index parts of the row that `match` finds.")
    match: str | None = Field(default=None, description=(
        "Row-index tables (APC rPDU2): template over columns of `table` whose value is the outlet id; the "
        "outlet's row is looked up by it before a read or SET."))
    defaults: dict[str, int] = Field(default_factory=dict)
    power_on: Command
    power_off: Command

    _oid = field_validator("command_oid")(classmethod(lambda cls, v: check_oid(v)))


class Profile(_Strict):
    profile: str
    vendor: str
    description: str = ""
    sources: list[str] = Field(min_length=1, description="Where the OIDs and scales were read.")
    info: dict[str, str] = Field(default_factory=dict, description="model/firmware -> scalar OID (GET).")
    tables: dict[str, Table] = Field(min_length=1)
    metrics: list[MetricMap] = Field(min_length=1)
    outlet_control: OutletControl | None = None

    @field_validator("info")
    @classmethod
    def _info_oids(cls, v: dict[str, str]) -> dict[str, str]:
        bad = set(v) - {"model", "firmware", "serial"}
        if bad:
            raise ValueError(f"unknown info keys {sorted(bad)} (model, firmware, serial)")
        return {k: check_oid(o) for k, o in v.items()}

    @model_validator(mode="after")
    def _references(self) -> "Profile":
        for i, m in enumerate(self.metrics):
            where = f"metrics[{i}] ({m.metric})"
            table = self.tables.get(m.table)
            if table is None:
                raise ValueError(f"{where}.table: no table {m.table!r}")
            for k in m.where:
                if k not in table.index:
                    raise ValueError(f"{where}.where: {k!r} is not an index part of {m.table!r} {table.index}")
            spec = PROFILE_METRICS[m.metric]
            wanted = set(spec.labels) - {"pdu"}
            if set(m.labels) != wanted:
                raise ValueError(f"{where}.labels: need exactly {sorted(wanted)}, got {sorted(m.labels)}")
            for k, tmpl in m.labels.items():
                unknown = template_fields(tmpl) - set(table.index) - set(table.columns)
                if unknown:
                    raise ValueError(f"{where}.labels.{k}: {sorted(unknown)} not index parts or columns of {m.table!r}")
            for c in self._needed(m):
                if c not in table.columns:
                    raise ValueError(f"{where}: table {m.table!r} has no column {c!r}")
            if spec.kind is Kind.COUNTER and m.counter_bits is None:
                raise ValueError(f"{where}.counter_bits: required for a counter (device counter width)")
            if spec.kind is not Kind.COUNTER and m.counter_bits is not None:
                raise ValueError(f"{where}.counter_bits: only counters wrap")
        oc = self.outlet_control
        if oc is not None:
            table = self.tables.get(oc.table)
            if table is None or oc.state_column not in table.columns:
                raise ValueError(f"outlet_control: no column {oc.state_column!r} in table {oc.table!r}")
            fields = template_fields(oc.index)
            if oc.match is not None:
                if fields - set(table.index) or not fields:
                    raise ValueError(f"outlet_control.index: with match, use only index parts of {oc.table!r}")
                if not template_fields(oc.match) or template_fields(oc.match) - set(table.columns):
                    raise ValueError(f"outlet_control.match: use only columns of {oc.table!r}")
            elif fields - set(table.index) or "outlet" not in fields:
                raise ValueError(f"outlet_control.index: must use {{outlet}} and index parts of {oc.table!r}")
        return self

    def _needed(self, m: MetricMap) -> list[str]:
        return [m.column, *(m.row_scale.columns() if m.row_scale else []), *m.when,
                *m.label_columns(self.tables[m.table].index)]

    def walked_columns(self, slow: bool | None = None) -> list[tuple[str, str, str]]:
        """(table, column, oid) of every column a metric needs; `slow` filters on the column's refresh class."""
        seen: dict[tuple[str, str], str] = {}
        for m in self.metrics:
            for c in self._needed(m):
                col = self.tables[m.table].columns[c]
                if slow is None or col.slow == slow:
                    seen[(m.table, c)] = col.oid
        return [(t, c, o) for (t, c), o in seen.items()]


def parse_profile(data: Any, source: str) -> Profile:
    return validate_document(Profile, data, source, "SNMP profile", ProfileError)


def load_profile(name_or_path: str | Path, directory: Path = PROFILE_DIR) -> Profile:
    """Load a profile by name (file stem under `directory`) or by path."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = directory / f"{name_or_path}.yaml"
    try:
        data = load_yaml_file(path, "SNMP profile")
    except InputError as exc:
        known = sorted(p.stem for p in directory.glob("*.yaml"))
        raise ProfileError(f"{exc}; known profiles: {known}") from None
    profile = parse_profile(data, str(path))
    if profile.profile != path.stem:
        raise ProfileError(f"{path}: profile: name {profile.profile!r} differs from the file name {path.stem!r}")
    return profile


def available_profiles(directory: Path = PROFILE_DIR) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml"))
