"""Cross-references of a config: every name one section uses must exist in the section that defines it.

Why a pass of its own: each section validates alone (pydantic), but a node name in
`agent.node`, a valve `cdu:point`, a leak channel's zone or an outlet's node that
matches nothing passes that validation and then silently does nothing (an agent
that never drains itself, a valve never closed on a leak). So start, reload and
check-config all refuse such a config, naming the field. Secret-file permissions
are a warning only: an operator may have reasons (a group-readable token shared
with a sidecar), but should be told.
"""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.config import Config


def reference_errors(config: "Config") -> list[str]:
    """Every dangling reference, one message each naming the field and what it may be."""
    inv = config.inventory
    errors: list[str] = []
    nodes = set(inv.nodes)
    if nodes and config.agent.node not in nodes:
        errors.append(f"agent.node: {config.agent.node!r} not in inventory.nodes ({_known(nodes)}); "
                      "the agent would never act on its own node")
    leader = config.remediation.rack_leader
    if leader is not None and nodes and leader not in nodes:
        errors.append(f"remediation.rack_leader: {leader!r} not in inventory.nodes ({_known(nodes)})")
    zones = {z.name for z in inv.leak_zones}
    for kind in ("cdus", "leak_controllers"):
        for dev in getattr(inv, kind):
            for channel, zone in dev.channels.items():
                if zone not in zones:
                    errors.append(f"inventory.{kind}.{dev.name}.channels.{channel}: zone {zone!r} not in "
                                  f"inventory.leak_zones ({_known(zones)})")
    for zone in inv.leak_zones:
        if zone.valve is not None:
            problem = _valve_problem(config, zone.valve)
            if problem:
                errors.append(f"inventory.leak_zones.{zone.name}.valve: {problem}")
    for ep in inv.redfish:
        errors.extend(_redfish_problems(inv, ep, nodes, zones))
    if inv.rack_valve is not None:
        problem = _valve_problem(config, inv.rack_valve)
        if problem:
            errors.append(f"inventory.rack_valve: {problem}")
    coord = config.coordination
    from agent.coordination.shared import shared_devices

    shared = set(shared_devices(inv).devices)
    for device, pollers in (coord.pollers if coord is not None else {}).items():
        if device not in shared:
            errors.append(f"coordination.pollers.{device}: not a shared device of the inventory ({_known(shared)})")
        for node in pollers:
            if nodes and node not in nodes:
                errors.append(f"coordination.pollers.{device}: node {node!r} not in inventory.nodes ({_known(nodes)})")
        if config.agent.node not in pollers and not any(p in inv.agent_urls for p in pollers):
            errors.append(f"coordination.pollers.{device}: {config.agent.node} does not poll it and "
                          f"inventory.agent_urls has no URL of its pollers ({', '.join(pollers) or 'none'}): "
                          f"{config.agent.node} would never see it")
    for node in (coord.peers if coord is not None else {}):
        if nodes and node not in nodes:
            errors.append(f"coordination.peers.{node}: not in inventory.nodes ({_known(nodes)})")
    for pdu in inv.pdus:
        for outlet, node in pdu.outlets.items():
            if nodes and node not in nodes:
                errors.append(f"inventory.pdus.{pdu.name}.outlets.{outlet}: node {node!r} not in "
                              f"inventory.nodes ({_known(nodes)})")
    return errors


def _redfish_problems(inv, ep, nodes: set[str], zones: set[str]) -> list[str]:
    """A tray must name a node of the rack and report into a zone that lists that node (so its leak drains it)."""
    where = f"inventory.redfish.{ep.name}"
    if ep.kind == "switch":
        return []  # its zone is its switch tray's, checked with inventory.switch_trays (agent.config)
    if ep.kind == "cdu":
        if ep.zone is not None and ep.zone not in zones:
            return [f"{where}.zone: zone {ep.zone!r} not in inventory.leak_zones ({_known(zones)})"]
        return []
    if nodes and ep.node not in nodes:
        return [f"{where}.node: {ep.node!r} not in inventory.nodes ({_known(nodes)})"]
    if ep.zone is None:
        listing = sorted(z.name for z in inv.leak_zones if ep.node in z.nodes)
        if len(listing) != 1:
            why = f"several leak zones list node {ep.node!r} ({', '.join(listing)})" if listing else \
                f"no leak zone lists node {ep.node!r}"
            return [f"{where}.zone: {why}; give zone: the zone a leak of this tray is in"]
        return []
    zone = next((z for z in inv.leak_zones if z.name == ep.zone), None)
    if zone is None:
        return [f"{where}.zone: zone {ep.zone!r} not in inventory.leak_zones ({_known(zones)})"]
    if ep.node not in zone.nodes:
        return [f"{where}.zone: zone {ep.zone!r} does not list node {ep.node!r}; a leak of its tray would "
                f"never drain it"]
    return []


def _valve_problem(config: "Config", ref: str) -> str | None:
    """Why `cdu:point` names no writable point of a configured CDU, or None when it does."""
    from exporters.cooling import modbus_profile
    from exporters.cooling.bacnet import profile as bacnet_profile

    cdu_name, sep, point_name = ref.partition(":")
    if not sep or not cdu_name or not point_name:
        return f"expected cdu:point, got {ref!r}"
    cdus = {c.name: c for c in config.inventory.cdus}
    if cdu_name not in cdus:
        return f"CDU {cdu_name!r} not in inventory.cdus ({_known(set(cdus))})"
    cdu = cdus[cdu_name]
    if cdu.protocol == "snmp":  # an SNMP CDU's profile maps readings only: nothing it names is writable
        return f"CDU {cdu_name!r} speaks snmp: it has no writable control points"
    if cdu.protocol == "bacnet":
        profile: Any = bacnet_profile.load_profile(cdu.profile)  # loadable: checked before this pass
        points = {p.name: p for p in profile.points}
    else:
        profile = modbus_profile.load_profile(cdu.profile)
        points = {p.name: p for p in profile.expanded()}
    if point_name not in points:
        return f"profile {profile.name!r} of CDU {cdu_name!r} has no point {point_name!r}"
    if points[point_name].control is None:
        controls = {n for n, p in points.items() if p.control is not None}
        return (f"point {point_name!r} of profile {profile.name!r} is not a control point "
                f"(control points: {_known(controls)})")
    return None


def deprecation_warnings(config: "Config") -> list[str]:
    """Settings kept as aliases of the one place a fact now lives (they still work, folded into it)."""
    coord = config.coordination
    out = []
    if coord is not None and coord.peers:
        out.append("coordination.peers is deprecated: it is the same fact as inventory.agent_urls (node -> its "
                   "agent's URL, which the status page uses too); move its entries there")
    if coord is not None and coord.peers_ca_file is not None:
        out.append("coordination.peers_ca_file is deprecated: set status.peer_tls.ca_file (the same peers' CA; "
                   "status.peer_tls also gives a client certificate for peers that require one)")
    return out


def exposure_warnings(config: "Config") -> list[str]:
    """Defaults that are safe on the loopback but widen who can reach the agent once it listens elsewhere.

    Why warnings and not errors: the open Host default keeps Prometheus scrapes working out of the box, and
    one push token for every BMC is how older configs work; an operator should still see what they cost."""
    out = []
    listen = config.listen
    if listen.allowed_hosts is None and not ipaddress.ip_address(listen.address).is_loopback:
        out.append(f"listen.allowed_hosts is not set while listening on {listen.address}: any Host header is "
                   f"accepted, so a web page can reach this agent through DNS rebinding; list the names and "
                   f"addresses it is reached by (Prometheus scrapes, peers, the status page)")
    shared = [ep.name for ep in config.inventory.redfish if ep.event_token_secret is None]
    if config.sources.redfish.event_token_secret is not None and len(shared) > 1:
        out.append(f"sources.redfish.event_token_secret is the push token of {len(shared)} Redfish services "
                   f"({', '.join(shared)}): any of them can push events in another's name; give each "
                   f"inventory.redfish entry its own event_token_secret")
    return out


def secret_warnings(files: dict[str, Path]) -> list[str]:
    """Secret files readable by group or others: field -> path given, one warning each."""
    warnings = []
    for where, path in files.items():
        try:
            mode = path.stat().st_mode
        except OSError:
            continue  # reading it already failed or will fail with its own error
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            warnings.append(f"{where}: {str(path)!r} is accessible by group or others (mode {stat.filemode(mode)}); "
                            f"chmod 600 it")
    return warnings


def _known(names: set[str]) -> str:
    return ", ".join(sorted(names)) if names else "none defined"
