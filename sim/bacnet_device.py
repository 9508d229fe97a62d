"""A BACnet/IP device served by legacy BACpypes (asyncore), from a BACnet profile's object list, in a process of its own.

Why legacy BACpypes and not bacpypes3: the agent's client is bacpypes3, and a
client tested only against its own library's server would share its bugs
(the encoding of a status-flags bit string, the tag of a Real). Legacy
BACpypes is a separate codebase (same author, older design) with its own
encoder, its own COV detection and its own priority arrays, so what the
client decodes was encoded by another implementation. Why a process of its
own: legacy BACpypes runs one asyncore loop with global state, deprecated in
Python 3.11 (removed in 3.12, where the `pyasyncore` backport provides it);
kept apart, neither the simulator's asyncio loop nor a test's sees it.

    python -m sim.bacnet_device --profile reference-cdu --port 47999 [--instance N] [--no-rpm] [--no-cov]

The parent drives it with one JSON object per line on stdin and reads one per line on stdout:
  in:  {"set": {point: value}}            present values in the device unit (commandable points: priority 16)
       {"status": {point: {"fault": b, "out_of_service": b, "overridden": b, "reliability": "open-loop"}}}
       {"units": {point: "degrees-fahrenheit"}}   what an analog object's `units` property says
       {"command": {point: [value, priority]}}   another writer's command (value null relinquishes)
       {"mode": "normal" | "mute" | "error"}     mute: answer nothing; error: answer every request with an Error
       {"stats": true}
  out: {"ready": port}, {"ack": n} after each line, {"stats": {...}}, and {"write": {point, value}} when a
       client's write changed a control point's present value.
It binds 127.0.0.1 only, with a /32 mask: no broadcast address, so it never sends a broadcast anywhere.
"""

from __future__ import annotations

import argparse
import asyncore
import json
import os
import sys
from collections import Counter
from typing import Any

from bacpypes.apdu import Error
from bacpypes.app import BIPSimpleApplication
from bacpypes.core import run, stop
from bacpypes.local.device import LocalDeviceObject
from bacpypes.local.object import AnalogValueCmdObject, BinaryOutputCmdObject, BinaryValueCmdObject, \
    MultiStateValueCmdObject
from bacpypes.primitivedata import Null
from bacpypes.object import AnalogInputObject, AnalogOutputObject, BinaryInputObject, MultiStateInputObject, \
    MultiStateValueObject, AnalogValueObject, BinaryValueObject
from bacpypes.service.cov import ChangeOfValueServices
from bacpypes.service.object import ReadWritePropertyMultipleServices

from exporters.cooling.bacnet.profile import ANALOG, BINARY, Point, Profile, load_profile

# Profile object type -> (legacy BACpypes class of a read-only object, of a commandable one).
CLASSES: dict[str, tuple[Any, Any]] = {
    "analog-input": (AnalogInputObject, AnalogInputObject), "analog-value": (AnalogValueObject, AnalogValueCmdObject),
    "analog-output": (AnalogOutputObject, AnalogOutputObject),
    "binary-input": (BinaryInputObject, BinaryInputObject), "binary-value": (BinaryValueObject, BinaryValueCmdObject),
    "binary-output": (BinaryOutputCmdObject, BinaryOutputCmdObject),
    "multi-state-input": (MultiStateInputObject, MultiStateInputObject),
    "multi-state-value": (MultiStateValueObject, MultiStateValueCmdObject),
}


def camel(name: str) -> str:
    """bacpypes3/standard spelling (analog-input, degrees-celsius) -> legacy BACpypes' (analogInput, degreesCelsius)."""
    head, *rest = name.split("-")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


class _Device:
    """The served objects of one profile and what the parent asked for."""

    def __init__(self, profile: Profile, app_class: type, instance: int, port: int):
        self.profile = profile
        self.mode = "normal"
        self.stats: Counter[str] = Counter()
        self.device = LocalDeviceObject(objectName=f"sim-{profile.name}", objectIdentifier=("device", instance),
                                        maxApduLengthAccepted=1476, segmentationSupported="segmentedBoth",
                                        vendorIdentifier=999, vendorName="supernode-sim", modelName=profile.model,
                                        firmwareRevision="2.14")
        self.app = app_class(self.device, f"127.0.0.1/32:{port}")
        self.app.sim = self
        self.objects: dict[str, Any] = {}
        for p in profile.points:
            self.objects[p.name] = obj = _make_object(p)
            self.app.add_object(obj)

    def apply(self, msg: dict[str, Any]) -> None:
        for name, value in (msg.get("set") or {}).items():
            self._set(self.objects[name], self.profile.point(name), value)
        for name, st in (msg.get("status") or {}).items():
            obj = self.objects[name]
            if "reliability" in st:
                obj.reliability = camel(st["reliability"])
            if "out_of_service" in st:
                obj.outOfService = bool(st["out_of_service"])
            flags = list(obj.statusFlags or [0, 0, 0, 0])
            for bit, key in ((1, "fault"), (2, "overridden"), (3, "out_of_service")):
                if key in st:
                    flags[bit] = int(bool(st[key]))
            obj.statusFlags = flags
        for name, units in (msg.get("units") or {}).items():
            self.objects[name].units = camel(units)
        for name, (value, priority) in (msg.get("command") or {}).items():
            p = self.profile.point(name)
            self.objects[name].WriteProperty("presentValue", _typed(p, value) if value is not None else Null(),
                                             priority=int(priority), direct=True)
        if "mode" in msg:
            self.mode = str(msg["mode"])

    @staticmethod
    def _set(obj: Any, p: Point, value: Any) -> None:
        typed = _typed(p, value)
        if p.control is not None:  # the device's own value: the lowest priority, any client command wins over it
            obj.WriteProperty("presentValue", typed, priority=16, direct=True)
        else:
            obj.presentValue = typed

    def written(self, name: str) -> None:
        """A client's write reached a control point: tell the parent its present value now."""
        obj = self.objects[name]
        emit({"write": {"point": name, "value": _plain(obj.presentValue)}})


def _typed(p: Point, value: Any) -> Any:
    if p.object_type in ANALOG:
        return float(value)
    if p.object_type in BINARY:
        return "active" if value else "inactive"
    return int(value)


def _plain(value: Any) -> Any:
    if value in ("active", "inactive"):
        return 1 if value == "active" else 0
    return value


def _make_object(p: Point) -> Any:
    cls = CLASSES[p.object_type][1 if p.control is not None else 0]
    kw: dict[str, Any] = dict(objectIdentifier=(camel(p.object_type), p.instance), objectName=p.name,
                              statusFlags=[0, 0, 0, 0], outOfService=False, reliability="noFaultDetected",
                              eventState="normal")
    if p.object_type in ANALOG:
        kw.update(presentValue=0.0, units=camel(p.units or "no-units"), covIncrement=0.0)
        if p.control is not None:
            kw["relinquishDefault"] = 0.0
    elif p.object_type in BINARY:
        kw.update(presentValue="inactive")
        if p.control is not None:
            kw["relinquishDefault"] = "inactive"
    else:
        kw.update(presentValue=1, numberOfStates=max(p.states or {1: 0}))
        if p.control is not None:
            kw["relinquishDefault"] = 1
    obj = cls(**kw)
    if p.object_type.endswith("output") and p.control is None:
        obj.priorityArray = obj.priorityArray  # outputs are commandable by definition
    return obj


class _Served:
    """What every served application does beyond its services: count requests, and play mute or erroring."""

    sim: _Device

    def indication(self, apdu: Any) -> None:
        self.sim.stats[type(apdu).__name__] += 1
        if self.sim.mode == "mute":
            return
        if self.sim.mode == "error" and apdu.apduType == 0:  # a confirmed request: an Error for it
            self.response(Error(errorClass="device", errorCode="operationalProblem", context=apdu))
            return
        super().indication(apdu)  # type: ignore[misc]

    def do_WritePropertyRequest(self, apdu: Any) -> None:
        super().do_WritePropertyRequest(apdu)  # type: ignore[misc]
        name = next((n for n, o in self.sim.objects.items()
                     if o.objectIdentifier == apdu.objectIdentifier), None)
        if name is not None:
            self.sim.written(name)


class FullApp(_Served, BIPSimpleApplication, ReadWritePropertyMultipleServices, ChangeOfValueServices):
    pass


class NoRpmApp(_Served, BIPSimpleApplication, ChangeOfValueServices):
    pass


class NoCovApp(_Served, BIPSimpleApplication, ReadWritePropertyMultipleServices):
    pass


def emit(msg: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(msg, default=str) + "\n")
    sys.stdout.flush()


class _Control(asyncore.file_dispatcher):
    """The parent's commands, read in the device's own loop (no thread: a change is served at once)."""

    def __init__(self, device: _Device):
        super().__init__(sys.stdin.fileno())
        self.device = device
        self.buffer = b""
        self.count = 0

    def writable(self) -> bool:
        return False

    def handle_read(self) -> None:
        chunk = self.recv(65536)
        if not chunk:  # the parent is gone: so is the device
            stop()
            self.close()
            return
        self.buffer += chunk
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            if line.strip():
                self._line(line)

    def _line(self, line: bytes) -> None:
        self.count += 1
        try:
            msg = json.loads(line)
            if msg.get("stats"):
                emit({"stats": dict(self.device.stats)})
            self.device.apply(msg)
        except Exception as exc:  # a bad command is the parent's bug: say so, keep serving
            emit({"error": f"{type(exc).__name__}: {exc}"})
        emit({"ack": self.count})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--instance", type=int, default=1001)
    ap.add_argument("--no-rpm", action="store_true", help="serve ReadProperty only (no ReadPropertyMultiple)")
    ap.add_argument("--no-cov", action="store_true", help="refuse COV subscriptions")
    args = ap.parse_args(argv)
    app_class = NoRpmApp if args.no_rpm else NoCovApp if args.no_cov else FullApp
    device = _Device(load_profile(args.profile), app_class, args.instance, args.port)
    _Control(device)
    emit({"ready": args.port, "pid": os.getpid()})
    run(spin=1.0, sigterm=None, sigusr1=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
