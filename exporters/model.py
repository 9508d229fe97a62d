"""The shared reading model: the one vocabulary exporters, the agent and remediation speak.

Exporters turn device replies into `Reading`s; the agent stores them in a
`Snapshot`; `/metrics`, the detectors and the API all read that snapshot, so
what a dashboard shows and what a playbook acts on are the same numbers.
This module must stay free of any import from `agent` (layering rule).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Iterable, Mapping


class Quality(str, enum.Enum):
    """How far a reading can be trusted; anything but OK never drives an action."""

    OK = "ok"
    STALE = "stale"
    SENSOR_FAULT = "sensor_fault"
    UNSUPPORTED = "unsupported"


class Kind(str, enum.Enum):
    GAUGE = "gauge"
    COUNTER = "counter"
    INFO = "info"
    HISTOGRAM = "histogram"  # agent-side families only (incident durations); never a device reading


# Base units a metric name may end in (longest first, so `_cubic_meters_per_second` wins over `_second`).
BASE_UNITS = ("cubic_meters_per_second", "cubic_meters_per_joule", "kelvin_per_watt", "bytes_per_second", "volt_amperes",
              "celsius", "watts", "joules", "pascals", "seconds", "bytes", "ratio", "dbm", "amperes", "volts",
              "hertz", "meters", "rpm", "siemens_per_meter")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """Name, type and HELP of one metric family; declared once next to the code that fills it.

    `name` is the full exposition name (counters include `_total`, info
    metrics include `_info`), so what is written here is what Prometheus sees.
    """

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    unit: str = ""

    def __post_init__(self) -> None:
        if not self.unit:  # the base unit is in the name, by convention: say it once, there
            base = self.name.removesuffix("_total")
            unit = next((u for u in BASE_UNITS if base.endswith("_" + u)), "")
            object.__setattr__(self, "unit", unit)
        if self.kind is Kind.COUNTER and not self.name.endswith("_total"):
            raise ValueError(f"counter {self.name} must end in _total")
        if self.kind is Kind.INFO and not self.name.endswith("_info"):
            raise ValueError(f"info metric {self.name} must end in _info")


def gauge(name: str, help: str, labels: Iterable[str] = (), unit: str = "") -> MetricSpec:
    return MetricSpec(name, Kind.GAUGE, help, tuple(labels), unit)


def counter(name: str, help: str, labels: Iterable[str] = (), unit: str = "") -> MetricSpec:
    return MetricSpec(name, Kind.COUNTER, help, tuple(labels), unit)


def histogram(name: str, help: str, labels: Iterable[str] = (), unit: str = "") -> MetricSpec:
    return MetricSpec(name, Kind.HISTOGRAM, help, tuple(labels), unit)


def info(name: str, help: str, labels: Iterable[str] = ()) -> MetricSpec:
    return MetricSpec(name, Kind.INFO, help, tuple(labels))


@dataclass(frozen=True, slots=True)
class Reading:
    """One value of one series at one time, with its quality.

    A reading whose quality is not OK keeps its (possibly garbage) raw value
    for the API and the journal, but is never exported as a sample: the
    exposition shows `supernode_reading_quality` for it instead.
    """

    spec: MetricSpec
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)
    quality: Quality = Quality.OK
    timestamp: float = field(default_factory=time.time)

    @property
    def name(self) -> str:
        return self.spec.name

    def label(self, key: str, default: str = "") -> str:
        return self.labels.get(key, default)

    @property
    def ok(self) -> bool:
        return self.quality is Quality.OK

    def key(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        """Identity of the series (name plus sorted labels)."""
        return self.spec.name, tuple(sorted(self.labels.items()))

    def reading_id(self) -> str:
        """A short human id used in `supernode_reading_quality{reading=...}`."""
        parts = [self.spec.name.removeprefix("supernode_")]
        parts += [f"{k}={v}" for k, v in sorted(self.labels.items())]
        return ",".join(parts)

    def as_dict(self) -> dict:
        return {
            "metric": self.spec.name,
            "value": self.value,
            "unit": self.spec.unit,
            "labels": dict(self.labels),
            "quality": self.quality.value,
            "timestamp": self.timestamp,
        }


_new_reading = object.__new__
_set_spec, _set_value, _set_labels, _set_quality, _set_timestamp = (
    getattr(Reading, f).__set__ for f in ("spec", "value", "labels", "quality", "timestamp"))


def make_reading(spec: MetricSpec, value: float, labels: Mapping[str, str], quality: Quality,
                 timestamp: float) -> Reading:
    """`Reading(spec, value, labels, quality, timestamp)` at about a third of the cost, for collectors'
    hot loops (an NVML cycle builds ~1500). The frozen dataclass's __init__ sets each field through
    object.__setattr__; this sets the slots directly. Same object: Reading has no __post_init__."""
    r = _new_reading(Reading)
    _set_spec(r, spec)
    _set_value(r, value)
    _set_labels(r, labels)
    _set_quality(r, quality)
    _set_timestamp(r, timestamp)
    return r


class SourceError(Exception):
    """A poll failed as a whole. `kind` feeds `supernode_source_errors_total{kind}`.

    Kinds in use: timeout, connection, protocol, decode, auth, driver, config.
    """

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(slots=True)
class PollResult:
    """What one poll of one source device returned."""

    readings: list[Reading]
    # Errors that did not fail the whole poll (one field, one register block).
    partial_errors: dict[str, int] = field(default_factory=dict)
    # The source vouches that these readings equal its last poll's (same series, values, qualities): the
    # runtime keeps the published ones fresh instead of publishing again (no snapshot, no detector pass).
    unchanged: bool = False


# Readings that are not ok are not exported as values; this family says which and why (one series each).
READING_QUALITY = gauge("supernode_reading_quality",
                        "1 for each reading that is not ok (stale, sensor_fault, unsupported); its value is not exported.",
                        ("source", "device", "reading", "quality"))
