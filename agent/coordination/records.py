"""What an agent reads back from etcd is checked before it feeds a decision: one validator per key kind.

Why: etcd is a shared store that every agent of the rack writes, and with the
demo's or a careless production setup anyone who reaches it can write any key.
A value that an agent parsed and used unchecked (a bad JSON document, a string
where a time belongs, a node that is not in the rack, a time ten years ahead)
used to crash the leak response or block it for good. Here every record kind
has a schema; a record (or one entry of it) that fails is *rejected*: ignored
for the decision it would have fed, counted in
`supernode_coordination_rejected_records_total{key_kind,why}`, and logged once
per key and revision (a record rewritten every 0.1 s would otherwise flood the
log), and the decision takes the branch that still protects hardware (a leak
always drains and caps its own zone's nodes).

Times in the rack's records are wall-clock times written by other agents: one
further ahead of this agent's clock than `coordination.max_clock_skew_seconds`
cannot be true, and would make a reservation or a breaker entry last for ever.

The validators are pure functions of (raw value, context): no I/O, no clock of
their own (the caller passes `now`), so they are property-tested on any input.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

from exporters.model import counter

log = logging.getLogger("supernode.coordination")

REJECTED_RECORDS = counter("supernode_coordination_rejected_records_total", (
    "Records read from rack coordination (etcd keys, a peer's fact stream) that failed validation and were "
    "ignored for the decision they would have fed, by key kind and why."), ("key_kind", "why"))

MAX_RECORD_BYTES = 256 << 10  # no rack record is anywhere near this; a larger one is not parsed at all
MAX_LOGGED_KEYS = 4096  # (key, revision) pairs remembered for log-once; the oldest are forgotten first


class RecordError(ValueError):
    """A record (or an entry of one) that fails its schema; `why` is a short, fixed label for the metric."""

    def __init__(self, why: str, detail: str = ""):
        super().__init__(f"{why}: {detail}" if detail else why)
        self.why = why
        self.detail = detail


@dataclass
class Rejections:
    """Counts rejected records by (key kind, why) and logs each (key, revision) once."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    _logged: dict[tuple[str, int], None] = field(default_factory=dict)

    def reject(self, key_kind: str, why: str, key: str, revision: int = 0, detail: str = "") -> None:
        k = (key_kind, why)
        self.counts[k] = self.counts.get(k, 0) + 1
        once = (key, revision)
        if once in self._logged:
            return
        if len(self._logged) >= MAX_LOGGED_KEYS:
            self._logged.pop(next(iter(self._logged)))
        self._logged[once] = None
        log.warning("coordination record rejected", extra={
            "key": key[:200], "revision": revision, "key_kind": key_kind, "why": why, "detail": detail[:200]})

    def error(self, key_kind: str, key: str, revision: int, exc: RecordError) -> None:
        self.reject(key_kind, exc.why, key, revision, exc.detail)

    def total(self, key_kind: str | None = None) -> int:
        return sum(n for (kind, _), n in self.counts.items() if key_kind is None or kind == key_kind)


# -- primitives ------------------------------------------------------------------------------------------------

def parse_json(raw: bytes | str) -> Any:
    """The JSON value of a record, or RecordError (too large, not UTF-8, not JSON, nested without end)."""
    if len(raw) > MAX_RECORD_BYTES:
        raise RecordError("too_large", f"{len(raw)} bytes")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError, TypeError) as exc:
        raise RecordError("not_json", f"{type(exc).__name__}") from None


def as_object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RecordError("type", f"{what}: expected an object, got {type(value).__name__}")
    return value


def wall_time(value: Any, what: str, now: float, skew: float) -> float:
    """A wall-clock time (seconds since the epoch) written by an agent: a finite number, not after now + skew."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RecordError("type", f"{what}: expected a time in seconds, got {type(value).__name__}")
    t = float(value)
    if not math.isfinite(t) or t < 0:
        raise RecordError("range", f"{what}: {t!r} is not a time")
    if t > now + skew:
        raise RecordError("future", f"{what}: {t - now:.1f} s ahead of this agent's clock (skew allowed {skew:g} s)")
    return t


def node_name(value: Any, what: str, nodes: Iterable[str]) -> str:
    if not isinstance(value, str):
        raise RecordError("type", f"{what}: expected a node name, got {type(value).__name__}")
    if value not in nodes:
        raise RecordError("unknown_node", f"{what}: {value[:60]!r} is not in the rack's inventory")
    return value


# -- guard/drains ----------------------------------------------------------------------------------------------

def drains_doc(raw: bytes | str | None, nodes: Iterable[str], now: float, skew: float,
               rejections: Rejections | None = None, key: str = "guard/drains", revision: int = 0
               ) -> dict[str, float]:
    """The drain reservations that may count: {inventory node: wall time of the reservation}.

    A document that is not an object counts as empty (the scheduler's own view still counts every real drain);
    an entry naming a node outside the inventory, or whose time is not a time or lies in the future, is dropped.
    Each rejection is counted (when `rejections` is given)."""
    if raw is None:
        return {}
    nodes = frozenset(nodes)
    try:
        doc = as_object(parse_json(raw), "drains")
    except RecordError as exc:
        if rejections is not None:
            rejections.error("guard_drains", key, revision, exc)
        return {}
    out: dict[str, float] = {}
    for name, t in doc.items():
        try:
            node = node_name(name, f"drains.{str(name)[:40]}", nodes)
            out[node] = wall_time(t, f"drains.{node}", now, skew)
        except RecordError as exc:
            if rejections is not None:
                rejections.error("guard_drains", key, revision, exc)
    return out


# -- guard/actions ---------------------------------------------------------------------------------------------

@dataclass
class ActionsDoc:
    """The rack's action counts: times of recent actions (breaker window), per-kind times (hourly rates), the
    breaker's state. Only valid entries survive parsing."""

    recent: list[float] = field(default_factory=list)
    kinds: dict[str, list[float]] = field(default_factory=dict)
    breaker: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"recent": self.recent, "kinds": self.kinds, "breaker": self.breaker}


KIND_NAME_MAX = 64


def _times(value: Any, what: str, now: float, skew: float, errors: list[RecordError]) -> list[float]:
    if not isinstance(value, list):
        errors.append(RecordError("type", f"{what}: expected a list of times, got {type(value).__name__}"))
        return []
    out = []
    for i, t in enumerate(value[:10_000]):
        try:
            out.append(wall_time(t, f"{what}[{i}]", now, skew))
        except RecordError as exc:
            errors.append(exc)
    return out


def actions_doc(raw: bytes | str | None, nodes: Iterable[str], now: float, skew: float,
                rejections: Rejections | None = None, key: str = "guard/actions", revision: int = 0) -> ActionsDoc:
    """The rack's action counts with every invalid entry dropped (counted).

    The breaker is open only when the record says so in the expected shape (`open` true, `at` a time not in the
    future, `by` an inventory node): a garbled breaker record does not stop the rack's remediation, and a valid
    one that a person may reset still does."""
    doc = ActionsDoc()
    if raw is None:
        return doc
    errors: list[RecordError] = []
    try:
        obj = as_object(parse_json(raw), "actions")
    except RecordError as exc:
        obj = {}
        errors.append(exc)
    if "recent" in obj:
        doc.recent = _times(obj["recent"], "recent", now, skew, errors)
    kinds = obj.get("kinds", {})
    if isinstance(kinds, dict):
        for kind, times in list(kinds.items())[:256]:
            if not isinstance(kind, str) or not kind or len(kind) > KIND_NAME_MAX:
                errors.append(RecordError("type", "kinds: an action kind that is not a short name"))
                continue
            doc.kinds[kind] = _times(times, f"kinds.{kind}", now, skew, errors)
    else:
        errors.append(RecordError("type", f"kinds: expected an object, got {type(kinds).__name__}"))
    breaker = obj.get("breaker", {})
    if isinstance(breaker, dict):
        doc.breaker = _breaker(breaker, frozenset(nodes), now, skew, errors)
    else:
        errors.append(RecordError("type", f"breaker: expected an object, got {type(breaker).__name__}"))
    if rejections is not None:
        for exc in errors:
            rejections.error("guard_actions", key, revision, exc)
    return doc


def _breaker(b: dict[str, Any], nodes: frozenset[str], now: float, skew: float,
             errors: list[RecordError]) -> dict[str, Any]:
    if not b:
        return {}
    opened = b.get("open")
    if not isinstance(opened, bool):
        errors.append(RecordError("type", "breaker.open: expected true or false"))
        return {}
    try:
        at = wall_time(b.get("at"), "breaker.at", now, skew)
    except RecordError as exc:
        errors.append(exc)
        return {}
    if not opened:
        who = b.get("reset_by")
        return {"open": False, "at": at, **({"reset_by": who[:200]} if isinstance(who, str) else {})}
    try:
        by = node_name(b.get("by"), "breaker.by", nodes)
    except RecordError as exc:
        errors.append(exc)
        return {}
    return {"open": True, "at": at, "by": by}


# -- maintenance/<node> ----------------------------------------------------------------------------------------

MAINTENANCE_BY_MAX = 200


def maintenance_doc(raw: bytes | str, node: str, nodes: Iterable[str], now: float, skew: float) -> dict[str, Any]:
    """A rack maintenance record for `node` (the key's, or the answering peer's): {by, since, until, set_via}.

    RecordError when the node is not in the inventory, the value is not an object, `by` is not a short name,
    `since` is not a time or lies in the future, `until` is neither null nor a time after `since`, or `set_via`
    (the agent a person set it on) is not an inventory node. Why strict: a rack record silences every agent's
    actions on that node; one that does not check out leaves the node to the agents (the conservative branch:
    maintenance only ever stops actions). A record whose `until` has passed is valid and simply no longer
    active (its agent deletes it when it notices)."""
    nodes = frozenset(nodes)
    node_name(node, "maintenance key", nodes)
    doc = as_object(parse_json(raw), "maintenance")
    by = doc.get("by")
    if not isinstance(by, str) or not by or len(by) > MAINTENANCE_BY_MAX:
        raise RecordError("type", "maintenance.by: expected the name of who set it")
    since = wall_time(doc.get("since"), "maintenance.since", now, skew)
    until = doc.get("until")
    if until is not None:
        if isinstance(until, bool) or not isinstance(until, (int, float)) or not math.isfinite(until):
            raise RecordError("type", "maintenance.until: expected a time in seconds or null")
        if until <= since:
            raise RecordError("range", f"maintenance.until: {until!r} is not after since")
        until = float(until)
    set_via = node_name(doc.get("set_via"), "maintenance.set_via", nodes)
    return {"by": by, "since": since, "until": until, "set_via": set_via}
