"""Which of an agent's sources read a shared rack device, and which of those are safety inputs.

Why from the inventory: a CDU (over Modbus or Redfish), a leak controller or
a PDU serves the whole rack, so its poll is shared; a node's GPUs, ports and
its own tray BMC are its own and always polled by it. A Modbus CDU's coolant
poll and its leak inputs are two sources on one device: they get one set of
pollers, so the device sees one client per poller. A Redfish CDU is one
source (coolant and its own leak detectors in one walk) and a safety input:
while coordination is lost every agent reads its detectors, bounded. An NVLink
switch tray's BMC (kind switch) is the same: it serves the rack, and its leak
is a leak of its zone, so every agent of that zone must see it (through the
facts of its pollers) to drain and cap its own node.

The other trays' BMCs that `sources.redfish.watch_rack_trays` has the rack
leader read (to count leaking trays) are neither shared nor this node's: they
are polled only while this agent leads (`leader_jobs`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class SharedDevices:
    jobs: dict[str, str]  # job id ("leak/leak1") -> device name
    safety: frozenset[str]  # job ids polled by every agent (at a bounded rate) when coordination is lost

    @property
    def devices(self) -> list[str]:
        return sorted(set(self.jobs.values()))

    def jobs_of(self, device: str) -> list[str]:
        return sorted(j for j, d in self.jobs.items() if d == device)


def shared_devices(inventory) -> SharedDevices:
    jobs: dict[str, str] = {}
    for d in inventory.cdus:
        jobs[f"cdu/{d.name}"] = d.name
        jobs[f"leak/{d.name}"] = d.name  # its own leak inputs, when its profile has them
    for d in inventory.leak_controllers:
        jobs[f"leak/{d.name}"] = d.name
    for p in inventory.pdus:
        jobs[f"pdu/{p.name}"] = p.name
    redfish_cdus = {f"redfish/{ep.name}" for ep in inventory.redfish if ep.kind in ("cdu", "switch")}
    jobs.update({job: job.split("/", 1)[1] for job in sorted(redfish_cdus)})
    return SharedDevices(jobs, frozenset(j for j in jobs if j.startswith("leak/") or j in redfish_cdus))


def leader_jobs(cfg) -> frozenset[str]:
    """Jobs this agent runs only while it leads the rack: the other nodes' tray BMCs, with watch_rack_trays."""
    if not cfg.sources.redfish.watch_rack_trays:
        return frozenset()
    return frozenset(f"redfish/{ep.name}" for ep in cfg.inventory.redfish
                     if ep.kind == "tray" and ep.node != cfg.agent.node)


def ranked(device: str, nodes: list[str]) -> list[str]:
    """Rendezvous order of nodes for one device: every agent computes the same order from the same members,
    and one member leaving moves only its own devices."""
    return sorted(nodes, key=lambda n: hashlib.sha1(f"{device}|{n}".encode()).digest())
