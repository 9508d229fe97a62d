"""Builds the configured sources from the inventory: the one place that knows which exporter serves what.

Imports of exporters are local to each builder so a node without, say, a
PDU never loads pysnmp, and so a broken optional dependency only disables
the source that needs it.
"""

from __future__ import annotations

from typing import Any, Callable

from agent.config import LinksSettings, LoadedConfig, NvmlSettings
from agent.runtime import ScheduledSource
from exporters.base import Source


def nvml_library(loaded: LoadedConfig) -> Any:
    """The pynvml module, or the simulator's twin with the same function names."""
    cfg = loaded.config
    settings = cfg.sources.nvml
    if settings.backend == "sim":
        from agent.backends import NVML_TWIN, load_backend

        if not settings.sim_url:
            from agent.config import ConfigError

            raise ConfigError("sources.nvml.sim_url: required when sources.nvml.backend is sim")
        return load_backend(NVML_TWIN, "sources.nvml.backend")(settings.sim_url, cfg.agent.node)
    import pynvml

    return pynvml


def _nvml(loaded: LoadedConfig) -> list[ScheduledSource]:
    cfg = loaded.config
    settings = cfg.sources.nvml
    if not settings.enabled:
        return []
    from exporters.gpu.nvml import NvmlSource

    src = NvmlSource(nvml_library(loaded), cfg.inventory.gpus.count, cfg.inventory.gpus.nvlinks_per_gpu,
                     call_timeout=settings.timeout, xid_events=settings.xid_events, gpu_timeout=settings.gpu_timeout,
                     counters_every=counters_every(settings),
                     xid_overrides={code: o.immediate_action for code, o in cfg.remediation.xid_overrides.items()
                                    if o.immediate_action is not None})
    return [ScheduledSource(src, settings)]


def counters_every(settings: NvmlSettings | LinksSettings) -> int:
    """Polls between reads of a source's error counters: `counters_interval` in whole polls, at least one."""
    return max(1, round(settings.counters_interval / settings.interval))


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
                                              timeout=s.links.timeout, counters_every=counters_every(s.links)),
                                   s.links))
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
        if d.protocol != "modbus":
            continue
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


def _bacnet(loaded: LoadedConfig, rack_power_w: Callable[[], float | None] | None) -> list[ScheduledSource]:
    """A BACnet CDU's sources: its coolant poll and (when its profile has leak inputs) its leak poll on the fast
    leak schedule, as a Modbus CDU's; both share one client (one UDP socket, one set of COV subscriptions each)."""
    cfg = loaded.config
    s = cfg.sources
    cdus = [d for d in cfg.inventory.cdus if d.protocol == "bacnet"]
    if not cdus:
        return []
    from exporters.cooling.bacnet.client import link_for
    from exporters.cooling.bacnet.source import BacnetSource, has_leak_points
    from exporters.cooling.coolant import CoolantProperties

    b = s.bacnet
    out: list[ScheduledSource] = []
    for d in cdus:
        def link() -> object:
            return link_for(d.host, d.port, device_instance=d.device_instance, timeout=b.request_timeout,
                            retries=b.retries, client_instance=b.client_instance, name=d.name)
        common = dict(channels=d.channels, cov=b.cov, cov_lifetime=b.cov_lifetime_seconds)
        if s.cdu.enabled:
            coolant = CoolantProperties(d.coolant.density_kg_m3, d.coolant.heat_capacity_j_kgk, d.coolant.name)
            out.append(ScheduledSource(BacnetSource("cdu", d.name, d.profile, link(), subset="cdu", coolant=coolant,
                                                    rack_power_w=rack_power_w, **common), s.cdu))
        if s.leak.enabled and has_leak_points(d.profile):
            out.append(ScheduledSource(BacnetSource("leak", d.name, d.profile, link(), subset="leak",
                                                    client_metrics=not s.cdu.enabled, **common), s.leak))
    return out


def snmp_credentials(loaded: LoadedConfig, device: Any) -> Any:
    """A PDU's or SNMP CDU's credentials, its secret names resolved to their values."""
    from exporters.snmp.client import SnmpCredentials

    def secret(name: str | None) -> str | None:
        return loaded.secret(name).get_secret_value() if name else None

    return SnmpCredentials(version=device.version, community=secret(device.community_secret) or "public",
                           v3_user=device.v3_user, auth_key=secret(device.v3_auth_secret),
                           priv_key=secret(device.v3_priv_secret), auth_protocol=device.v3_auth_protocol,
                           priv_protocol=device.v3_priv_protocol, context=device.v3_context)


def _snmp_cdus(loaded: LoadedConfig, rack_power_w: Callable[[], float | None] | None) -> list[ScheduledSource]:
    """Each SNMP CDU as two sources on the one device, like a Modbus CDU: its loop on the cdu schedule, its leak
    inputs (when its profile has any) on the fast leak schedule. A leak poll is one GET without resends that may
    take the whole leak poll's timeout (as a Modbus leak read may): the next poll, half a second later, is the
    retry."""
    cfg = loaded.config
    s = cfg.sources
    cdus = [d for d in cfg.inventory.cdus if d.protocol == "snmp"]
    if not cdus:
        return []
    from exporters.cooling.coolant import CoolantProperties
    from exporters.cooling.leak import LEAK_METRICS
    from exporters.cooling.snmp_cdu import SnmpCduSource
    from exporters.snmp.profile import load_profile

    out: list[ScheduledSource] = []
    for d in cdus:
        profile = load_profile(d.profile)
        creds = snmp_credentials(loaded, d)
        bounds = dict(max_repetitions=d.max_repetitions, max_rows=d.max_walk_rows, max_requests=d.max_walk_requests,
                      channels=d.channels)
        if s.cdu.enabled:
            coolant = CoolantProperties(d.coolant.density_kg_m3, d.coolant.heat_capacity_j_kgk, d.coolant.name)
            out.append(ScheduledSource(SnmpCduSource(
                "cdu", d.name, profile, (d.host, d.port), creds, timeout=d.request_timeout, retries=d.retries,
                subset="cdu", coolant=coolant, rack_power_w=rack_power_w, **bounds), s.cdu))
        if s.leak.enabled and any(m.metric in LEAK_METRICS for m in profile.metrics):
            out.append(ScheduledSource(SnmpCduSource(
                "leak", d.name, profile, (d.host, d.port), creds, timeout=s.leak.timeout, retries=0, subset="leak",
                **bounds), s.leak))
    return out


def pdu_sources(loaded: LoadedConfig) -> list[ScheduledSource]:
    """The PDU sources of a config: what the agent polls, and what remediation switches outlets through
    (agent/remediation/wiring.py takes each source's control, so one client per PDU does both)."""
    cfg = loaded.config
    s = cfg.sources
    if not (cfg.inventory.pdus and s.pdu.enabled):
        return []
    from exporters.power.pdu import PduSource

    out: list[ScheduledSource] = []
    for p in cfg.inventory.pdus:
        creds = snmp_credentials(loaded, p)
        out.append(ScheduledSource(PduSource(p.name, p.profile, (p.host, p.port), creds, timeout=p.request_timeout,
                                             retries=p.retries, max_repetitions=p.max_repetitions,
                                             outlet_feeds=p.outlets, max_rows=p.max_walk_rows,
                                             max_requests=p.max_walk_requests), s.pdu))
    return out


def redfish_client(loaded: LoadedConfig, ep: Any, max_connections: int | None = None) -> Any:
    """A client for one inventory Redfish service: its TLS trust, its account, the source settings' bounds."""
    from exporters.redfish.client import RedfishClient

    s = loaded.config.sources.redfish
    password = loaded.secret(ep.password_secret).get_secret_value() if ep.password_secret else None
    return RedfishClient(ep.url, user=ep.user, password=password, ca_file=ep.ca_file, pinned_sha256=ep.pinned_sha256,
                         auth=ep.auth, request_timeout=s.request_timeout,
                         max_connections=max_connections or s.max_connections, login_retry_s=s.login_retry_seconds)


def polled_redfish(loaded: LoadedConfig) -> list[Any]:
    """The Redfish services this agent reads: its own tray, the rack's CDUs and switch trays (shared devices:
    coordination says who polls them), every tray if it watches the rack.

    Under etcd the leader is elected, so every agent has a source for every tray when watch_rack_trays is on,
    and coordination lets the other trays' sources poll only while this agent leads (agent.coordination);
    without it (static) only the configured leader has them."""
    cfg = loaded.config
    me = cfg.agent.node
    elected = cfg.coordination is not None and cfg.coordination.backend == "etcd"
    watch = cfg.sources.redfish.watch_rack_trays and (elected or rack_leader(cfg) == me)
    return [ep for ep in cfg.inventory.redfish if ep.kind in ("cdu", "switch") or ep.node == me or watch]


def push_token_secret(cfg: Any, ep: Any) -> str | None:
    """The secret name of a Redfish service's push token: its own (inventory.redfish.N.event_token_secret), else
    the one every service without its own shares (sources.redfish.event_token_secret). The subscription hands it
    to the service and the push endpoint checks a delivery for that service against it, and only it."""
    return ep.event_token_secret or cfg.sources.redfish.event_token_secret


def rack_leader(cfg: Any) -> str:
    """The node whose agent drives shared rack devices: remediation.rack_leader, else the first inventory node."""
    return cfg.remediation.rack_leader or (cfg.inventory.nodes[0] if cfg.inventory.nodes else cfg.agent.node)


def _redfish(loaded: LoadedConfig) -> list[ScheduledSource]:
    cfg = loaded.config
    s = cfg.sources.redfish
    if not (cfg.inventory.redfish and s.enabled):
        return []
    from exporters.redfish.source import RedfishSource

    fast = s.unconfirmed_interval if s.unconfirmed_interval is not None else cfg.sources.leak.interval
    fast = fast if 0 < fast < s.interval else 0.0  # never slower than the timer itself
    slow = s.confirmed_interval if s.confirmed_interval > s.interval else 0.0  # never faster than the timer
    out: list[ScheduledSource] = []
    for ep in polled_redfish(loaded):
        dest = f"{s.event_destination.rstrip('/')}/api/v1/redfish/events/{ep.name}" if s.event_destination else None
        token_name = push_token_secret(cfg, ep)
        token = loaded.secret(token_name).get_secret_value() if token_name else None
        src = RedfishSource(ep.name, redfish_client(loaded, ep), kind=ep.kind, profile=ep.profile,
                            zone=cfg.inventory.redfish_zone(ep), rediscover_s=s.rediscover_seconds, events=s.events,
                            push_destination=dest, push_token=token, event_retry_s=s.event_retry_seconds,
                            event_min_poll_s=s.event_min_poll_seconds, unconfirmed_poll_s=fast,
                            confirmed_poll_s=slow)
        out.append(ScheduledSource(src, s))
    return out


def _imex(loaded: LoadedConfig) -> list[ScheduledSource]:
    s = loaded.config.sources.imex
    if not s.enabled:
        return []
    from exporters.imex.imex import ImexSource

    return [ScheduledSource(ImexSource(s.command, timeout=s.timeout), s)]


BUILDERS: list[Callable[[LoadedConfig], list[ScheduledSource]]] = [_nvml, _links, pdu_sources, _redfish, _imex]


def build_sources(loaded: LoadedConfig, rack_power_w: Callable[[], float | None] | None = None) -> list[ScheduledSource]:
    """Every configured source; `rack_power_w` reads the PDUs' latest rack power (for flow per kW)."""
    sources: list[ScheduledSource] = []
    for builder in BUILDERS:
        sources.extend(builder(loaded))
    sources.extend(_modbus(loaded, rack_power_w))
    sources.extend(_bacnet(loaded, rack_power_w))
    sources.extend(_snmp_cdus(loaded, rack_power_w))
    return sources


__all__ = ["build_sources", "nvml_library", "Source", "BUILDERS", "redfish_client", "polled_redfish", "rack_leader"]
