"""`supernode-agent probe links`: one poll of the node's ports and optics, as Prometheus text.

For an operator checking a new node (or a test) without starting the agent:
what would be exported, read the same way the running agent reads it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from exporters.dom import DomSource, make_reader
from exporters.links import LinkSource
from exporters.model import Kind, PollResult, Reading


class _Readings(Collector):
    def __init__(self, readings: list[Reading]):
        self.readings = readings

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        for r in self.readings:
            if not r.ok:
                continue
            spec = r.spec
            fam = families.get(spec.name)
            if fam is None:
                if spec.kind is Kind.COUNTER:
                    fam = CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
                else:
                    fam = GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)
                families[spec.name] = fam
            fam.add_metric([r.labels.get(k, "") for k in spec.labels], r.value)
        return list(families.values())


def render_readings(readings: list[Reading]) -> str:
    """Prometheus text exposition of OK readings (not-OK ones are listed as comments by the caller)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Readings(readings))
    return generate_latest(registry).decode()


async def probe_links_async(ports: Iterable[Any], sysfs_root: Path | str = Path("/sys"),
                            dom_dir: Path | str | None = None, dom: bool = True,
                            ethtool: str = "ethtool") -> tuple[PollResult, PollResult | None, list[str]]:
    ports = list(ports)
    links = LinkSource(ports, sysfs_root)
    try:
        link_result = await links.poll()
    finally:
        await links.close()
    notes = list(links.last_problems)
    dom_result = None
    if dom:
        source = DomSource(ports, make_reader(dom_dir, ethtool))
        dom_result = await source.poll()
        notes += source.last_errors
    return link_result, dom_result, notes


def probe_links(config_ports: Iterable[Any], sysfs_root: Path | str = Path("/sys"),
                dom_dir: Path | str | None = None, dom: bool = True) -> str:
    """Prometheus text of one poll of the ports (and their optics unless `dom` is False).

    Problems (unreadable files, failed modules, not-OK readings) come first as `#` comment lines.
    """
    link_result, dom_result, notes = asyncio.run(probe_links_async(config_ports, sysfs_root, dom_dir, dom))
    readings = link_result.readings + (dom_result.readings if dom_result else [])
    notes += [f"{r.reading_id()}: quality {r.quality.value}" for r in readings if not r.ok]
    head = "".join(f"# problem: {n}\n" for n in notes)
    return head + render_readings(readings)
