"""Which devices a playbook step acts on, from the incident's targets and the inventory.

Why apart: who acts on what is the rack's safety rule in one place: a local incident acts on this agent's own
node only, a follower leaves shared devices (valves, outlets) to the leader, a degraded agent queues them for
a person. Part of RemediationEngine (agent/remediation/engine.py).
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from .actions import ActionError
from .calls import NVML
from .incidents import Incident
from .step_runner import SHARED_TARGETS

log = logging.getLogger("supernode.remediation")


class TargetResolver:
    """Part of RemediationEngine: see the module docstring."""

    async def resolve_targets(self, kind: str, inc: Incident) -> list[dict[str, str]]:
        t, inv = inc.targets, self.inventory
        zone = next((z for z in inv.leak_zones if z.name == t.get("zone")), None)
        if "tray" in t:  # a tray-scoped leak (leak_scope.py): its node alone, never its zone's
            t, zone = {**t, "node": t["tray"]}, None
        if kind == "none":
            return [{}]
        if kind == "trays_below":
            return self._trays_below(inc)
        if kind == "nodes":
            nodes = list(zone.nodes) if zone is not None else ([t["node"]] if "node" in t else [])
            if inc.source == "local" or self.rack.role() == "degraded":
                # Every agent sees a rack-wide fault (a leak, the CDU); each drains only its own
                # node, so no two agents act on one node for one fault. Degraded (coordination lost),
                # an agent acts on its own node only, whatever the trigger.
                nodes = [n for n in nodes if n == self.identity.node]
            return [{"node": n} for n in nodes]
        if kind == "port":
            return [{"port": t["port"]}] if "port" in t else []
        if kind == "leaking_trays":
            return self._leaking_trays(inc)
        if kind in SHARED_TARGETS:
            role = self.rack.role()
            if role == "follower":
                return []  # shared rack devices are driven by one agent only: the rack leader
            if role == "degraded" and self.identity.node not in (zone.nodes if zone is not None else [t.get("node")]):
                return []  # degraded: only the endangered nodes' agents queue the shared step (for a person)
        if kind in ("valve", "rack_valve"):
            ref = getattr(inv, "rack_valve", None) if kind == "rack_valve" else (zone.valve if zone else None)
            if ref and ":" in ref:
                cdu, point = ref.split(":", 1)
                return [{"cdu": cdu, "point": point}]
            return []
        if kind == "outlets":
            nodes = set(zone.nodes) if zone is not None else {t.get("node")}
            return [{"pdu": p.name, "outlet": o} for p in inv.pdus for o, n in p.outlets.items() if n in nodes]
        if kind in ("gpus", "rack_gpus"):
            out = []
            for node, lib in self.executors.gpu_libs.items():
                if kind == "gpus" and zone is not None:
                    if node not in zone.nodes:
                        continue
                    indices = zone.gpus
                elif kind == "gpus":
                    if t.get("node", self.identity.node) != node:
                        continue
                    indices = [int(t["gpu"])] if t.get("gpu", "").isdigit() else None
                else:
                    indices = None
                if indices is None:
                    count = inv.gpus.count or await self._gpu_count(lib)
                    indices = list(range(count))
                out += [{"node": node, "gpu": str(i)} for i in indices]
            return out
        return []

    def _leaking_trays(self, inc: Incident) -> list[dict[str, str]]:
        """The trays whose own BMC detectors are wet in this leak (their sensor label starts with the BMC's
        inventory name); a local incident, or any while coordination is lost, acts only on this agent's own tray."""
        sensors = [*(inc.detail.get("sensors") or ()), *(inc.detail.get("drill_sensors") or ())] or (
            [inc.targets["sensor"]] if "sensor" in inc.targets else [])
        bmcs = {s.split("/", 1)[0] for s in sensors if isinstance(s, str)}
        trays = [e for e in getattr(self.inventory, "redfish", []) if e.kind == "tray" and e.name in bmcs]
        if inc.source == "local" or self.rack.role() == "degraded":
            trays = [e for e in trays if e.node == self.identity.node]
        return [{"bmc": e.name, "node": e.node} for e in trays]

    def _trays_below(self, inc: Incident) -> list[dict[str, str]]:
        """The compute trays watched below a tray leak (its detail's `watched`, from inventory.rack_units): the
        rack leader drains them, as it reads every tray's BMC; a follower leaves them to it, and while
        coordination is lost an agent drains only its own node (never below its own leak). A switch tray below
        has no node to drain: it stays flagged in the incident only."""
        watched = [n for n in inc.detail.get("watched") or () if isinstance(n, str) and n in self.inventory.nodes]
        role = self.rack.role()
        if role == "follower":
            return []
        if role == "degraded":
            watched = [n for n in watched if n == self.identity.node]
        return [{"node": n} for n in watched]

    async def _gpu_count(self, lib: Any) -> int:
        """nvmlDeviceGetCount with a timeout on NVML's own pool: a hung driver fails the step, not the loop."""
        try:
            return int(await NVML(lib.nvmlDeviceGetCount, timeout=self.settings.device_timeout_seconds,
                                  key=(id(lib), "count")))
        except Exception as exc:  # DeviceCallTimeout, NVMLError
            raise ActionError(f"NVML device count: {type(exc).__name__}: {exc}") from None

    def _node_of(self, target: Mapping[str, str]) -> str | None:
        """The node a step acts on (a GPU's, a drain's, an outlet's), for maintenance."""
        if "node" in target:
            return target["node"]
        pdu = next((p for p in self.inventory.pdus if p.name == target.get("pdu")), None)
        return pdu.outlets.get(target.get("outlet", "")) if pdu is not None else None
