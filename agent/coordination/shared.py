"""Which of an agent's sources read a shared rack device, and which of those are safety inputs.

Why from the inventory: a CDU, a leak controller or a PDU serves the whole
rack, so its poll is shared; a node's GPUs, ports and (with the Redfish
source) its own tray BMC are its own and always polled by it. A CDU's
coolant poll and its leak inputs are two sources on one device: they get one
set of pollers, so the device sees one client per poller.
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
    return SharedDevices(jobs, frozenset(j for j in jobs if j.startswith("leak/")))


def ranked(device: str, nodes: list[str]) -> list[str]:
    """Rendezvous order of nodes for one device: every agent computes the same order from the same members,
    and one member leaving moves only its own devices."""
    return sorted(nodes, key=lambda n: hashlib.sha1(f"{device}|{n}".encode()).digest())
