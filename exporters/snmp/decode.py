"""Turn walked SNMP columns into readings, as a profile says; pure functions plus counter state.

Kept apart from the transport so the decoding rules (per-row scale, enums,
"not supported" values, the MIB's fault values and ranges, counter wraps and
resets) are testable on plain dicts and identical for every vendor and for
PDUs and CDUs alike.

Device values are untrusted: a value that is not a number in its type's
range, a scale or digit count outside what its MIB allows, or a result
that is not finite is a sensor fault of that one reading, never an
exception that fails the whole PDU (issue 18).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable


from exporters.model import Quality, Reading, make_reading
from exporters.snmp.profile import MetricMap, Profile

Columns = dict[str, dict[tuple[int, ...], Any]]  # column oid -> {index: value}; a scalar's index is ()
ZoneOf = Callable[[str], "str | None"]  # a CDU's channel -> its leak zone (None: nothing wired there)
Trace = set[tuple[str, tuple[int, ...]]]  # (column oid, index) of every value a reading came from

# PDU2-MIB DecimalDigits is an Unsigned32; an Unsigned32 value has at most 10 digits, so more than 9
# decimal digits would turn every reading into a fraction of its least unit: no real sensor does that.
DECIMAL_DIGITS = range(0, 10)
ENTITY_SCALE = range(1, 18)  # ENTITY-SENSOR-MIB EntitySensorDataScale: yocto(1) .. yotta(17)
ENTITY_PRECISION = range(-8, 10)  # EntitySensorPrecision: Integer32 (-8..9)
# RFC 3433: a positive precision p is p decimal places (value x 10^-p); a negative one (-8..-1) only says how
# many digits are accurate, the value itself is not shifted.
RAW_LIMIT = 1 << 64  # the widest SMI number (Counter64); anything wider is not a device value
_OK = Quality.OK


class CounterTracker:
    """Makes device energy counters monotonic: absorbs 2^bits wraps and resets (APC counters are user-resettable).

    The exported total starts at the device's own value and then only adds
    deltas: a drop that looks like a wrap (the old raw value was near the
    top) adds the wrapped distance; any other drop is a reset and adds the
    new raw value (energy since the reset), never a negative step.
    """

    def __init__(self) -> None:
        self._state: dict[tuple, tuple[int, float]] = {}  # key -> (last raw, total in base units)
        self.wraps = 0
        self.resets = 0

    def update(self, key: tuple, raw: int, bits: int, factor: float) -> float:
        prev = self._state.get(key)
        if prev is None:
            total = raw * factor
        else:
            last, total = prev
            delta = raw - last
            if delta < 0:
                wrapped = raw + (1 << bits) - last
                if wrapped <= (1 << bits) // 8:
                    delta = wrapped
                    self.wraps += 1
                else:
                    delta = raw
                    self.resets += 1
            total += delta * factor
        self._state[key] = (raw, total)
        return total


class _MapPlan:
    """One metric map with everything a row needs looked up once: the oids of its columns, where/when
    as index positions and value sets, its row-scale kind. Compiled per profile (see `_plans`), because
    a PDU poll decodes ~300 rows and resolving names per row was most of its cost."""

    __slots__ = ("m", "spec", "index_names", "n_index", "value_oid", "where", "when", "label_names", "label_oids",
                 "templates", "unsupported", "invalid", "low", "high", "scale_kind", "scale_oids", "index_error",
                 "label_error", "labels", "device_label", "channel")

    def __init__(self, m: MetricMap, profile: Profile):
        table = profile.tables[m.table]
        cols = {name: c.oid for name, c in table.columns.items()}
        fam = profile.families
        self.m = m
        self.spec = fam.specs[m.metric]
        self.device_label = fam.device_label if fam.device_label in self.spec.labels else None
        self.index_names = tuple(table.index)
        self.n_index = len(table.index)
        self.value_oid = cols[m.column]
        position = {name: i for i, name in enumerate(table.index)}
        self.where = tuple((position[k], v) for k, v in m.where.items())
        self.when = tuple((cols[c], vals) for c, vals in m.when.items())
        self.label_names = tuple(m.label_columns(list(table.index)))
        self.label_oids = tuple(cols[n] for n in self.label_names)
        self.templates = tuple(m.labels.items())
        self.channel = m.channel
        self.unsupported = frozenset(m.unsupported)
        self.invalid = frozenset(m.invalid)
        self.low, self.high = m.range if m.range is not None else (-math.inf, math.inf)
        rs = m.row_scale
        if rs is None:
            self.scale_kind, self.scale_oids = None, ()
        elif rs.decimal_digits:
            self.scale_kind, self.scale_oids = "digits", (cols[rs.decimal_digits],)
        else:
            self.scale_kind = "entity"
            self.scale_oids = (cols[rs.entity_scale] if rs.entity_scale else None,
                               cols[rs.entity_precision] if rs.entity_precision else None)
        self.index_error = f"{m.table}.{m.column}"
        self.label_error = f"{m.table}.labels"
        # (device, index, id column values, wiring) -> the row's labels (None: a channel nothing is wired to): the
        # same every poll, built once (bounded)
        self.labels: dict[tuple, dict[str, str] | None] = {}

    def row_labels(self, device: str, index: tuple[int, ...], ids: tuple[int, ...],
                   zone_of: ZoneOf | None) -> dict[str, str] | None:
        key = (device, index, ids, zone_of)  # the wiring too: two sources of one profile may map channels apart
        if key in self.labels:
            return self.labels[key]
        parts: dict[str, Any] = dict(zip(self.index_names, index))
        parts.update(zip(self.label_names, ids))
        labels: dict[str, str] | None = {k: t.format(**parts) for k, t in self.templates}
        if self.device_label is not None:
            labels = {self.device_label: device, **labels}
        if self.channel is not None:
            channel = self.channel.format(**parts)
            zone = zone_of(channel) if zone_of is not None else f"{device}-ch{channel}"
            labels = None if zone is None else {**labels, "zone": zone}
        if len(self.labels) >= _LABEL_CACHE_ROWS:
            self.labels.clear()
        self.labels[key] = labels
        return labels

    def row_factor(self, columns: Columns, index: tuple[int, ...]) -> float | None:
        """The per-row scale (Raritan decimal digits, ENTITY-SENSOR scale/precision); None when it cannot be read."""
        kind = self.scale_kind
        if kind is None:
            return 1.0
        if kind == "digits":
            d = columns.get(self.scale_oids[0], {}).get(index)
            return 10.0 ** -d if isinstance(d, int) and d in DECIMAL_DIGITS else None
        s_oid, p_oid = self.scale_oids
        s = columns.get(s_oid, {}).get(index, 9) if s_oid else 9
        p = columns.get(p_oid, {}).get(index, 0) if p_oid else 0
        if not isinstance(s, int) or not isinstance(p, int) or s not in ENTITY_SCALE or p not in ENTITY_PRECISION:
            return None
        return 10.0 ** (3 * (s - 9)) * 10.0 ** -max(p, 0)


_LABEL_CACHE_ROWS = 4096  # rows per map whose labels are kept (a PDU has tens; bounded against odd devices)
_PLANS: dict[int, tuple[Profile, list[_MapPlan]]] = {}  # id(profile) -> (profile, its plans)


def _plans(profile: Profile) -> list[_MapPlan]:
    """The compiled maps of a profile (profiles are immutable; kept by identity, a bounded few)."""
    hit = _PLANS.get(id(profile))
    if hit is not None and hit[0] is profile:
        return hit[1]
    plans = [_MapPlan(m, profile) for m in profile.metrics]
    if len(_PLANS) >= 64:
        _PLANS.clear()
    _PLANS[id(profile)] = (profile, plans)
    return plans


def decode(profile: Profile, columns: Columns, device: str, counters: CounterTracker,
           errors: dict[str, int] | None = None, now: float | None = None, maps: frozenset[int] | None = None,
           zone_of: ZoneOf | None = None, trace: Trace | None = None) -> list[Reading]:
    """All metric readings a profile defines (or the maps at positions `maps` of `profile.metrics`), from read
    columns. `device` fills the kind's device label (pdu, cdu); `zone_of` maps a CDU channel to its leak zone (a
    channel it maps to None is not wired: no reading). Rows the profile cannot decode count in `errors`; `trace`
    collects the (column, index) of every value a reading came from (what a recording's count of decoded values
    reads)."""
    now = time.time() if now is None else now
    errors = {} if errors is None else errors
    out: list[Reading] = []
    fallback: set[int] = set()  # positions in `out` of readings from fallback maps
    split: dict[tuple[str, int, int], tuple[dict[int, list[tuple[tuple[int, ...], Any]]], int]] = {}
    for i, plan in enumerate(_plans(profile)):
        if maps is not None and i not in maps:
            continue
        start = len(out)
        _decode_map(plan, columns, device, counters, errors, now, out, split, zone_of, trace)
        if plan.m.fallback:
            fallback.update(range(start, len(out)))
    return _prefer_primary(out, fallback)


def _prefer_primary(out: list[Reading], fallback: set[int]) -> list[Reading]:
    """One reading per series: a fallback map's reading only where the primary maps gave no ok one."""
    if not fallback:
        return out

    def key(r: Reading) -> tuple:
        return r.name, tuple(sorted(r.labels.items()))
    primary_ok = {key(r) for i, r in enumerate(out) if i not in fallback and r.ok}
    primary_any = {key(r) for i, r in enumerate(out) if i not in fallback}
    fallback_ok = {key(r) for i, r in enumerate(out) if i in fallback and r.ok}
    return [r for i, r in enumerate(out)
            if (i in fallback and key(r) not in primary_ok and (r.ok or key(r) not in primary_any))
            or (i not in fallback and (r.ok or key(r) not in fallback_ok))]


def _split(column: dict[tuple[int, ...], Any], n_index: int,
           pos: int) -> tuple[dict[int, list[tuple[tuple[int, ...], Any]]], int]:
    """A column's rows of the right index length by the value of index part `pos`, and how many had another length."""
    buckets: dict[int, list[tuple[tuple[int, ...], Any]]] = {}
    bad = 0
    for index, raw in column.items():
        if len(index) != n_index:
            bad += 1
            continue
        rows = buckets.get(index[pos])
        if rows is None:
            buckets[index[pos]] = [(index, raw)]
        else:
            rows.append((index, raw))
    return buckets, bad


def _decode_map(plan: _MapPlan, columns: Columns, device: str, counters: CounterTracker,
                errors: dict[str, int], now: float, out: list[Reading],
                split: dict[tuple[str, int, int], tuple[dict[int, list[tuple[tuple[int, ...], Any]]], int]],
                zone_of: ZoneOf | None, trace: Trace | None) -> None:
    """Append the readings of one metric map to `out`.

    Most maps keep one sensor type of a shared column (`where` on one index part): the column is split
    by that part once per poll (`split`, shared by the maps), so each map walks its own rows only."""
    m, spec = plan.m, plan.spec
    where, when, label_oids = plan.where, plan.when, plan.label_oids
    if len(where) == 1:
        pos, want = where[0]
        key = (plan.value_oid, plan.n_index, pos)
        if key not in split:
            split[key] = _split(columns.get(plan.value_oid, {}), plan.n_index, pos)
        buckets, bad = split[key]
        if bad:  # rows of another index length count against every map of the column, as they always did
            errors[plan.index_error] = errors.get(plan.index_error, 0) + bad
        rows: Any = buckets.get(want, ())
        where = ()
    else:
        rows = columns.get(plan.value_oid, {}).items()
    for index, raw in rows:
        if len(index) != plan.n_index:
            errors[plan.index_error] = errors.get(plan.index_error, 0) + 1
            continue
        if where and any(index[pos] != v for pos, v in where):
            continue
        if when and any(columns.get(oid, {}).get(index) not in vals for oid, vals in when):
            continue
        ids: tuple[int, ...] = ()
        if label_oids:  # id columns a label names (APC row tables: module and number are columns, not the index)
            ids = tuple(columns.get(oid, {}).get(index) for oid in label_oids)
            if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < RAW_LIMIT for v in ids):
                # a label must never be guessed: a named id column without a plain integer drops the row
                errors[plan.label_error] = errors.get(plan.label_error, 0) + 1
                continue
        labels = plan.row_labels(device, index, ids, zone_of)
        if labels is None:  # a CDU channel the inventory wires to no zone
            continue
        if trace is not None:
            trace.add((plan.value_oid, index))
        if raw is None:  # a scalar the device does not have (noSuchObject / noSuchInstance)
            out.append(Reading(spec, math.nan, labels, Quality.UNSUPPORTED, now))
            continue
        if not isinstance(raw, int) or not -RAW_LIMIT < raw < RAW_LIMIT:  # a string, v2c.BadValue, ...
            errors[m.metric] = errors.get(m.metric, 0) + 1
            out.append(Reading(spec, math.nan, labels, Quality.SENSOR_FAULT, now))
            continue
        if raw in plan.unsupported:
            out.append(Reading(spec, float(raw), labels, Quality.UNSUPPORTED, now))
            continue
        if raw in plan.invalid or not plan.low <= raw <= plan.high:  # the MIB's fault value, or out of its span
            out.append(Reading(spec, float(raw), labels, Quality.SENSOR_FAULT, now))
            continue
        if m.enum is not None:
            if raw not in m.enum:
                out.append(Reading(spec, float(raw), labels, Quality.SENSOR_FAULT, now))
            else:
                out.append(Reading(spec, float(m.enum[raw]), labels, Quality.OK, now))
            continue
        factor = plan.row_factor(columns, index)
        if factor is None:
            out.append(Reading(spec, float(raw), labels, Quality.SENSOR_FAULT, now))
            continue
        factor *= m.scale
        if m.counter_bits is not None and not 0 <= raw < (1 << m.counter_bits):
            out.append(Reading(spec, float(raw), labels, Quality.SENSOR_FAULT, now))  # not a counter that wide
            continue
        if m.counter_bits is not None:
            key = (m.metric, tuple(sorted(labels.items())))
            value = counters.update(key, raw, m.counter_bits, factor) + m.offset
        else:
            value = raw * factor + m.offset
        if not math.isfinite(value):
            out.append(Reading(spec, 0.0, labels, Quality.SENSOR_FAULT, now))
            continue
        out.append(make_reading(spec, value, labels, _OK, now))  # the common case: ~300 a poll
