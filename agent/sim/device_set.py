"""Which simulated devices a simulator runs; each device module plugs in here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.sim.devices import SimDevice

if TYPE_CHECKING:
    from agent.sim.server import Simulator


def build_devices(sim: "Simulator") -> list[SimDevice]:
    devices: list[SimDevice] = []
    return devices


def demo_inventory(sim: "Simulator", node: str, cfg: dict) -> None:
    """Add the simulated devices' endpoints to one demo agent's config (inventory and sources)."""
