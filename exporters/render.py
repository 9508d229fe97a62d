"""Readings to Prometheus metric families; shared by the agent's /metrics and the `probe` commands."""

from __future__ import annotations

from typing import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporters.model import Kind, MetricSpec, Quality, Reading


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
