"""The simulator's BACnet/IP CDU: a BACnet profile's objects served from the rack's coolant model.

The device itself is legacy BACpypes in a process of its own (sim/bacnet_device.py, via sim/bacnet_process.py);
this side reads the model's quantities (sim/quantities.py, the vocabulary the Modbus and Redfish CDUs use, so the
three protocols show the very same loop), converts each to its object's unit, and sends what changed. A leak
input's state is its zone's: wet is active, a broken rope is Reliability open-loop with the fault flag. A client's
write of a control point (a zone valve, a set point) comes back and is applied to the model, as a Modbus write is.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from exporters.cooling import modbus_metrics as mm
from exporters.cooling.bacnet.profile import ANALOG, BINARY, Point, Profile, load_profile
from exporters.safe_yaml import load_yaml_file
from exporters.units import from_base, to_base
from sim.bacnet_process import BacnetDeviceProcess
from sim.modbus_devices import WRITERS, _split
from sim.quantities import READERS
from sim.rack import RackModel

log = logging.getLogger("supernode.sim")
BINDINGS_DIR = Path(__file__).resolve().parent / "bacnet_bindings"
# A zone's leak state -> (present value, reliability) of its leak input.
LEAK_STATES = {"wet": (1, "no-fault-detected"), "cable_break": (0, "open-loop"),
               "contamination": (0, "unreliable-other"), "comm_loss": (0, "communication-failure")}


def load_bindings(profile: str) -> dict[str, str]:
    path = BINDINGS_DIR / f"{profile}.yaml"
    if not path.exists():
        return {}
    return dict((load_yaml_file(path, "binding file") or {}).get("points") or {})


class SimBacnetCdu:
    """A BACnet/IP CDU on 127.0.0.1 serving `profile` from the model; `zones` maps the profile's channels to the
    model's leak zones (default: the zones in sorted order on channels 1, 2, ...)."""

    def __init__(self, name: str, model: RackModel, profile: Profile | str = "reference-cdu", port: int = 0,
                 zones: dict[int, str] | None = None, instance: int = 1001):
        self.name = name
        self.model = model
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        with model.lock:
            default = {i + 1: z for i, z in enumerate(sorted(model.coolant.leak_zones))}
        self.zones = dict(zones) if zones is not None else default
        self.bindings = load_bindings(self.profile.name)
        self.process = BacnetDeviceProcess(self.profile.name, port, instance=instance, on_write=self._written)
        self._sent: dict[str, Any] = {}
        self._status_sent: dict[str, tuple[int, str]] = {}
        self._pending: dict[str, Any] = {}
        self._wake: asyncio.Event | None = None
        self._sender: asyncio.Task | None = None

    @property
    def endpoint(self) -> tuple[str, int]:
        return self.process.endpoint

    async def start(self) -> None:
        await self.process.start()
        self._wake = asyncio.Event()
        self._sender = asyncio.get_running_loop().create_task(self._send_loop())
        self.update(self.model)

    async def stop(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            self._sender = None
        await self.process.stop()

    async def flush(self) -> None:
        """Wait until everything the model said so far is served (tests: a change is on the wire when this returns)."""
        while self._pending or (self._wake is not None and self._wake.is_set()):
            await asyncio.sleep(0.005)
        await self.process.command({})

    # -- the model, served ------------------------------------------------------------

    def update(self, model: RackModel) -> None:
        """Queue every object whose value or leak state changed since it was last sent (caller may hold the lock)."""
        values: dict[str, Any] = {}
        status: dict[str, Any] = {}
        for p in self.profile.points:
            quantity = self.bindings.get(p.name)
            if quantity is None:
                continue
            if quantity == "leak":
                value, reliability = LEAK_STATES.get(model.coolant.leak_zones.get(self._zone(p) or "", "dry"),
                                                     (0, "no-fault-detected"))
                if self._status_sent.get(p.name) != (value, reliability):
                    self._status_sent[p.name] = (value, reliability)
                    status[p.name] = {"reliability": reliability, "fault": reliability != "no-fault-detected"}
            else:
                value = self._served(p, self._quantity(model, quantity, self._zone(p)))
            if self._sent.get(p.name) != value:
                self._sent[p.name] = values[p.name] = value
        if values or status:
            self._pending.setdefault("set", {}).update(values)
            self._pending.setdefault("status", {}).update(status)
            if self._wake is not None:
                self._wake.set()

    async def _send_loop(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            msg, self._pending = self._pending, {}
            try:
                await self.process.command(msg)
            except Exception as exc:  # the device process died: the next change tries again
                log.warning("BACnet CDU did not take an update", extra={"device": self.name, "error": str(exc)})

    def _zone(self, p: Point) -> str | None:
        return self.zones.get(p.channel) if p.channel is not None else None

    @staticmethod
    def _quantity(model: RackModel, sim: str, zone: str | None) -> float:
        head, arg = _split(sim)
        if head == "const":
            return float(arg)
        return READERS[head](model, arg, zone)

    @staticmethod
    def _served(p: Point, base: float) -> Any:
        """A base-unit quantity as the object's present value: its device unit and scale, active/inactive, a state."""
        if p.object_type in ANALOG:
            return round((from_base(base, p.unit) - p.offset) / p.scale, 3)
        if p.object_type in BINARY:
            return int((base >= 0.5) != p.invert)
        return next((s for s, v in (p.states or {}).items() if v == round(base)), min(p.states or {1: 0}))

    def _written(self, point: str, value: Any) -> None:
        """A client wrote a control point: the model follows (a closed valve stops its zone's flow)."""
        p = self.profile.point(point)
        head, arg = _split(self.bindings.get(point, ""))
        if head not in WRITERS or p.control is None:
            return
        if p.object_type in BINARY:
            base = float(bool(value) != p.invert)
        elif p.object_type in ANALOG:
            base = to_base(float(value) * p.scale + p.offset, p.unit)
        else:
            base = float((p.states or {}).get(int(value), 0))
        with self.model.lock:
            WRITERS[head](self.model, arg, self._zone(p), base)
            self.model.step(0.0)
        self.update(self.model)

    def feeds_leak(self) -> bool:
        return any(p.metric == mm.LEAK_DETECTED.name for p in self.profile.points)
