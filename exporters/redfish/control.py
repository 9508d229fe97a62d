"""A tray's power through its BMC: read PowerState, ComputerSystem.Reset (ForceOff / On), as the profile names them.

Why apart from the collector: remediation acts through plain callables
(agent/remediation/wiring.py), never through a source's internals; this keeps
its own small client (one connection) and finds the system by following links
from the service root, like every walk.
"""

from __future__ import annotations

import asyncio
import time

from exporters.model import SourceError
from exporters.redfish.client import SERVICE_ROOT, RedfishClient
from exporters.redfish.discovery import System, Walker, check_root
from exporters.redfish.profile import Profile, load_profile

ACCEPTED = (200, 202, 204)


class TrayPower:
    """PowerState of the tray's system(s) and the reset that changes it."""

    def __init__(self, client: RedfishClient, profile: Profile | str = "dmtf", settle_s: float = 10.0):
        self.client = client
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        self.settle_s = settle_s
        self._systems: list[System] | None = None

    async def systems(self) -> list[System]:
        if self._systems is None:
            root = check_root(await self.client.get(SERVICE_ROOT, authenticated=False), self.client.origin)
            found = []
            for uri, res in await Walker(self.client).first(root, self.profile.walk.systems):
                action = (res.get("Actions") or {}).get(self.profile.power.action) or {}
                target = action.get("target") if isinstance(action, dict) else None
                found.append(System(uri, target if isinstance(target, str) else None, ()))
            if not found:
                raise SourceError("protocol", f"{self.client.origin}: no ComputerSystem under the service root")
            self._systems = found
        return self._systems

    async def is_on(self) -> bool:
        """True while any system of the tray is powered (PowerState On, PoweringOn or PoweringOff)."""
        states = [str((await self.client.get(s.uri)).get("PowerState", "")) for s in await self.systems()]
        return any(st in ("On", "PoweringOn", "PoweringOff") for st in states)

    async def set(self, on: bool) -> None:
        """Reset every system of the tray to On or ForceOff and wait (bounded) until PowerState follows."""
        reset = self.profile.power.on_type if on else self.profile.power.off_type
        for system in await self.systems():
            if system.reset_target is None:
                raise SourceError("protocol", f"{system.uri}: no {self.profile.power.action} action")
            status, body, _ = await self.client.post(system.reset_target, {"ResetType": reset})
            if status not in ACCEPTED:
                raise SourceError("protocol", f"{system.reset_target} {reset}: HTTP {status} {body or ''}".strip())
        deadline = time.monotonic() + self.settle_s
        while await self.is_on() != on and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        await self.client.close()
