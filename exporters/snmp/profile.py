"""SNMP device profiles (PDUs and CDUs): which objects to read and how a raw integer becomes a metric.

All device knowledge (OIDs, index layout, scaling, enums, counter width,
the MIB's ranges and fault values) lives in `exporters/profiles/snmp/*.yaml`;
this module only defines the format and refuses a bad profile at load with
the path of the bad field. One format for both kinds of device: a PDU
profile maps onto the PDU families (exporters/power/pdu_metrics.py), a CDU
profile onto the CDU and leak families the Modbus CDU fills
(exporters/cooling/modbus_metrics.py), so the coolant and leak detectors
read an SNMP CDU exactly as they read a Modbus one.

Format (see the shipped profiles for complete examples)::

    profile: raritan-pdu2            # must equal the file stem
    kind: pdu                        # pdu (default) or cdu: which families the metrics map onto
    vendor: Raritan
    model: ""                        # cdu: the model the _info series names
    sources: [...]                   # where every OID and scale was read
    info: {model: <oid>, firmware: <oid>}          # optional scalars (GET)
    tables:
      unit:
        scalar: true                               # scalar objects: GET <oid>.0 (no walk); noSuchObject or
        columns:                                   # noSuchInstance is an `unsupported` reading, never a gap
          flow: {oid: 1.3.6.1.4.1.318.1.1.13.3.2.2.2.22}
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
        invalid: [-32768]            # raw values the MIB gives a failed sensor: sensor_fault
        range: [0, 3000]             # the raw value's valid span (the MIB's SYNTAX range): outside, sensor_fault
        channel: "1"                 # cdu, zone families only: the leak channel (template), mapped to a zone by
                                     # the inventory's `channels`; a channel the map leaves out is not wired
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from exporters.errors import ProfileError
from exporters.model import Kind, MetricSpec
from exporters.safe_yaml import InputError, load_yaml_file
from exporters.validation import validate_document

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles" / "snmp"
DeviceKind = Literal["pdu", "cdu"]


@dataclass(frozen=True)
class Families:
    """What a kind of device maps onto: the families its profile may name, the label naming the device, and the
    labels the collector fills itself (a profile must not set them)."""

    specs: dict[str, MetricSpec]
    device_label: str
    auto: frozenset[str]


def families(kind: DeviceKind) -> Families:
    """The families of a device kind. The domain packages own them (power: the PDU catalogue; cooling: the CDU and
    leak families every CDU protocol fills); they are imported here, by name, because the profile format must refuse
    a map onto a family its kind does not have. Neither domain module imports this one at load (no cycle)."""
    if kind == "pdu":
        from exporters.power.pdu_metrics import PROFILE_METRICS

        return Families(PROFILE_METRICS, "pdu", frozenset({"pdu"}))
    from exporters.cooling import modbus_metrics as mm

    own = {mm.CDU_INFO.name, mm.EXCEPTIONS.name, mm.REQUESTS.name} | {s.name for s in mm.DERIVED}
    return Families({n: s for n, s in mm.ALL.items() if n not in own}, "cdu", frozenset(mm.AUTO_LABELS))
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
    index: list[str] = Field(default_factory=list, description="Names of the index components, in OID order.")
    columns: dict[str, Column] = Field(min_length=1)
    scalar: bool = Field(default=False, description=(
        "Scalar objects (<oid>.0), read by GET, not walked: an object the device does not have (noSuchObject, "
        "noSuchInstance) gives an `unsupported` reading."))

    @model_validator(mode="after")
    def _index(self) -> "Table":
        if self.scalar and self.index:
            raise ValueError("index: a scalar table has no index (its objects are <oid>.0)")
        if not self.scalar and not self.index:
            raise ValueError("index: name the index components (or `scalar: true` for scalar objects)")
        return self


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
    invalid: list[int] = Field(default_factory=list, description=(
        "Raw values the MIB gives for a failed or missing sensor: the reading is `sensor_fault`, never a value."))
    range: tuple[float, float] | None = Field(default=None, description=(
        "The raw value's valid span (the MIB's SYNTAX range, or the sensor's span in the vendor's manual): a raw "
        "value outside it is `sensor_fault`."))
    channel: str | None = Field(default=None, description=(
        "CDU leak and valve families (label zone): the device's channel, a template over the index parts and "
        "columns of the table; the inventory's `channels` maps it to a leak zone."))
    enum: dict[int, float] | None = None
    counter_bits: int | None = Field(default=None, ge=8, le=64)
    fallback: bool = Field(default=False, description=(
        "Used only where no other map of this metric gives an ok reading with the same labels (legacy APC rPDU "
        "scalars for units that answer -1 = not supported in rPDU2)."))

    def templates(self) -> dict[str, str]:
        """The label templates and, under the key `channel`, the channel template (a CDU leak input's)."""
        return {**self.labels, **({"channel": self.channel} if self.channel is not None else {})}

    def label_columns(self, index: list[str]) -> list[str]:
        """Names in the label (and channel) templates that are table columns, not index parts (ids read per row)."""
        fields: set[str] = set()
        for tmpl in self.templates().values():
            fields |= template_fields(tmpl)
        return sorted(fields - set(index))

    @model_validator(mode="after")
    def _ranged(self) -> "MetricMap":
        if self.range is not None and self.range[0] > self.range[1]:
            raise ValueError(f"range: low {self.range[0]} is above high {self.range[1]}")
        return self


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
    kind: DeviceKind = Field(default="pdu", description=(
        "pdu: a rack PDU (families of exporters/power/pdu_metrics.py); cdu: a coolant distribution unit (the CDU "
        "and leak families of exporters/cooling/modbus_metrics.py, the same the Modbus CDU fills)."))
    vendor: str
    model: str = Field(default="", description="The model family, for the CDU's _info series.")
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

    @property
    def families(self) -> Families:
        return families(self.kind)

    @model_validator(mode="after")
    def _references(self) -> "Profile":
        fam = self.families
        for i, m in enumerate(self.metrics):
            where = f"metrics[{i}] ({m.metric})"
            if m.metric not in fam.specs:
                raise ValueError(f"{where}.metric: unknown metric {m.metric!r} for kind {self.kind}; known: "
                                 f"{sorted(fam.specs)}")
            table = self.tables.get(m.table)
            if table is None:
                raise ValueError(f"{where}.table: no table {m.table!r}")
            for k in m.where:
                if k not in table.index:
                    raise ValueError(f"{where}.where: {k!r} is not an index part of {m.table!r} {table.index}")
            spec = fam.specs[m.metric]
            wanted = set(spec.labels) - fam.auto
            if set(m.labels) != wanted:
                raise ValueError(f"{where}.labels: need exactly {sorted(wanted)}, got {sorted(m.labels)}")
            if ("zone" in spec.labels) != (m.channel is not None):
                raise ValueError(f"{where}.channel: {'required' if 'zone' in spec.labels else 'only'} for a family "
                                 f"labelled by zone (the inventory maps the channel to its leak zone)")
            for k, tmpl in m.templates().items():
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
        if oc is not None and self.kind != "pdu":
            raise ValueError("outlet_control: only a PDU switches outlets")
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

    def walked_columns(self, slow: bool | None = None, maps: list[MetricMap] | None = None,
                       scalar: bool = False) -> list[tuple[str, str, str]]:
        """(table, column, oid) of every column the metrics (`maps`, default all) need; `slow` filters on the
        column's refresh class, `scalar` picks the scalar tables' objects (GET) instead of the walked columns."""
        seen: dict[tuple[str, str], str] = {}
        for m in self.metrics if maps is None else maps:
            if self.tables[m.table].scalar != scalar:
                continue
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


def available_profiles(directory: Path = PROFILE_DIR, kind: DeviceKind | None = None) -> list[str]:
    """The shipped profiles (of one kind: read from each file's `kind`, default pdu)."""
    names = sorted(p.stem for p in directory.glob("*.yaml"))
    if kind is None:
        return names
    return [n for n in names if profile_kind(directory / f"{n}.yaml") == kind]


_KINDS: dict[tuple[Path, int], str] = {}  # (file, its mtime) -> kind: listing by kind must not parse every file again


def profile_kind(path: Path) -> str:
    """A profile file's `kind` without validating the whole file (listing); `load_profile` checks everything.
    Read once per version of the file: `auto` lists the PDU profiles at each device's first poll, and parsing
    every profile there blocked the agent's loop for seconds on a loaded host."""
    try:
        key = (path, path.stat().st_mtime_ns)
    except OSError:
        return "?"
    kind = _KINDS.get(key)
    if kind is None:
        try:
            data = load_yaml_file(path, "SNMP profile")
        except InputError:
            return "?"
        kind = _KINDS[key] = str(data.get("kind", "pdu")) if isinstance(data, dict) else "?"
    return kind
