"""Turn walked SNMP columns into readings, as a profile says; pure functions plus counter state.

Kept apart from the transport so the decoding rules (per-row scale, enums,
"not supported" values, counter wraps and resets) are testable on plain
dicts and identical for every vendor.

Device values are untrusted: a value that is not a number in its type's
range, a scale or digit count outside what its MIB allows, or a result
that is not finite is a sensor fault of that one reading, never an
exception that fails the whole PDU (issue 18).
"""

from __future__ import annotations

import math
import time
from typing import Any

from exporters.model import Quality, Reading
from exporters.power.pdu_metrics import PROFILE_METRICS
from exporters.power.snmp_profile import MetricMap, Profile

Columns = dict[str, dict[tuple[int, ...], Any]]  # column oid -> {index: value}

# PDU2-MIB DecimalDigits is an Unsigned32; an Unsigned32 value has at most 10 digits, so more than 9
# decimal digits would turn every reading into a fraction of its least unit: no real sensor does that.
DECIMAL_DIGITS = range(0, 10)
ENTITY_SCALE = range(1, 18)  # ENTITY-SENSOR-MIB EntitySensorDataScale: yocto(1) .. yotta(17)
ENTITY_PRECISION = range(-8, 10)  # EntitySensorPrecision: Integer32 (-8..9)
# RFC 3433: a positive precision p is p decimal places (value x 10^-p); a negative one (-8..-1) only says how
# many digits are accurate, the value itself is not shifted.
RAW_LIMIT = 1 << 64  # the widest SMI number (Counter64); anything wider is not a device value


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


def row_factor(m: MetricMap, table_cols: dict[str, str], columns: Columns, index: tuple[int, ...]) -> float | None:
    """The per-row scale (Raritan decimal digits, ENTITY-SENSOR scale/precision); None when it cannot be read."""
    rs = m.row_scale
    if rs is None:
        return 1.0
    if rs.decimal_digits:
        d = columns.get(table_cols[rs.decimal_digits], {}).get(index)
        return 10.0 ** -d if isinstance(d, int) and d in DECIMAL_DIGITS else None
    s = columns.get(table_cols[rs.entity_scale], {}).get(index, 9) if rs.entity_scale else 9
    p = columns.get(table_cols[rs.entity_precision], {}).get(index, 0) if rs.entity_precision else 0
    if not isinstance(s, int) or not isinstance(p, int) or s not in ENTITY_SCALE or p not in ENTITY_PRECISION:
        return None
    return 10.0 ** (3 * (s - 9)) * 10.0 ** -max(p, 0)


def _label_parts(m: MetricMap, index_names: list[str], table_cols: dict[str, str], columns: Columns,
                 index: tuple[int, ...], parts: dict[str, int]) -> dict[str, Any] | None:
    """Index parts plus the id columns a label names (APC row tables: module and number are columns, not the index).

    None when a named id column has no plain integer for this row: a label must never be guessed.
    """
    out: dict[str, Any] = dict(parts)
    for name in m.label_columns(index_names):
        v = columns.get(table_cols[name], {}).get(index)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < RAW_LIMIT:
            return None
        out[name] = v
    return out


def decode(profile: Profile, columns: Columns, pdu: str, counters: CounterTracker,
           errors: dict[str, int] | None = None, now: float | None = None) -> list[Reading]:
    """All metric readings a profile defines, from walked columns. Rows the profile cannot decode count in `errors`."""
    now = time.time() if now is None else now
    errors = {} if errors is None else errors
    out: list[Reading] = []
    fallback: set[int] = set()  # positions in `out` of readings from fallback maps
    for m in profile.metrics:
        start = len(out)
        _decode_map(m, profile, columns, pdu, counters, errors, now, out)
        if m.fallback:
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


def _decode_map(m: MetricMap, profile: Profile, columns: Columns, pdu: str, counters: CounterTracker,
                errors: dict[str, int], now: float, out: list[Reading]) -> None:
    """Append the readings of one metric map to `out`."""
    spec = PROFILE_METRICS[m.metric]
    table = profile.tables[m.table]
    table_cols = {name: c.oid for name, c in table.columns.items()}
    for index, raw in columns.get(table_cols[m.column], {}).items():
        if len(index) != len(table.index):
            errors[f"{m.table}.{m.column}"] = errors.get(f"{m.table}.{m.column}", 0) + 1
            continue
        parts = dict(zip(table.index, index))
        if any(parts[k] != v for k, v in m.where.items()):
            continue
        if any(columns.get(table_cols[c], {}).get(index) not in vals for c, vals in m.when.items()):
            continue
        label_parts = _label_parts(m, table.index, table_cols, columns, index, parts)
        if label_parts is None:  # a row-index table whose id column (module, number) is missing or bad
            errors[f"{m.table}.labels"] = errors.get(f"{m.table}.labels", 0) + 1
            continue
        labels = {"pdu": pdu, **{k: t.format(**label_parts) for k, t in m.labels.items()}}
        if not isinstance(raw, int) or not -RAW_LIMIT < raw < RAW_LIMIT:  # a string, snmp_v2c.BadValue, ...
            errors[m.metric] = errors.get(m.metric, 0) + 1
            out.append(Reading(spec, math.nan, labels, Quality.SENSOR_FAULT, now))
            continue
        if raw in m.unsupported:
            out.append(Reading(spec, float(raw), labels, Quality.UNSUPPORTED, now))
            continue
        if m.enum is not None:
            if raw not in m.enum:
                out.append(Reading(spec, float(raw), labels, Quality.SENSOR_FAULT, now))
            else:
                out.append(Reading(spec, float(m.enum[raw]), labels, Quality.OK, now))
            continue
        factor = row_factor(m, table_cols, columns, index)
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
        out.append(Reading(spec, value, labels, Quality.OK, now))
