"""Which simulated devices a simulator runs, and how a demo agent's config points at them."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from sim.devices import SimDevice

if TYPE_CHECKING:
    from sim.server import Simulator


# What the rack's CDU cdu1 may speak (`supernode-sim demo --cdu-protocol`): each a builder of the devices it adds
# beside the Redfish CDU every simulated rack has (rfcdu1). redfish: no cdu1, the rack's cooling is rfcdu1 alone.
CDU_PROTOCOLS = ("modbus", "redfish", "snmp", "bacnet")


def _modbus_cdu(sim: "Simulator") -> list[SimDevice]:
    from sim.modbus_devices import reference_cdu

    return [reference_cdu(sim.model, "cdu1")]


def _snmp_cdu(sim: "Simulator") -> list[SimDevice]:
    from sim.snmp_cdu import SimSnmpCdu

    return [SimSnmpCdu("cdu1", sim.model, "apc-inrow-rc")]


def _bacnet_cdu(sim: "Simulator") -> list[SimDevice]:
    from sim.bacnet_cdu import SimBacnetCdu

    return [SimBacnetCdu("cdu1", sim.model)]  # the same loop and valves as the Modbus one, on BACnet/IP


CDU_BUILDERS = {"modbus": _modbus_cdu, "redfish": lambda sim: [], "snmp": _snmp_cdu, "bacnet": _bacnet_cdu}


def check_cdu_protocol(protocol: str) -> str:
    """The protocol, if the simulator has a CDU that speaks it (ValueError naming the choices otherwise)."""
    if protocol not in CDU_BUILDERS:
        raise ValueError(f"cdu protocol {protocol!r}: expected one of {', '.join(CDU_PROTOCOLS)}")
    return protocol


def build_devices(sim: "Simulator") -> list[SimDevice]:
    from sim.links_tree import SimLinkTree
    from sim.modbus_devices import liebert_dcd, rle_leak_controller

    from sim.snmp_pdu import SimulatedRaritanPdu

    devices: list[SimDevice] = [*CDU_BUILDERS[sim.cdu_protocol](sim), liebert_dcd(sim.model, "rdhx1"),
                                rle_leak_controller(sim.model, "leak1"), SimulatedRaritanPdu(sim.model, "pdu-a")]
    for node in sim.model.nodes:
        devices.append(SimLinkTree(sim.model, node, base_dir=sim.workdir / "links"))
    devices.extend(redfish_devices(sim))
    from sim.imex import SimImexDomain  # registers the imex-down / imex-peer-down faults

    devices.append(SimImexDomain(sim.model, sim.workdir / "imex"))
    return devices


def redfish_devices(sim: "Simulator") -> list[SimDevice]:
    """A Redfish BMC per tray, one per NVLink switch tray, and one Redfish CDU, all behind the run's own CA and one
    generated account."""
    from sim.redfish.cdu import RedfishCdu
    from sim.redfish.pki import SimCA
    from sim.redfish.service import Credentials
    from sim.redfish.switch_tray import SwitchTrayBmc
    from sim.redfish.tray import TrayBmc

    base = sim.workdir / "redfish"
    ca = SimCA(base / "pki")
    creds = Credentials.generate(base)
    opts = {"session_timeout": sim.redfish_session_timeout}
    devices: list[SimDevice] = [TrayBmc(sim.model, node, creds, ca, **opts) for node in sim.model.nodes]
    devices += [SwitchTrayBmc(sim.model, tray, creds, ca, **opts) for tray in sim.model.switch_trays]
    devices.append(RedfishCdu(sim.model, "rfcdu1", creds, ca, **opts))
    return devices


def redfish_service(sim: "Simulator", name: str | None) -> Any:
    """A simulated Redfish service by node (its tray's BMC), by switch tray (its BMC) or by device name (default:
    the first node's BMC)."""
    from sim.faults import FaultError
    from sim.redfish.service import RedfishService

    services = {n: d for n, d in sim.devices.items() if isinstance(d, RedfishService)}
    key = name or next(iter(sim.model.nodes))
    dev = services.get(key) or services.get(f"bmc-{key}")
    if dev is None:
        raise FaultError(f"node: {key!r} is neither a simulated node nor a Redfish service "
                         f"({', '.join(sorted(services))})")
    return dev


def link_tree(sim: "Simulator", node: str) -> Any:
    tree = sim.devices.get(f"links-{node}")
    if tree is None:
        from sim.faults import FaultError

        raise FaultError(f"node: no simulated ports for {node!r}")
    return tree


def modbus_device(sim: "Simulator", name: str | None) -> Any:
    """A simulated Modbus device by name (default: the reference CDU)."""
    from sim.faults import FaultError
    from sim.modbus_devices import SimModbusDevice

    devices = {n: d for n, d in sim.devices.items() if isinstance(d, SimModbusDevice)}
    dev = devices.get(name or "cdu1")
    if dev is None:
        raise FaultError(f"device: {name!r} is not a simulated Modbus device ({', '.join(sorted(devices))})")
    return dev


def demo_inventory(sim: "Simulator", node: str, cfg: dict[str, Any]) -> None:
    """Add the simulated devices' endpoints to one demo agent's config (inventory and sources)."""
    inv = cfg["inventory"]
    src = cfg["sources"]
    tree = sim.devices.get(f"links-{node}")
    if tree is not None:
        # The second IB rail is redundant and may be isolated; the first never is.
        inv["ports"] = [{"name": name, "kind": kind, "isolatable": name != "mlx5_0/1",
                         **({"netdev": netdev} if netdev else {})}
                        for name, kind, _, netdev in tree.port_specs()]
        src["sysfs_root"] = str(tree.root)
        src["links"] = {"interval": 1.0, "timeout": 1.0}
        src["dom"] = {"interval": 5.0, "timeout": 4.0, "dom_dir": str(tree.dom_dir)}

    imex = sim.devices.get("imex")
    if imex is not None and sim.model.nodes[node].gpus and sim.model.nodes[node].gpus[0].architecture == "GB200":
        # A GB200 tray runs an IMEX daemon: the agent asks the simulator's stand-in for nvidia-imex-ctl.
        # Each poll starts the stand-in twice (a Python process, ~60 ms of CPU): the demo polls IMEX slowly.
        small = len(sim.model.nodes) <= 4
        src["imex"] = {"enabled": True, "interval": 5.0 if small else 15.0, "timeout": 3.0 if small else 5.0,
                       "command": [sys.executable, "-m", "sim.imex_ctl", str(imex.root), node]}

    from sim.modbus_devices import SimModbusDevice

    zones = sim.model.zone_nodes
    inv["leak_zones"] = [{"name": z, "nodes": list(nodes)} for z, nodes in sorted(zones.items())]
    from sim.bacnet_cdu import SimBacnetCdu

    cdus, leaks = [], []
    for name, dev in sim.devices.items():
        if isinstance(dev, SimBacnetCdu):
            host, port = dev.endpoint
            cdus.append({"name": name, "protocol": "bacnet", "profile": dev.profile.name, "host": host, "port": port,
                         "channels": {ch: z for ch, z in dev.zones.items()}})
            continue
        if not isinstance(dev, SimModbusDevice):
            continue
        host, port = dev.endpoint
        entry = {"name": name, "profile": dev.profile.name, "host": host, "port": port,
                 "channels": {ch: z for ch, z in dev.zones.items()}}
        (leaks if name.startswith("leak") else cdus).append(entry)
    from sim.snmp_cdu import SimSnmpCdu

    for name, dev in sim.devices.items():
        if isinstance(dev, SimSnmpCdu):
            host, port = dev.endpoint
            cdus.append({"name": name, "protocol": "snmp", "profile": dev.profile.profile, "host": host, "port": port,
                         "channels": dev.channel_zones(), "request_timeout": 0.3})
    inv["cdus"], inv["leak_controllers"] = cdus, leaks
    src["cdu"] = {"interval": 1.0, "timeout": 0.8}
    src["leak"] = {"interval": 0.5, "timeout": 0.4}

    from sim.snmp_pdu import SimulatedRaritanPdu

    pdus = []
    for name, dev in sim.devices.items():
        if isinstance(dev, SimulatedRaritanPdu):
            host, port = dev.endpoint
            pdus.append({"name": name, "profile": "raritan-pdu2", "host": host, "port": port, "version": "2c",
                         "outlets": dev.feeds()})
    inv["pdus"] = pdus
    if pdus:
        # A budget the rack exceeds at full load, so `workload --ratio 1` shows power capping.
        inv["power_budget_watts"] = round(sim.model.rack_power_w() * 1.1, -2)
        src["pdu"] = {"interval": 1.0, "timeout": 1.0}
