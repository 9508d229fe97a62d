"""Shared facts: one poll of a shared device as a compact JSON document, and back into readings.

Why the whole poll and not a summary: an agent that does not poll the leak
controller must run the same detectors on the same numbers as one that does
(a leak in its zone, the leak watch's "unknown", the coolant summary, the
PDU's phase load and the rack power derived from it). So a poller publishes
what its poll put in its own store (readings, with their quality and the
device's own timestamps, or the failure), and every other agent puts it in
its store under the same (source, device): detectors, derived sources and
the API cannot tell the difference.

Why checked: a fact lands in the receiver's store as if polled there, so it can
start (or hide) a leak response. The receiver trusts its own knowledge, not the
payload: the job (source, device) comes from where the fact was filed (its etcd
key, its stream's peer), the metric specs are the receiver's own from the
families its source of that device declares (`declared_families`,
`pinned_labels`), and every name, label, value and time is checked here
(`decode`) before anything is stored. Specs still travel in the document for
older agents; this one does not read them. Who may file a fact at all is the
transport's business (agent.coordination.etcd_rack: the holder of a poller
slot; agent.coordination.static: a configured poller's own stream).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from agent.coordination.records import RecordError, as_object, parse_json, wall_time
from exporters.model import MetricSpec, Quality, Reading, make_reading
from exporters.validation import short_repr, terminal_safe

VERSION = 1
_QUALITY = {q.value: q for q in Quality}
# The leak family's name (exporters.cooling.modbus_metrics.LEAK_DETECTED, which the Redfish trays fill too), by
# name: importing the spec here would make the metric catalogue name this module as its source.
LEAK_DETECTED = "supernode_leak_detected"

MAX_LABEL_CHARS = 256  # a label value longer than this is no device's name for anything
MAX_ERROR_CHARS = 500  # what encode keeps of a failed poll's error
MAX_DURATION = 3600.0  # seconds; a poll is bounded by its timeout, far below this
MAX_PARTIAL = 64  # kinds of partial errors in one poll
MAX_SERIES = 4096  # series of one device remembered as checked (a device's every poll names the same ones)


@dataclass(slots=True)
class Fact:
    """One poll of one (source, device) by one poller."""

    node: str
    source: str
    device: str
    up: bool
    readings: list[Reading] = field(default_factory=list)
    duration: float = 0.0
    error_kind: str = ""
    error: str = ""
    partial_errors: dict[str, int] = field(default_factory=dict)
    at: float = 0.0  # the poller's wall clock when it published


def is_wet(fact: Fact) -> bool:
    """Does this poll read a leak? (What a safety input's standby publishes although it is not the first poller.)"""
    return fact.up and any(r.spec.name == LEAK_DETECTED and r.ok and r.value >= 0.5 for r in fact.readings)


def encode(fact: Fact) -> bytes:
    specs: dict[str, list[Any]] = {}
    rows = []
    for r in fact.readings:
        s = r.spec
        if s.name not in specs:
            specs[s.name] = [s.kind.value, s.help, list(s.labels), s.unit]
        rows.append([s.name, r.value, dict(r.labels), r.quality.value, r.timestamp])
    doc = {"v": VERSION, "node": fact.node, "source": fact.source, "device": fact.device, "up": fact.up,
           "duration": fact.duration, "at": fact.at, "specs": specs, "r": rows}
    if not fact.up:
        doc["error_kind"], doc["error"] = fact.error_kind, fact.error[:MAX_ERROR_CHARS]
    if fact.partial_errors:
        doc["partial"] = fact.partial_errors
    return json.dumps(doc, separators=(",", ":"), allow_nan=True).encode()


@dataclass(frozen=True, slots=True)
class FactSchema:
    """What facts of one shared job may hold, from this agent's own source of that device.

    Precomputed once per source (facts arrive several times a second): the families by name, each family's
    label names, and the only values of the labels the source alone decides (its device name, its zones...)."""

    source: str
    device: str
    families: Mapping[str, MetricSpec]
    labels: Mapping[str, frozenset[str]]
    pinned: Mapping[str, frozenset[str]]
    checked: dict[tuple[str, tuple[tuple[str, Any], ...]], Mapping[str, str]] = field(
        default_factory=dict, compare=False)  # series already checked -> their labels (one object per series)

    @classmethod
    def of(cls, job: str, source: Any) -> "FactSchema":
        """From a source with `declared_families()` (and optionally `pinned_labels()`); RecordError without."""
        declared = getattr(source, "declared_families", None)
        if declared is None:
            raise RecordError("unknown_job", f"{job}: this agent's source declares no families to share")
        families = dict(declared())
        pinned = getattr(source, "pinned_labels", None)
        name, _, device = job.partition("/")
        return cls(name, device, families, {n: frozenset(s.labels) for n, s in families.items()},
                   dict(pinned()) if pinned is not None else {})


def parse(raw: bytes | str) -> dict[str, Any]:
    """The JSON object of a fact, or RecordError (too large, not JSON, not an object)."""
    return as_object(parse_json(raw), "fact")


def decode(doc: dict[str, Any], schema: FactSchema, poller: str, now: float, skew: float) -> Fact:
    """The fact `poller` filed for `schema`'s job, built from this agent's own specs; RecordError (its `why`
    a short label) when anything in it is not what that device's source can publish:

    - `version`; `mismatch`: its node, source or device is not where it was filed;
    - `unknown_family`, `labels` (not exactly the family's label names), `label_value` (not a printable
      string of at most MAX_LABEL_CHARS, or not one the source decides), `quality`;
    - `type`, `range` (an ok value that is not finite, a negative or absurd duration), `future` (the fact's
      `at` or a reading's time later than now + skew: such a poll would outrank every real one)."""
    if doc.get("v") != VERSION:
        raise RecordError("version", f"fact version {_short(doc.get('v'))}, this agent reads {VERSION}")
    node, source, device = doc.get("node"), doc.get("source"), doc.get("device")
    if node != poller or source != schema.source or device != schema.device:
        raise RecordError("mismatch", f"says {_short(source)}/{_short(device)} by {_short(node)}, filed as "
                                      f"{schema.source}/{schema.device} by {poller[:60]}")
    up = doc.get("up")
    if not isinstance(up, bool):
        raise RecordError("type", "up: expected true or false")
    at = wall_time(doc.get("at"), "at", now, skew)
    duration = _number(doc.get("duration", 0.0), "duration")
    if not 0.0 <= duration <= MAX_DURATION:
        raise RecordError("range", f"duration: {duration!r} s is no poll's")
    rows = doc.get("r", [])
    if not isinstance(rows, list):
        raise RecordError("type", "r: expected a list of readings")
    readings = _readings(rows, schema, now, skew)
    error_kind, error = doc.get("error_kind", ""), doc.get("error", "")
    if not isinstance(error_kind, str) or len(error_kind) > 32 or not isinstance(error, str):
        raise RecordError("type", "error_kind, error: expected short strings")
    return Fact(poller, schema.source, schema.device, up, readings, duration, terminal_safe(error_kind),
                terminal_safe(error[:MAX_ERROR_CHARS]), _partial(doc.get("partial")), at)


_OK = Quality.OK


def _readings(rows: list[Any], schema: FactSchema, now: float, skew: float) -> list[Reading]:
    """Each row [name, value, labels, quality, time] checked and built with this agent's spec of its family.

    This runs for every reading of every fact the agent takes: the common case (a known family, a series
    already checked, float value and time) costs dict lookups only, and every reading of one series shares one
    labels dict."""
    families, checked = schema.families, schema.checked
    horizon = now + skew
    out: list[Reading] = []
    for i, row in enumerate(rows):
        if type(row) is not list or len(row) != 5:
            raise RecordError("type", f"r[{i}]: expected [name, value, labels, quality, time]")
        name, value, labels, quality, ts = row
        spec = families.get(name) if type(name) is str else None
        if spec is None:
            raise RecordError("unknown_family", f"r[{i}]: {_short(name)} is no family {schema.source}/"
                                                f"{schema.device} publishes")
        if type(labels) is not dict:
            raise RecordError("labels", f"r[{i}]: {name}: labels {_short(labels)}")
        series = (name, tuple(labels.items()))
        try:
            known = checked.get(series)
        except TypeError:  # an unhashable label value: not a string, rejected below
            known = None
        if known is None:
            _check_labels(i, name, labels, schema)
            if len(checked) < MAX_SERIES:
                checked[series] = labels
        else:
            labels = known
        q = _QUALITY.get(quality) if type(quality) is str else None
        if q is None:
            raise RecordError("quality", f"r[{i}]: quality {_short(quality)}")
        if type(value) is not float:
            value = _number(value, f"r[{i}].value")
        if q is _OK and not math.isfinite(value):
            raise RecordError("range", f"r[{i}]: an ok {name} of {value!r}")
        if type(ts) is not float or not 0.0 <= ts <= horizon:
            ts = wall_time(ts, f"r[{i}].time", now, skew)
        out.append(make_reading(spec, value, labels, q, ts))
    return out


def _check_labels(i: int, name: str, labels: dict[str, Any], schema: FactSchema) -> None:
    """Exactly the family's label names; printable strings of bounded length; a pinned label's own values."""
    names = schema.labels[name]
    if labels.keys() != names:
        raise RecordError("labels", f"r[{i}]: {name} has labels {sorted(names)}, got {_short(sorted(labels))}")
    for k, v in labels.items():
        if type(v) is not str or len(v) > MAX_LABEL_CHARS or not v.isprintable():
            raise RecordError("label_value", f"r[{i}]: {name}.{k}: {_short(v)} is not a printable label value")
        allowed = schema.pinned.get(k)
        if allowed is not None and v not in allowed:
            raise RecordError("label_value", f"r[{i}]: {name}.{k}={_short(v)}: not one of "
                                             f"{schema.source}/{schema.device}'s")


def _number(value: Any, what: str) -> float:
    """A JSON number (NaN and infinities included) as a float; RecordError for anything else."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecordError("type", f"{what}: expected a number, got {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        raise RecordError("range", f"{what}: an integer too large for a float") from None


def _partial(value: Any) -> dict[str, int]:
    """A poll's partial error counts: a few short printable kinds (label values of the error counter)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_PARTIAL:
        raise RecordError("type", f"partial: expected at most {MAX_PARTIAL} error kinds")
    for k, n in value.items():
        if len(k) > 64 or not k.isprintable() or isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise RecordError("type", f"partial.{_short(k)}: expected a count")
    return dict(value)


def _short(value: Any) -> str:
    return terminal_safe(short_repr(value))
