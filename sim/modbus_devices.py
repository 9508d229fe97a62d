"""Simulated Modbus TCP devices (CDUs, leak controllers) driven by the rack model.

One class serves any Modbus profile: the simulator's own binding file for
that profile (sim/modbus_bindings/<profile>.yaml; shipped profiles
carry no simulator fields) names, per point and per status bit, a quantity
of the rack model (a small fixed vocabulary below), which is converted to
the point's device unit and encoded with the point's own type, scale and
word order. So the reference CDU, the Liebert DCD (word-swapped
floats) and the RLE leak controllers are all served from their profiles, and
`probe modbus` works on every shipped profile. The independent `mbpoll`
cross-check in the tests keeps this from being checked only against itself.

Faults are plain methods the fault-injection API calls: offline, slow,
exception replies, a stuck point, a sentinel point, dropped connections.
Pump, flow, supply and leak faults are model changes (RackModel.coolant).
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


from pymodbus.constants import ExcCodes
from pymodbus.server import ModbusTcpServer
from pymodbus.server.requesthandler import ServerRequestHandler
from pymodbus.simulator import DataType, SimData, SimDevice

from sim.quantities import READERS
from sim.rack import RackModel
from exporters.cooling.modbus_codec import clamp_raw, decode, encode
from exporters.cooling.modbus_profile import Point, Profile, load_profile
from exporters.safe_yaml import load_yaml_file
from agent.loop_calls import running_on

def _write_setpoint(m: RackModel, a: str, z: str | None, v: float) -> None:
    m.coolant.secondary_supply_setpoint_c = v


def _write_pump_setpoint(m: RackModel, a: str, z: str | None, v: float) -> None:
    m.coolant.pump_speed = [max(0.0, min(v, 1.0))] * len(m.coolant.pump_speed)


def _write_valve(m: RackModel, a: str, z: str | None, v: float) -> None:
    if z is not None:
        m.coolant.valve_open[z] = bool(v)


WRITERS: dict[str, Callable[[RackModel, str, str | None, float], None]] = {
    "supply_setpoint": _write_setpoint, "pump_setpoint": _write_pump_setpoint, "valve": _write_valve}


BINDINGS_DIR = Path(__file__).resolve().parent / "modbus_bindings"


@dataclass(frozen=True)
class Bindings:
    """What the simulator serves for one profile: point name -> quantity, and point name -> bit -> quantity."""

    points: dict[str, str] = field(default_factory=dict)
    bits: dict[str, dict[int, str]] = field(default_factory=dict)


def load_bindings(profile: str) -> Bindings:
    """The binding file of a profile; a profile without one is served as all zeros."""
    path = BINDINGS_DIR / f"{profile}.yaml"
    if not path.exists():
        return Bindings()
    data = load_yaml_file(path, "binding file") or {}
    return Bindings(dict(data.get("points") or {}),
                    {name: {int(b): q for b, q in bits.items()} for name, bits in (data.get("bits") or {}).items()})


def _split(sim: str) -> tuple[str, str]:
    if sim.startswith("const:"):
        return "const", sim[6:]
    head, _, arg = sim.rpartition(".")
    if head in READERS and arg.isdigit():
        return head, arg
    return sim, ""


class _Context:
    """What pymodbus' request handlers call: reads and writes go to the device's tables."""

    def __init__(self, device: "SimModbusDevice"):
        self.device = device

    def device_ids(self) -> list[int]:
        return [self.device.unit]

    async def async_getValues(self, device_id: int, func_code: int, address: int, count: int = 1):
        return await self.device._serve(device_id, func_code, address, count, None)

    async def async_setValues(self, device_id: int, func_code: int, address: int, values):
        res = await self.device._serve(device_id, func_code, address, len(values), list(values))
        return res if isinstance(res, ExcCodes) else None


# The client connection a request came on, so the device can count its clients (tests and benches of
# rack coordination read them: how many agents poll this device).
_PEER: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("sim_modbus_peer", default=None)


class _Handler(ServerRequestHandler):
    async def handle_request(self):
        transport = getattr(self, "transport", None)
        _PEER.set(transport.get_extra_info("peername") if transport is not None else None)
        await super().handle_request()

    def callback_connected(self) -> None:
        super().callback_connected()
        transport = getattr(self, "transport", None)
        self._peer = transport.get_extra_info("peername") if transport is not None else None

    def callback_disconnected(self, exc: Exception | None) -> None:
        """A closed connection is no client any more: a poller that reconnected (its request timed out on a
        loaded machine) is one client with a new connection, not two clients of the device."""
        device = getattr(self.server, "sim_device", None)
        if device is not None:
            device.peers.pop(getattr(self, "_peer", None), None)
        super().callback_disconnected(exc)


class _Server(ModbusTcpServer):
    def __init__(self, device: "SimModbusDevice", port: int):
        placeholder = SimDevice(device.unit, simdata=[SimData(0, values=0, datatype=DataType.REGISTERS)])
        super().__init__(placeholder, address=("127.0.0.1", port), ignore_missing_devices=False)
        self.context = _Context(device)  # type: ignore[assignment]
        self.sim_device = device

    def callback_new_connection(self):
        return _Handler(self, self.trace_packet, self.trace_pdu, self.trace_connect)


TABLE_OF_FC = {1: "coil", 5: "coil", 15: "coil", 2: "discrete", 3: "holding", 6: "holding", 16: "holding",
               23: "holding", 4: "input"}


class SimModbusDevice:
    """A Modbus TCP server on 127.0.0.1 serving one profile from the rack model.

    `zones` maps the profile's channels to model leak zones (default: the
    model's zones in sorted order on channels 1, 2, ...).
    """

    def __init__(self, name: str, model: RackModel, profile: Profile | str, port: int = 0, unit: int | None = None,
                 zones: dict[int, str] | None = None):
        self.name = name
        self.model = model
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        self.unit = self.profile.device.unit if unit is None else unit
        self._port = port
        with model.lock:
            default = {i + 1: z for i, z in enumerate(sorted(model.coolant.leak_zones))}
        self.zones = dict(zones) if zones is not None else default
        self.points = self.profile.expanded()
        self.bindings = load_bindings(self.profile.name)
        self._lock = threading.Lock()
        self._tables: dict[str, dict[int, int]] = {"coil": {}, "discrete": {}, "holding": {}, "input": {}}
        self._server: _Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # fault state
        self.offline = False
        self.delay_s = 0.0
        self.exception_code: int | None = None
        self.exception_remaining: int | None = None
        self.stuck: set[str] = set()
        self.sentinel: set[str] = set()
        self.requests = 0
        self.peers: dict[tuple | None, float] = {}  # client connection -> monotonic time of its last request
        self.writes: list[tuple[tuple | None, str, int, list]] = []  # (client, table, address, values) of every write
        for p in self.points:  # every mapped address exists from the start
            for k in range(p.width):
                self._tables[p.table][p.address + k] = 0
        self.update(model)

    # -- plug-in contract ---------------------------------------------------------

    @property
    def endpoint(self) -> tuple[str, int]:
        return ("127.0.0.1", self._port)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        await self._listen()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.shutdown()
            self._server = None

    def update(self, model: RackModel) -> None:
        """Refresh every served point from the model (caller holds model.lock)."""
        with model.lock:
            values = [(p, self._point_words(model, p)) for p in self.points]
        with self._lock:
            for p, words in values:
                if p.name in self.stuck:
                    continue
                for k, w in enumerate(words):
                    self._tables[p.table][p.address + k] = w

    # -- faults (called by the fault-injection API) ---------------------------------

    def set_offline(self, on: bool) -> None:
        """Offline: stop listening and drop every connection; back online: listen again on the same port."""
        self.offline = on
        if self._loop is None:
            return
        coro = self._stop_listening() if on else self._listen()
        if running_on(self._loop):
            self._loop.create_task(coro)
        else:
            asyncio.run_coroutine_threadsafe(coro, self._loop).result(5)

    def set_slow(self, ms: float) -> None:
        """Delay every answer by `ms` milliseconds (0 clears)."""
        self.delay_s = max(ms, 0) / 1000.0

    def set_exception(self, code: int | None, count: int | None = None) -> None:
        """Answer the next `count` requests (all, if None) with Modbus exception `code`; None clears."""
        self.exception_code = code
        self.exception_remaining = count

    def set_stuck(self, point: str, on: bool = True) -> None:
        """Freeze a point at its current registers (a stuck sensor)."""
        self.profile.point(point)  # raises for an unknown name
        (self.stuck.add if on else self.stuck.discard)(point)

    def set_sentinel(self, point: str, on: bool = True) -> None:
        """Serve the point's first invalid sentinel (a failed sensor)."""
        p = self.profile.point(point)
        if on and not p.invalid:
            raise ValueError(f"{self.profile.name}.{point}: the profile declares no sentinel")
        (self.sentinel.add if on else self.sentinel.discard)(point)
        self.update(self.model)

    def clear_faults(self) -> None:
        """Back to a healthy device (`sim clear`)."""
        if self.offline:
            self.set_offline(False)
        self.set_slow(0)
        self.set_exception(None)
        self.stuck.clear()
        self.sentinel.clear()

    def drop_connections(self) -> None:
        """Close every open client connection once (the server keeps listening)."""
        if self._server is None:
            return
        for conn in list(self._server.active_connections.values()):
            self.peers.pop(getattr(conn, "_peer", None), None)  # closed here: pymodbus says nothing of it
            conn.close()

    # -- internals ------------------------------------------------------------------

    async def _listen(self) -> None:
        if self._server is not None:
            return
        self._server = _Server(self, self._port)
        await self._server.serve_forever(background=True)
        if self._port == 0:
            self._port = self._server.transport.sockets[0].getsockname()[1]

    async def _stop_listening(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            await server.shutdown()

    def _zone(self, p: Point) -> str | None:
        return self.zones.get(p.channel) if p.channel is not None else None

    def _quantity(self, model: RackModel, sim: str, zone: str | None) -> float:
        head, arg = _split(sim)
        if head == "const":
            return float(arg)
        try:
            return READERS[head](model, arg, zone)
        except KeyError:
            raise ValueError(f"profile {self.profile.name}: unknown simulator quantity {sim!r}") from None

    def _point_words(self, model: RackModel, p: Point) -> list[int]:
        if p.name in self.sentinel:
            s = p.invalid[0]
            raw = float("nan") if isinstance(s, str) else float(s)
            if p.type.startswith("i") and raw >= (1 << (16 * p.width - 1)):
                raw -= 1 << (16 * p.width)
            return encode(raw, p.type, p.order)
        if p.bits:
            word = 0
            for n, quantity in self.bindings.bits.get(p.name, {}).items():
                if self._quantity(model, quantity, self._zone(p)) >= 0.5:
                    word |= 1 << n
            return [word]
        quantity = self.bindings.points.get(p.name)
        if quantity is None:
            return [0] * p.width
        base = self._quantity(model, quantity, self._zone(p))
        if p.type == "bit":
            return [1 if base >= 0.5 else 0]
        raw = (p.from_base(base) - p.offset) / p.scale
        return encode(clamp_raw(raw, p.type), p.type, p.order)

    def clients(self, within: float) -> int:
        """Open client connections that sent a request in the last `within` seconds (one that closed is gone)."""
        now = time.monotonic()
        return sum(1 for t in list(self.peers.values()) if now - t <= within)

    async def _serve(self, unit: int, fc: int, address: int, count: int, values: list | None):
        self.requests += 1
        self.peers[_PEER.get()] = time.monotonic()
        if values is not None:
            self.writes.append((_PEER.get(), TABLE_OF_FC.get(fc, "?"), address, list(values)))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.exception_code is not None:
            if self.exception_remaining is not None:
                self.exception_remaining -= 1
                if self.exception_remaining <= 0:
                    code, self.exception_code, self.exception_remaining = self.exception_code, None, None
                    return ExcCodes(code)
            return ExcCodes(self.exception_code)
        if unit != self.unit:
            return ExcCodes.GATEWAY_NO_RESPONSE
        table = TABLE_OF_FC.get(fc)
        if table is None:
            return ExcCodes.ILLEGAL_FUNCTION
        with self._lock:
            cells = self._tables[table]
            if values is None:
                if address not in cells:
                    return ExcCodes.ILLEGAL_ADDRESS
                # like most devices: a block starting at a valid address reads unused cells as 0
                return [bool(cells.get(a, 0)) if table in ("coil", "discrete") else cells.get(a, 0)
                        for a in range(address, address + count)]
            if table not in ("coil", "holding") or any(a not in cells for a in range(address, address + count)):
                return ExcCodes.ILLEGAL_ADDRESS
            words = [int(bool(v)) if table == "coil" else int(v) for v in values]
        return self._apply_write(table, address, words)

    def _apply_write(self, table: str, address: int, words: list[int]):
        targets = [p for p in self.points if p.table == table and p.address >= address
                   and p.address + p.width <= address + len(words)]
        if not targets or any(p.control is None or p.name not in self.bindings.points for p in targets):
            return ExcCodes.ILLEGAL_ADDRESS
        updates = []
        for p in targets:
            off = p.address - address
            raw = words[off] if p.type == "bit" else decode(words[off:off + p.width], p.type, p.order)
            device_value = raw * p.scale + p.offset
            if not p.control.min <= device_value <= p.control.max:
                return ExcCodes.ILLEGAL_VALUE
            head, arg = _split(self.bindings.points[p.name])
            if head not in WRITERS:
                return ExcCodes.ILLEGAL_ADDRESS
            updates.append((p, head, arg, p.to_base(device_value)))
        with self.model.lock:
            for p, head, arg, base in updates:
                WRITERS[head](self.model, arg, self._zone(p), base)
            self.model.step(0.0)
        self.update(self.model)
        return None


def reference_cdu(model: RackModel, name: str = "cdu1", port: int = 0) -> SimModbusDevice:
    """The simulator's reference CDU (profile reference-cdu)."""
    return SimModbusDevice(name, model, "reference-cdu", port)


def liebert_dcd(model: RackModel, name: str = "rdhx1", port: int = 0) -> SimModbusDevice:
    """A real-vendor map with word-swapped floats (Vertiv Liebert DCD)."""
    return SimModbusDevice(name, model, "vertiv-liebert-dcd", port)


def rle_leak_controller(model: RackModel, name: str = "leak1", port: int = 0,
                        profile: str = "rle-ld2100") -> SimModbusDevice:
    """An RLE leak controller (LD2100 multi-zone by default, LD5000 single rope)."""
    return SimModbusDevice(name, model, profile, port)
