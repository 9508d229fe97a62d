"""Shared facts: one poll of a shared device as a compact JSON document, and back into readings.

Why the whole poll and not a summary: an agent that does not poll the leak
controller must run the same detectors on the same numbers as one that does
(a leak in its zone, the leak watch's "unknown", the coolant summary, the
PDU's phase load and the rack power derived from it). So a poller publishes
what its poll put in its own store (readings, with their quality and the
device's own timestamps, or the failure), and every other agent puts it in
its store under the same (source, device): detectors, derived sources and
the API cannot tell the difference. Metric specs travel by value, so a
profile-defined family needs no registry on the receiving side.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from exporters.model import Kind, MetricSpec, Quality, Reading, make_reading

VERSION = 1
_QUALITY = {q.value: q for q in Quality}


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
        doc["error_kind"], doc["error"] = fact.error_kind, fact.error[:500]
    if fact.partial_errors:
        doc["partial"] = fact.partial_errors
    return json.dumps(doc, separators=(",", ":"), allow_nan=True).encode()


class Decoder:
    """Decodes facts, keeping one MetricSpec object per distinct declaration (facts arrive many times a second)."""

    def __init__(self) -> None:
        self._specs: dict[tuple, MetricSpec] = {}

    def _spec(self, name: str, decl: list[Any]) -> MetricSpec:
        key = (name, decl[0], decl[1], tuple(decl[2]), decl[3])
        spec = self._specs.get(key)
        if spec is None:
            spec = self._specs[key] = MetricSpec(name, Kind(decl[0]), str(decl[1]), tuple(decl[2]), str(decl[3]))
        return spec

    def decode(self, raw: bytes) -> Fact:
        """A Fact, or ValueError naming what is wrong (a fact from a newer agent, a cut value)."""
        try:
            doc = json.loads(raw)
            if doc.get("v") != VERSION:
                raise ValueError(f"fact version {doc.get('v')!r}, this agent reads {VERSION}")
            specs = {name: self._spec(name, decl) for name, decl in doc["specs"].items()}
            readings = [make_reading(specs[name], float(value), labels, _QUALITY[quality], float(ts))
                        for name, value, labels, quality, ts in doc["r"]]
            return Fact(str(doc["node"]), str(doc["source"]), str(doc["device"]), bool(doc["up"]), readings,
                        float(doc.get("duration", 0.0)), str(doc.get("error_kind", "")), str(doc.get("error", "")),
                        {str(k): int(v) for k, v in (doc.get("partial") or {}).items()}, float(doc.get("at", 0.0)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"unreadable fact: {type(exc).__name__}: {exc}"[:300]) from None
