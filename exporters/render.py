"""Readings to Prometheus metric families; shared by the agent's /metrics and the `probe` commands."""

from __future__ import annotations

from typing import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.utils import floatToGoString
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporters.model import READING_QUALITY, Kind, MetricSpec, Quality, Reading


def _family(spec: MetricSpec, labelnames: list[str]) -> Metric:
    if spec.kind is Kind.COUNTER:
        return CounterMetricFamily(spec.name, spec.help, labels=labelnames)
    return GaugeMetricFamily(spec.name, spec.help, labels=labelnames)


def families_from_readings(readings: Iterable[Reading]) -> Iterator[Metric]:
    """Group OK readings by metric family; one sample per series (the last one wins)."""
    by_spec: dict[str, tuple[MetricSpec, dict[tuple, Reading]]] = {}
    for r in readings:
        if r.quality is not Quality.OK:
            continue
        entry = by_spec.setdefault(r.spec.name, (r.spec, {}))
        entry[1][tuple(sorted(r.labels.items()))] = r
    for name in sorted(by_spec):
        spec, series = by_spec[name]
        extra = sorted({k for r in series.values() for k in r.labels} - set(spec.labels))
        labelnames = list(spec.labels) + extra
        fam = _family(spec, labelnames)
        for key in sorted(series):
            r = series[key]
            fam.add_metric([str(r.labels.get(k, "")) for k in labelnames], float(r.value))
        yield fam


def render_readings(readings: Iterable[Reading]) -> bytes:
    """Prometheus text of a list of readings alone (for the `probe` commands)."""
    class _Once(Collector):
        def collect(self) -> Iterator[Metric]:
            yield from families_from_readings(readings)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Once())
    return generate_latest(registry)


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def render_text(readings: Iterable[Reading]) -> str:
    """The same text as `render_readings` (prometheus_client's generate_latest), built directly.

    Why: /metrics renders ~1,500 series per node at every scrape, and the
    library's generic path (Metric objects, per-sample name validation) costs
    twice the time of formatting them here. The library's own float formatter
    is reused, and a test checks byte equality with generate_latest.
    """
    by_spec: dict[str, tuple[MetricSpec, dict[tuple, Reading]]] = {}
    for r in readings:
        if r.quality is not Quality.OK:
            continue
        entry = by_spec.get(r.spec.name)
        if entry is None:
            entry = by_spec[r.spec.name] = (r.spec, {})
        entry[1][tuple(sorted(r.labels.items()))] = r
    out: list[str] = []
    for name in sorted(by_spec):
        spec, series = by_spec[name]
        extra = sorted({k for r in series.values() for k in r.labels} - set(spec.labels))
        labelnames = sorted(list(spec.labels) + extra)
        kind = "counter" if spec.kind is Kind.COUNTER else "gauge"
        doc = spec.help.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {kind}\n")
        for key in sorted(series):
            r = series[key]
            if labelnames:
                labels = r.labels
                text = ",".join(f'{k}="{_escape(str(labels.get(k, "")))}"' for k in labelnames)
                out.append(f"{name}{{{text}}} {floatToGoString(r.value)}\n")
            else:
                out.append(f"{name} {floatToGoString(r.value)}\n")
    return "".join(out)


def render_probe(source: str, device: str, readings: Iterable[Reading]) -> str:
    """What `/metrics` shows of one poll: the ok readings, and a quality series for each one that is not.

    Why here: the probe commands must print what the agent would export, so they use the agent's own
    renderer and the same `supernode_reading_quality` family (not a formatter of their own).
    """
    readings = list(readings)
    marks = [Reading(READING_QUALITY, 1.0, {"source": source, "device": device, "reading": r.reading_id(),
                                            "quality": r.quality.value}) for r in readings if not r.ok]
    return render_text(readings + marks)
