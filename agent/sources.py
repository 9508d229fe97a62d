"""Builds the configured sources from the inventory: the one place that knows which exporter serves what.

Imports of exporters are local to each builder so a node without, say, a
PDU never loads pysnmp, and so a broken optional dependency only disables
the source that needs it.
"""

from __future__ import annotations

from typing import Any, Callable

from agent.config import LoadedConfig
from agent.runtime import ScheduledSource
from exporters.base import Source


def nvml_library(loaded: LoadedConfig) -> Any:
    """The pynvml module, or the simulator's twin with the same function names."""
    cfg = loaded.config
    settings = cfg.sources.nvml
    if settings.backend == "sim":
        from agent.nvml_twin import NvmlTwin

        if not settings.sim_url:
            from agent.config import ConfigError

            raise ConfigError("sources.nvml.sim_url: required when sources.nvml.backend is sim")
        return NvmlTwin(settings.sim_url, cfg.agent.node)
    import pynvml

    return pynvml


def _nvml(loaded: LoadedConfig) -> list[ScheduledSource]:
    cfg = loaded.config
    settings = cfg.sources.nvml
    if not settings.enabled:
        return []
    from exporters.gpu.nvml import NvmlSource

    src = NvmlSource(nvml_library(loaded), cfg.inventory.gpus.count, cfg.inventory.gpus.nvlinks_per_gpu,
                     call_timeout=settings.timeout, xid_events=settings.xid_events, gpu_timeout=settings.gpu_timeout)
    return [ScheduledSource(src, settings)]


def _links(loaded: LoadedConfig) -> list[ScheduledSource]:
    cfg = loaded.config
    s = cfg.sources
    if not cfg.inventory.ports:
        return []
    from exporters.links.dom import DomSource, make_reader
    from exporters.links.links import LinkSource

    out: list[ScheduledSource] = []
    if s.links.enabled:
        out.append(ScheduledSource(LinkSource(cfg.inventory.ports, s.sysfs_root, device=cfg.agent.node,
                                              timeout=s.links.timeout), s.links))
    if s.dom.enabled:
        out.append(ScheduledSource(DomSource(cfg.inventory.ports, make_reader(s.dom.dom_dir, s.dom.ethtool),
                                             device=cfg.agent.node, concurrency=s.dom.concurrency,
                                             module_timeout=s.dom.module_timeout), s.dom))
    return out




def _modbus(loaded: LoadedConfig, rack_power_w: Callable[[], float | None] | None) -> list[ScheduledSource]:
    cfg = loaded.config
    s = cfg.sources
    if not (cfg.inventory.cdus or cfg.inventory.leak_controllers):
        return []
    from exporters.cooling.coolant import CoolantProperties
    from exporters.cooling.modbus import ModbusSource, has_leak_points

    out: list[ScheduledSource] = []
    for d in cfg.inventory.cdus:
        common = dict(host=d.host, port=d.port, unit=d.unit, channels=d.channels)
        if s.cdu.enabled:
            coolant = CoolantProperties(d.coolant.density_kg_m3, d.coolant.heat_capacity_j_kgk, d.coolant.name)
            out.append(ScheduledSource(ModbusSource("cdu", d.name, d.profile, timeout=s.cdu.timeout, subset="cdu",
                                                    rack_power_w=rack_power_w, coolant=coolant, **common), s.cdu))
        if s.leak.enabled and has_leak_points(d.profile):
            # A CDU's own leak inputs run on the fast leak schedule, over the same connection.
            out.append(ScheduledSource(ModbusSource("leak", d.name, d.profile, timeout=s.leak.timeout,
                                                    subset="leak", **common), s.leak))
    if s.leak.enabled:
        for d in cfg.inventory.leak_controllers:
            out.append(ScheduledSource(ModbusSource("leak", d.name, d.profile, d.host, d.port, d.unit,
                                                    timeout=s.leak.timeout, channels=d.channels), s.leak))
    return out


def _pdus(loaded: LoadedConfig) -> list[ScheduledSource]:
    cfg = loaded.config
    s = cfg.sources
    if not (cfg.inventory.pdus and s.pdu.enabled):
        return []
    from exporters.power.pdu import PduSource
    from exporters.power.snmp_client import SnmpCredentials

    def secret(name: str | None) -> str | None:
        return loaded.secret(name).get_secret_value() if name else None

    out: list[ScheduledSource] = []
    for p in cfg.inventory.pdus:
        creds = SnmpCredentials(version=p.version, community=secret(p.community_secret) or "public",
                                v3_user=p.v3_user, auth_key=secret(p.v3_auth_secret), priv_key=secret(p.v3_priv_secret),
                                auth_protocol=p.v3_auth_protocol, priv_protocol=p.v3_priv_protocol, context=p.v3_context)
        out.append(ScheduledSource(PduSource(p.name, p.profile, (p.host, p.port), creds, timeout=p.request_timeout,
                                             retries=p.retries, max_repetitions=p.max_repetitions,
                                             outlet_feeds=p.outlets, max_rows=p.max_walk_rows,
                                             max_requests=p.max_walk_requests), s.pdu))
    return out


BUILDERS: list[Callable[[LoadedConfig], list[ScheduledSource]]] = [_nvml, _links, _pdus]


def build_sources(loaded: LoadedConfig, rack_power_w: Callable[[], float | None] | None = None) -> list[ScheduledSource]:
    """Every configured source; `rack_power_w` reads the PDUs' latest rack power (for flow per kW)."""
    sources: list[ScheduledSource] = []
    for builder in BUILDERS:
        sources.extend(builder(loaded))
    sources.extend(_modbus(loaded, rack_power_w))
    return sources


__all__ = ["build_sources", "nvml_library", "Source", "BUILDERS"]
