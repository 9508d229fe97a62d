"""The static backend (and the behaviour without a `coordination` section): the config decides, nothing fails over.

The leader is `remediation.rack_leader`, else the first inventory node. A
shared device is polled by the nodes `coordination.pollers` lists for it,
else by every node that lists it (what an agent without coordination does).
Guardrails are counted by each agent alone (the blast radius from the
scheduler's own view), approvals are each agent's own, and no write is
fenced: two agents configured as leader would both drive the valves. This
is the single-node and lab choice; a rack whose leader may die runs `etcd`.
"""

from __future__ import annotations

from typing import Any

from agent.coordination.shared import SharedDevices, shared_devices


class LocalRack:
    """What the remediation engine asks the rack, answered from the config alone."""

    backend = "static"
    shared = False  # approvals and guardrails are this agent's own

    def __init__(self, leader: str, node: str):
        self.leader = leader
        self.node = node

    def is_leader(self) -> bool:
        return self.leader == self.node

    def role(self) -> str:
        return "leader" if self.is_leader() else "follower"

    def up(self) -> bool:
        return True

    async def check_drain(self, node: str, drained: list[str], rack_nodes: int, guard: Any) -> tuple[str, str] | None:
        return guard.check_blast_radius(drained, rack_nodes, node)

    async def reserve_action(self, kind: str, guard: Any) -> tuple[str, str] | None:
        return None

    async def release_drain(self, node: str) -> None:
        return None

    def pending_added(self, pending: Any, incident: Any) -> None:
        return None

    def pending_removed(self, pending: Any, approved: bool) -> None:
        return None

    def incident_closed(self, incident: Any) -> None:
        return None

    async def approve(self, ident: str, who: str, incidents: list[Any]) -> list[str]:
        return []

    def pending_view(self) -> list[dict[str, Any]]:
        return []

    async def reset_breaker(self, who: str) -> bool:
        return False

    def breaker_open(self) -> bool:
        return False

    def bind(self, engine: Any) -> None:
        return None

    async def fence(self, what: str) -> None:
        return None

    def fence_now(self) -> None:
        return None


def static_leader(loaded) -> str:
    cfg = loaded.config
    return cfg.remediation.rack_leader or (cfg.inventory.nodes[0] if cfg.inventory.nodes else cfg.agent.node)


class StaticCoordinator:
    """Pollers and leader from the config; see the module docstring."""

    backend = "static"

    def __init__(self, loaded):
        cfg = loaded.config
        self.node = cfg.agent.node
        self.shared: SharedDevices = shared_devices(cfg.inventory)
        coord = cfg.coordination
        self.pollers: dict[str, list[str]] = dict(coord.pollers) if coord is not None else {}
        self.rack = LocalRack(static_leader(loaded), self.node)

    def polls(self, device: str) -> bool:
        nodes = self.pollers.get(device)
        return nodes is None or self.node in nodes

    def gate_runners(self, runners: dict[str, Any]) -> None:
        for job_id, runner in runners.items():
            device = self.shared.jobs.get(job_id)
            if device is not None and not self.polls(device):
                runner.gate = _never

    def hidden(self) -> frozenset[tuple[str, str]]:
        return frozenset(tuple(j.split("/", 1)) for j, d in self.shared.jobs.items() if not self.polls(d))

    def up(self) -> bool:
        return True

    def is_leader(self) -> bool:
        return self.rack.is_leader()

    def polling(self) -> dict[str, bool]:
        return {d: self.polls(d) for d in self.shared.devices}

    async def start(self, agent: Any) -> None:
        return None

    async def stop(self) -> None:
        return None


def _never() -> bool:
    return False
