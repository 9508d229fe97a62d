"""An NVML twin: the pynvml functions the GPU exporter calls, answered by the simulator over HTTP.

This is the agent's backend for `sources.nvml.backend: sim`, a client of
the simulator's HTTP routes, registered as the `nvml_twin` entry point
(`connect`); it imports nothing else of the simulator, so the agent's
process loads only this module of it.

The agent runs in its own process, the simulated rack in another, as a
real driver would be. The twin keeps pynvml's names, return types (real
pynvml ctypes structs where pynvml returns them) and errors (the real
`pynvml.NVMLError` subclasses, built with `pynvml.NVMLError(code)`), and
passes every constant and class through to pynvml, so the exporter cannot
tell it from the library except by what it can do.

Cache policy: `nvmlDeviceGetCount()` (the first call of every collection
cycle) fetches the node's whole GPU state in one request; other calls reuse
it while it is younger than `cache_ttl` (0.5 s), and refetch when older, so
callers that never enumerate (remediation reading a power limit) still see
live values. A set call POSTs at once and drops the cache. One cycle of
8 GPUs x 18 links is thus one HTTP round trip, not ~700.

Faults come from the model: `lost` (GPU_IS_LOST on every call), `missing`
(not enumerated), `hang_seconds` (every call on that GPU's handle blocks the
calling thread that long, or until the fault is cleared, as with one wedged
GPU; calls on other handles answer), the node's `driver_hang_s` (every call,
init, enumeration and event waits included, blocks likewise: a wedged
driver), `unsupported` (function or NVML_FI_* names that answer NotSupported).

Events: one pump thread per twin (while an event set exists) long-polls the
simulator with a long timeout and hands the XIDs to the event sets;
`nvmlEventSetWait_v2` waits on a condition for its own set, as the driver's
wait does on its file descriptor. Why: the exporter waits every half
second, and an HTTP request per wait was a tenth of the agent's CPU in the
demo, a cost no real driver has.
"""

from __future__ import annotations

import collections
import ctypes
import http.client
import inspect
import json
import math
import socket
import struct
import threading
import time
import urllib.parse
from typing import Any, Callable

import pynvml
from pynvml import NVMLError

# The simulator's NVML routes live under this prefix (sim/nvml_api.py serves them).
PREFIX = "/nvml/v1"

_UI, _ULL, _D = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, pynvml.NVML_VALUE_TYPE_DOUBLE
_NVLINK5 = pynvml.NVML_NVLINK_VERSION_5_0
_LINK_BITS_PER_S = 8e11  # an NVLink5 link: 100 GB/s per direction (the BER the twin derives from the error rate)
HANG_POLL_S = 0.25  # a simulated hang rechecks the simulator this often, so clearing the fault ends it
_SUCCESS = pynvml.NVML_SUCCESS
PUMP_WAIT_MS = 20_000  # the event pump's long poll (the simulator answers at once when an XID comes)
_SUPPORTED_EVENTS = (pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError
                     | pynvml.nvmlEventTypeSingleBitEccError)


def _field_names() -> dict[int, frozenset[str]]:
    """NVML_FI_* names per field id, so `unsupported` can name fields as pynvml spells them."""
    out: dict[int, set[str]] = collections.defaultdict(set)
    for name in dir(pynvml):
        if name.startswith("NVML_FI_"):
            out[getattr(pynvml, name)].add(name)
    return {k: frozenset(v) for k, v in out.items()}


_FIELD_NAMES = _field_names()


def _entry_formats() -> dict[int | None, str]:
    """struct formats of one c_nvmlFieldValue_t per value type (None: no value), from pynvml's own offsets.

    Field answers are packed in one struct.pack call and copied into the
    ctypes array, rather than set attribute by attribute (~1500 entries a cycle).
    """
    t = pynvml.c_nvmlFieldValue_t
    out: dict[int | None, str] = {}
    for vtype, code in ((_D, "d"), (_UI, "I4x"), (_ULL, "Q"), (None, "8x")):
        fmt, pos = "", 0
        for name, c in (("fieldId", "I"), ("scopeId", "I"), ("timestamp", "q"), ("latencyUsec", "q"),
                        ("valueType", "I"), ("nvmlReturn", "I"), ("value", code)):
            off = getattr(t, name).offset
            fmt += (f"{off - pos}x" if off > pos else "") + c
            pos = off + struct.calcsize("=" + c)
        fmt += f"{ctypes.sizeof(t) - pos}x" if ctypes.sizeof(t) > pos else ""
        assert struct.calcsize("=" + fmt) == ctypes.sizeof(t), (fmt, ctypes.sizeof(t))
        out[vtype] = fmt
    return out


_ENTRY = _entry_formats()


class TwinDevice:
    """A device handle bound to one physical (model) GPU, as an NVML handle is."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return f"<TwinDevice {self.index}>"


class TwinEventData:
    """What nvmlEventSetWait_v2 returns (the fields of c_nvmlEventData_t; `device` is a twin handle)."""

    __slots__ = ("device", "eventType", "eventData", "gpuInstanceId", "computeInstanceId")

    def __init__(self, device: TwinDevice, event_type: int, data: int):
        self.device, self.eventType, self.eventData = device, event_type, data
        self.gpuInstanceId = self.computeInstanceId = 0xFFFFFFFF


class _EventSet:
    __slots__ = ("masks", "after", "pending")

    def __init__(self, after: int):
        self.masks: dict[int, int] = {}
        self.after = after
        self.pending: collections.deque = collections.deque()


class _State:
    """One fetched node state: GPUs by model index, and the enumerated (present) ones in order."""

    __slots__ = ("at", "by_index", "present", "healthy", "driver", "cuda", "xid_seq", "driver_hang_s")

    def __init__(self, raw: dict[str, Any], at: float):
        self.at = at
        self.driver, self.cuda, self.xid_seq = raw["driver"], raw["cuda"], raw["xid_seq"]
        self.driver_hang_s = float(raw.get("driver_hang_s", 0.0))
        for g in raw["gpus"]:
            g["unsupported"] = frozenset(g["unsupported"])
            g["field_values"] = {}  # tuple(fieldIds) -> packed answer: built once per fetched state
        self.by_index = {g["index"]: g for g in raw["gpus"]}
        self.present = [g for g in raw["gpus"] if not g["missing"]]
        # GPUs every call may answer from without a fault check (not lost, missing or hung)
        self.healthy = {} if self.driver_hang_s > 0 else {
            g["index"]: g for g in self.present if not g["lost"] and g["hang_s"] <= 0}


def _err(code: int) -> NVMLError:
    return NVMLError(code)


def _not_found(name: str) -> Callable[..., Any]:
    def missing(*_: Any, **__: Any) -> Any:
        raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    missing.__name__ = name
    return missing


class NvmlTwin:
    """Drop-in for the `pynvml` module as the GPU exporter and remediation use it."""

    def __init__(self, sim_url: str, node: str, cache_ttl: float = 0.5, http_timeout: float = 5.0):
        u = urllib.parse.urlsplit(sim_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"sim_url: expected http://HOST:PORT, got {sim_url!r}")
        self._host, self._port = u.hostname, u.port or 80
        self._base = f"{PREFIX}/{urllib.parse.quote(node)}"
        self.node = node
        self._ttl = cache_ttl
        self._http_timeout = http_timeout
        self._local = threading.local()  # one keep-alive connection per calling thread
        self._state: _State | None = None
        # Bumped after every write the twin serves (a power limit, a reset): a state fetched by another thread while
        # a write was under way may predate it and is not kept as the cache, so the writer's read-back sees its
        # write, as the driver's would.
        self._writes = 0
        self._writes_lock = threading.Lock()
        self._inits = 0
        self._handles: dict[int, TwinDevice] = {}
        self._release = threading.Event()  # set by nvmlShutdown: ends simulated hangs
        self.requests = 0  # HTTP requests made (the benchmark reports it)
        # the event pump: event sets it feeds, and what waits on them
        self._events = threading.Condition()
        self._sets: list[_EventSet] = []
        self._pump: threading.Thread | None = None
        self._pump_conn: http.client.HTTPConnection | None = None
        self._pump_failed = False
        self._event_hang_s = 0.0

    def __getattr__(self, name: str) -> Any:
        """Constants, struct types and error classes are pynvml's own; functions not twinned are 'not found'."""
        value = getattr(pynvml, name)
        if inspect.isfunction(value):
            value = _not_found(name)
        self.__dict__[name] = value  # looked up once: the exporter reads constants every cycle
        return value

    # -- transport -----------------------------------------------------------------

    def _request(self, method: str, path: str, body: dict | None = None, timeout: float | None = None,
                 pump: bool = False) -> Any:
        """One request on this thread's keep-alive connection, retried once on a fresh one.

        `pump`: the event pump's long poll; its socket is connected first and
        kept where `_stop_pump` can shut it, and a poll cut short that way is
        not retried."""
        timeout = timeout or self._http_timeout
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        for attempt in (0, 1):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
            try:
                if conn.sock is not None:
                    conn.sock.settimeout(timeout)
                conn.timeout = timeout
                if pump:
                    if conn.sock is None:
                        conn.connect()
                    self._pump_conn = conn
                    if self._pump_stopping():
                        raise OSError("event pump stopping")
                conn.request(method, self._base + path, body=payload, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt or (pump and self._pump_stopping()):
                    raise _err(pynvml.NVML_ERROR_UNKNOWN) from None
                continue
            self.requests += 1
            if resp.status != 200:
                raise _err(pynvml.NVML_ERROR_UNKNOWN)
            return json.loads(data)
        raise _err(pynvml.NVML_ERROR_UNKNOWN)

    def _wrote(self) -> None:
        with self._writes_lock:
            self._writes += 1
            self._state = None

    def _fetch(self) -> _State:
        writes = self._writes
        st = _State(self._request("GET", "/state"), time.monotonic())
        with self._writes_lock:
            if self._writes == writes:
                self._state = st
        return st

    def _node(self, fresh: bool = False) -> _State:
        """The node's state; while the driver is hung, blocks as every call into a wedged driver would."""
        st = self._state
        if fresh or st is None or time.monotonic() - st.at > self._ttl:
            st = self._fetch()
        if st.driver_hang_s > 0:
            st = self._block(st.driver_hang_s, lambda s: s.driver_hang_s > 0)
        return st

    def _block(self, seconds: float, still: Callable[[_State], bool]) -> _State:
        """Block the calling thread up to `seconds`, or until the fault is cleared (or nvmlShutdown); the state after."""
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self._release.wait(min(left, HANG_POLL_S)):
                return self._fetch()
            st = self._fetch()
            if not still(st):
                return st

    def _dev(self, handle: TwinDevice, fn: str) -> dict[str, Any]:
        """The GPU's state after the fault checks every NVML call goes through."""
        st = self._state
        if self._inits and st is not None and time.monotonic() - st.at <= self._ttl:
            g = st.healthy.get(handle.index)  # the common case, ~70 calls per GPU per cycle: kept short
            if g is not None:
                if fn in g["unsupported"]:
                    raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
                return g
        if not self._inits:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        g = self._node().by_index.get(handle.index)
        if g is not None and g["hang_s"] > 0:
            index = handle.index
            g = self._block(g["hang_s"], lambda s: s.by_index.get(index, {}).get("hang_s", 0) > 0).by_index.get(index)
        if g is None or g["lost"] or g["missing"]:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        if fn in g["unsupported"]:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g

    # -- library and system ----------------------------------------------------------

    def nvmlInit(self) -> None:
        try:
            self._node(fresh=True)
        except NVMLError:
            raise _err(pynvml.NVML_ERROR_DRIVER_NOT_LOADED) from None
        self._release.clear()
        self._inits += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        if not self._inits:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        self._inits -= 1
        if not self._inits:
            self._release.set()
            self._stop_pump()
            conn = getattr(self._local, "conn", None)
            if conn is not None:
                conn.close()
                self._local.conn = None

    def _sys(self) -> _State:
        if not self._inits:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        return self._node()

    def nvmlSystemGetDriverVersion(self) -> str:
        return self._sys().driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self._sys().cuda

    nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion

    def nvmlDeviceGetCount(self) -> int:
        if not self._inits:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        return len(self._node(fresh=True).present)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> TwinDevice:
        present = self._sys().present
        if not 0 <= index < len(present):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        model_index = present[index]["index"]
        h = self._handles.get(model_index) or self._handles.setdefault(model_index, TwinDevice(model_index))
        self._dev(h, "nvmlDeviceGetHandleByIndex")
        return h

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> TwinDevice:
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for g in self._sys().present:
            if g["uuid"] == uuid:
                h = self._handles.setdefault(g["index"], TwinDevice(g["index"]))
                self._dev(h, "nvmlDeviceGetHandleByUUID")
                return h
        raise _err(pynvml.NVML_ERROR_NOT_FOUND)

    # -- identity --------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, h: TwinDevice) -> str:
        return self._dev(h, "nvmlDeviceGetUUID")["uuid"]

    def nvmlDeviceGetName(self, h: TwinDevice) -> str:
        return self._dev(h, "nvmlDeviceGetName")["name"]

    def nvmlDeviceGetSerial(self, h: TwinDevice) -> str:
        return self._dev(h, "nvmlDeviceGetSerial")["serial"]

    def nvmlDeviceGetVbiosVersion(self, h: TwinDevice) -> str:
        return self._dev(h, "nvmlDeviceGetVbiosVersion")["vbios"]

    def nvmlDeviceGetPciInfo(self, h: TwinDevice) -> Any:
        g = self._dev(h, "nvmlDeviceGetPciInfo")
        info = pynvml.nvmlPciInfo_t()
        bus = g["pci_bus_id"].encode()
        info.busId = bus
        info.busIdLegacy = bus
        parts = g["pci_bus_id"].replace(".", ":").split(":")
        info.domain, info.bus, info.device = int(parts[0], 16), int(parts[1], 16), int(parts[2], 16)
        info.pciDeviceId = 0x233010DE
        return info

    nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo

    # -- thermal and power ---------------------------------------------------------------

    def nvmlDeviceGetTemperature(self, h: TwinDevice, sensor: int) -> int:
        g = self._dev(h, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return g["temp_c"]

    def nvmlDeviceGetTemperatureV(self, h: TwinDevice, sensor: int, version: int = pynvml.nvmlTemperature_v1) -> int:
        g = self._dev(h, "nvmlDeviceGetTemperatureV")
        if version != pynvml.nvmlTemperature_v1:
            raise _err(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return g["temp_c"]

    def nvmlDeviceGetTemperatureThreshold(self, h: TwinDevice, threshold: int) -> int:
        g = self._dev(h, "nvmlDeviceGetTemperatureThreshold")
        if not 0 <= threshold < len(g["thresholds_c"]):
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g["thresholds_c"][threshold]

    def nvmlDeviceGetPowerUsage(self, h: TwinDevice) -> int:
        return self._dev(h, "nvmlDeviceGetPowerUsage")["power_mw"]

    def nvmlDeviceGetTotalEnergyConsumption(self, h: TwinDevice) -> int:
        return self._dev(h, "nvmlDeviceGetTotalEnergyConsumption")["energy_mj"]

    def nvmlDeviceGetPowerManagementLimit(self, h: TwinDevice) -> int:
        return self._dev(h, "nvmlDeviceGetPowerManagementLimit")["limit_mw"]

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: TwinDevice) -> list[int]:
        g = self._dev(h, "nvmlDeviceGetPowerManagementLimitConstraints")
        return [g["min_limit_mw"], g["max_limit_mw"]]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: TwinDevice) -> int:
        return self._dev(h, "nvmlDeviceGetPowerManagementDefaultLimit")["default_limit_mw"]

    def nvmlDeviceGetEnforcedPowerLimit(self, h: TwinDevice) -> int:
        g = self._dev(h, "nvmlDeviceGetEnforcedPowerLimit")
        return min(g["limit_mw"], g["max_limit_mw"])

    def nvmlDeviceSetPowerManagementLimit(self, h: TwinDevice, limit: int) -> None:
        self._dev(h, "nvmlDeviceSetPowerManagementLimit")
        reply = self._request("POST", f"/gpus/{h.index}/power-limit", {"limit_mw": int(limit)})
        self._wrote()
        if reply.get("ret"):
            raise _err(int(reply["ret"]))

    # -- activity and health -------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, h: TwinDevice) -> Any:
        g = self._dev(h, "nvmlDeviceGetUtilizationRates")
        return pynvml.c_nvmlUtilization_t(gpu=g["util_gpu"], memory=g["util_mem"])

    def nvmlDeviceGetMemoryInfo(self, h: TwinDevice, version: Any = None) -> Any:
        g = self._dev(h, "nvmlDeviceGetMemoryInfo")
        return pynvml.c_nvmlMemory_t(total=g["mem_total"], free=g["mem_total"] - g["mem_used"], used=g["mem_used"])

    def nvmlDeviceGetClockInfo(self, h: TwinDevice, clock: int) -> int:
        g = self._dev(h, "nvmlDeviceGetClockInfo")
        if clock in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            return g["sm_mhz"]
        if clock == pynvml.NVML_CLOCK_MEM:
            return g["mem_mhz"]
        raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: TwinDevice) -> int:
        return self._dev(h, "nvmlDeviceGetCurrentClocksEventReasons")["reasons"]

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    def nvmlDeviceGetTotalEccErrors(self, h: TwinDevice, error_type: int, counter_type: int) -> int:
        g = self._dev(h, "nvmlDeviceGetTotalEccErrors")
        if error_type not in (0, 1) or counter_type not in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if counter_type == pynvml.NVML_AGGREGATE_ECC and "ecc_aggregate" in g:
            return g["ecc_aggregate"][error_type]
        return g["ecc"][error_type]

    def nvmlDeviceGetRemappedRows(self, h: TwinDevice) -> tuple[int, int, int, int]:
        return tuple(self._dev(h, "nvmlDeviceGetRemappedRows")["remap"])  # type: ignore[return-value]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: TwinDevice) -> int:
        return self._dev(h, "nvmlDeviceGetCurrPcieLinkGeneration")["pcie"][0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: TwinDevice) -> int:
        return self._dev(h, "nvmlDeviceGetCurrPcieLinkWidth")["pcie"][1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: TwinDevice) -> int:
        return self._dev(h, "nvmlDeviceGetMaxPcieLinkGeneration")["pcie"][2]

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, h: TwinDevice) -> int:
        return self._dev(h, "nvmlDeviceGetGpuMaxPcieLinkGeneration")["pcie"][2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: TwinDevice) -> int:
        return self._dev(h, "nvmlDeviceGetMaxPcieLinkWidth")["pcie"][3]

    def nvmlDeviceGetComputeRunningProcesses(self, h: TwinDevice) -> list[Any]:
        """The GPU's compute processes as pynvml returns them (friendly objects of c_nvmlProcessInfo_v3_t)."""
        g = self._dev(h, "nvmlDeviceGetComputeRunningProcesses")
        return [pynvml.nvmlStructToFriendlyObject(pynvml.c_nvmlProcessInfo_v3_t(
            pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF))
            for pid, used in g["processes"]]

    nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses

    def gpu_reset(self, h: TwinDevice) -> None:
        """The twin's `nvidia-smi --gpu-reset -i N` (NVML has no public reset call; nvmlDeviceResetGpuLockedClocks
        only unlocks clocks): raises the NVMLError the driver answers, NVMLError_InUse while a process runs on the
        GPU, NVMLError_GpuIsLost for a GPU off the bus."""
        self._dev(h, "gpu_reset")
        reply = self._request("POST", f"/gpus/{h.index}/reset", {})
        self._wrote()
        if reply.get("ret"):
            raise _err(int(reply["ret"]))

    def nvmlDeviceGetPersistenceMode(self, h: TwinDevice) -> int:
        g = self._dev(h, "nvmlDeviceGetPersistenceMode")
        return pynvml.NVML_FEATURE_ENABLED if g["persistence"] else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetPcieReplayCounter(self, h: TwinDevice) -> int:
        return self._dev(h, "nvmlDeviceGetPcieReplayCounter")["pcie_replays"]

    # -- NVLink ------------------------------------------------------------------------

    @staticmethod
    def _link(g: dict[str, Any], link: int) -> None:
        if not 0 <= link < len(g["nvlink_up"]):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetNvLinkState(self, h: TwinDevice, link: int) -> int:
        g = self._dev(h, "nvmlDeviceGetNvLinkState")
        self._link(g, link)
        return pynvml.NVML_FEATURE_ENABLED if g["nvlink_up"][link] else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkVersion(self, h: TwinDevice, link: int) -> int:
        g = self._dev(h, "nvmlDeviceGetNvLinkVersion")
        self._link(g, link)
        return g["nvlink_version"]

    def nvmlDeviceGetNvLinkErrorCounter(self, h: TwinDevice, link: int, counter: int) -> int:
        g = self._dev(h, "nvmlDeviceGetNvLinkErrorCounter")
        self._link(g, link)
        if not 0 <= counter < pynvml.NVML_NVLINK_ERROR_COUNT:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return g["nvlink_errors"][link][counter]

    def nvmlDeviceGetFieldValues(self, h: TwinDevice, fieldIds: list) -> Any:
        """A fresh c_nvmlFieldValue_t array, as pynvml returns; the answer is packed once per fetched state."""
        g = self._dev(h, "nvmlDeviceGetFieldValues")
        key = tuple(fieldIds)
        packed = g["field_values"].get(key)
        if packed is None:
            packed = g["field_values"][key] = _pack_fields(g, key, int(time.time() * 1e6))
        return (pynvml.c_nvmlFieldValue_t * len(key)).from_buffer_copy(packed)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h: TwinDevice, link: int) -> int:
        g = self._dev(h, "nvmlDeviceGetNvLinkRemoteDeviceType")
        self._link(g, link)
        if g["nvlink_remote_type"] is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return g["nvlink_remote_type"]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h: TwinDevice, link: int) -> Any:
        """pynvml's wrapper of nvmlDeviceGetNvLinkRemotePciInfo_v2: an nvmlPciInfo_t."""
        g = self._dev(h, "nvmlDeviceGetNvLinkRemotePciInfo")
        self._link(g, link)
        if g["nvlink_remote_pci"] is None:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.nvmlPciInfo_t()
        info.busId = info.busIdLegacy = g["nvlink_remote_pci"][link].encode()
        return info

    # -- NVLink fabric -------------------------------------------------------------------

    def nvmlDeviceGetGpuFabricInfoV(self, h: TwinDevice, info: Any) -> int:
        """Fills the caller's nvmlGpuFabricInfo_v2/_v3 (passed byref, its `version` set) as the driver does: another
        version, or a struct smaller than the version says, is ARGUMENT_VERSION_MISMATCH; NotSupported without a fabric."""
        g = self._dev(h, "nvmlDeviceGetGpuFabricInfoV")
        st = _struct(info)
        version = int(st.version)
        if version not in (pynvml.nvmlGpuFabricInfo_v2, pynvml.nvmlGpuFabricInfo_v3) \
                or ctypes.sizeof(st) < version & 0xFFFFFF:
            raise _err(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        f = g["fabric"]
        _fill_fabric(st, f)
        pinned = f.get("health_mask")  # a captured GPU whose driver reported no condition: not supported
        st.healthMask = _health_mask(f["health"]) if pinned is None else pinned
        if version == pynvml.nvmlGpuFabricInfo_v3:
            st.healthSummary = _health_summary(f["health"]) if pinned is None \
                else pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED
        return _SUCCESS

    def nvmlDeviceGetGpuFabricInfo(self, h: TwinDevice, info: Any) -> int:
        """The legacy call (deprecated for the V one; CUDA 14 removes it): c_nvmlGpuFabricInfo_t, no health mask."""
        g = self._dev(h, "nvmlDeviceGetGpuFabricInfo")
        _fill_fabric(_struct(info), g["fabric"])
        return _SUCCESS

    # -- events ------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> _EventSet:
        self._sys()
        es = _EventSet(self._node(fresh=True).xid_seq)
        with self._events:
            self._sets.append(es)
            if self._pump is None:
                self._pump_failed = False
                self._pump = threading.Thread(target=self._pump_events, args=(es.after,), name="nvml-twin-events",
                                              daemon=True)
                self._pump.start()
        return es

    def _pump_events(self, after: int) -> None:
        """Long-poll the simulator's XIDs into every event set, until the sets are freed or nvmlShutdown."""
        try:
            while True:
                with self._events:
                    if not self._sets or self._release.is_set():
                        self._pump = None  # decided under the lock: a set created from now starts a new pump
                        return
                try:
                    reply = self._request("GET", f"/events?after={after}&timeout_ms={PUMP_WAIT_MS}",
                                          timeout=PUMP_WAIT_MS / 1000 + self._http_timeout, pump=True)
                except NVMLError:
                    if not self._pump_stopping():
                        with self._events:
                            self._pump_failed = True  # waits fail, as a driver wait would, until the simulator answers
                            self._events.notify_all()
                        self._release.wait(HANG_POLL_S)
                    continue
                with self._events:
                    self._pump_failed = False
                    self._event_hang_s = float(reply.get("driver_hang_s", 0.0))
                    for e in reply["events"]:
                        after = max(after, e["seq"])
                        for es in self._sets:
                            if e["seq"] > es.after:
                                es.after = e["seq"]
                                if es.masks.get(e["index"], 0) & pynvml.nvmlEventTypeXidCriticalError:
                                    es.pending.append(e)
                    self._events.notify_all()
        except BaseException:
            with self._events:
                self._pump = None
            raise
        finally:
            self._pump_conn = None
            conn = getattr(self._local, "conn", None)
            if conn is not None:
                conn.close()
                self._local.conn = None

    def _pump_stopping(self) -> bool:
        with self._events:
            return not self._sets or self._release.is_set()

    def _stop_pump(self) -> None:
        """End the pump's long poll now (it is blocked in a read) rather than when it times out."""
        conn = self._pump_conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def nvmlDeviceGetSupportedEventTypes(self, h: TwinDevice) -> int:
        self._dev(h, "nvmlDeviceGetSupportedEventTypes")
        return _SUPPORTED_EVENTS

    def nvmlDeviceRegisterEvents(self, h: TwinDevice, event_types: int, es: _EventSet) -> None:
        self._dev(h, "nvmlDeviceRegisterEvents")
        if event_types & ~_SUPPORTED_EVENTS:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        es.masks[h.index] = es.masks.get(h.index, 0) | event_types

    def nvmlEventSetWait_v2(self, es: _EventSet, timeoutms: int) -> TwinEventData:
        """Waits for the pump to deliver an XID to this set; raises NVMLError_Timeout when none came, as pynvml does."""
        if not self._inits:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)
        deadline = time.monotonic() + timeoutms / 1000
        with self._events:
            while not es.pending:
                if self._pump_failed:
                    raise _err(pynvml.NVML_ERROR_UNKNOWN)
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._events.wait(left)
            hang = self._event_hang_s
        st = self._state
        hang = max(hang, st.driver_hang_s if st is not None else 0.0)
        if hang > 0:  # a wedged driver blocks event waits too (seen by the pump's reply or the last poll's state)
            self._block(hang, lambda s: s.driver_hang_s > 0)
        with self._events:
            if not es.pending:
                raise _err(pynvml.NVML_ERROR_TIMEOUT)
            e = es.pending.popleft()
        handle = self._handles.setdefault(e["index"], TwinDevice(e["index"]))
        return TwinEventData(handle, pynvml.nvmlEventTypeXidCriticalError, e["xid"])

    nvmlEventSetWait = nvmlEventSetWait_v2

    def nvmlEventSetFree(self, es: _EventSet) -> None:
        with self._events:
            if es in self._sets:
                self._sets.remove(es)
            es.masks.clear()
            es.pending.clear()
            last = not self._sets
        if last:
            self._stop_pump()


def _struct(ref: Any) -> Any:
    """The ctypes struct behind a byref() (pynvml's fabric calls take the caller's struct by reference)."""
    return getattr(ref, "_obj", ref)


def _fill_fabric(st: Any, fabric: dict[str, Any] | None) -> None:
    if fabric is None:  # the GPU has no fabric
        raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
    uid = bytes.fromhex(fabric["cluster_uuid"].replace("-", "")) if fabric["cluster_uuid"] else bytes(16)
    ctypes.memmove(st.clusterUuid, uid, pynvml.NVML_GPU_FABRIC_UUID_LEN)
    st.status, st.cliqueId, st.state = fabric["status"], fabric["clique_id"], fabric["state"]


# healthMask conditions the simulator names -> their 2-bit field's shift (nvml.h NVML_GPU_FABRIC_HEALTH_MASK_*)
_HEALTH_SHIFTS = {"degraded_bandwidth": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW,
                  "route_recovery": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY,
                  "route_unhealthy": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY,
                  "access_timeout_recovery": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY}
FABRIC_HEALTH_CONDITIONS = tuple(_HEALTH_SHIFTS)


def _health_mask(health: list[str]) -> int:
    """Every condition the twin models reported: TRUE (1) if it holds, FALSE (2) if not."""
    mask = 0
    for cond, shift in _HEALTH_SHIFTS.items():
        mask |= (1 if cond in health else 2) << shift
    return mask


def _health_summary(health: list[str]) -> int:
    if "route_unhealthy" in health or "access_timeout_recovery" in health:
        return pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY
    if health:
        return pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY
    return pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY


def connect(sim_url: str | None, node: str) -> NvmlTwin:
    """The `nvml_twin` entry point the agent loads: node's twin at sim_url, else at the simulator found running.

    LookupError when no URL is given and no simulator runs (`probe nvml --sim` reports it).
    """
    if not sim_url:
        from sim.server import find_simulator  # only without a URL: the daemon's twin never loads the server

        sim_url = find_simulator()
    return NvmlTwin(sim_url, node)


def _pack_fields(g: dict[str, Any], field_ids: tuple, now_us: int) -> bytes:
    """The c_nvmlFieldValue_t entries answering `field_ids` (ids or (id, scopeId) pairs) for one GPU state."""
    answers: dict[int, tuple[int, int, Any, bool]] = {}  # per field id, computed once for all its links
    for want in field_ids:
        fid = want[0] if isinstance(want, tuple) else want
        if fid not in answers:
            answers[fid] = _answer(g, fid)
    nlinks = len(g["nvlink_up"])
    shape = (field_ids, nlinks, tuple((fid, a[0], a[1], a[3]) for fid, a in answers.items()))
    plan = _PACK_PLANS.get(shape)
    if plan is None:
        plan = _pack_plan(field_ids, answers, nlinks)
        if len(_PACK_PLANS) >= 256:
            _PACK_PLANS.clear()
        _PACK_PLANS[shape] = plan
    fmt, entries = plan
    args: list[Any] = []
    extend = args.extend
    for fid32, scope32, vtype, ret, fid, link in entries:
        if ret != _SUCCESS:
            extend((fid32, scope32, now_us, 0, 0, ret))
        else:
            value = answers[fid][2]
            extend((fid32, scope32, now_us, 0, vtype, 0, value if link < 0 else value[link]))
    return struct.pack(fmt, *args)


# (field ids, links, each field's return code and value type) -> the struct format and, per entry,
# (fieldId, scopeId, valueType, nvmlReturn, field, link or -1): the layout of an answer only changes
# when a field's support does, so ~190 entries per GPU are laid out once and then only filled.
_PACK_PLANS: dict[tuple, tuple[str, list[tuple[int, int, int, int, int, int]]]] = {}


def _pack_plan(field_ids: tuple, answers: dict[int, tuple[int, int, Any, bool]],
               nlinks: int) -> tuple[str, list[tuple[int, int, int, int, int, int]]]:
    fmt: list[str] = ["="]
    entries: list[tuple[int, int, int, int, int, int]] = []
    for want in field_ids:
        fid, scope = want if isinstance(want, tuple) else (want, 0)
        ret, vtype, _, per_link = answers[fid]
        link = -1
        if per_link and ret == pynvml.NVML_SUCCESS:
            if 0 <= scope < nlinks:
                link = scope
            else:
                ret = pynvml.NVML_ERROR_INVALID_ARGUMENT
        fmt.append(_ENTRY[vtype] if ret == pynvml.NVML_SUCCESS else _ENTRY[None])
        entries.append((fid & 0xFFFFFFFF, scope & 0xFFFFFFFF, vtype, ret, fid, link))
    return "".join(fmt), entries


def _answer(g: dict[str, Any], fid: int) -> tuple[int, int, Any, bool]:
    """(nvmlReturn, valueType, value, per_link) of one field for one GPU state; per_link: value is a list by link."""
    names = _FIELD_NAMES.get(fid)
    if names is not None and not names.isdisjoint(g["unsupported"]):
        return pynvml.NVML_ERROR_NOT_SUPPORTED, 0, 0, False
    getter = _DEVICE_FIELDS.get(fid)
    if getter is not None:
        vtype, value = getter(g)
        if value is None:  # the GPU has no such thing (a C2C counter without a C2C link)
            return pynvml.NVML_ERROR_NOT_SUPPORTED, 0, 0, False
        return pynvml.NVML_SUCCESS, vtype, value, False
    column = _LINK_FIELDS.get(fid)
    if column is None or (fid in _NVLINK5_FIELDS and g["nvlink_version"] < _NVLINK5):
        return pynvml.NVML_ERROR_NOT_SUPPORTED, 0, 0, False
    return pynvml.NVML_SUCCESS, *column(g), True


def _pack_ber(ratio: float) -> int:
    """A ratio packed as the driver packs fields 220/222 (NVML_NVLINK_ERROR_COUNTER_BER_GET in nvml.h).

    Bits 0-7 hold the exponent, bits 8-11 the mantissa: ratio ~= mantissa x 10^-exponent,
    one significant digit. Written from nvml.h on its own, not from the exporter's decoder,
    so a test of one against the other checks both.
    """
    if ratio <= 0:
        return 0
    exponent = math.ceil(-math.log10(ratio))  # ratio x 10^exponent lies in [1, 10)
    if ratio * 10 ** exponent < 1.5:  # 10..15 keeps a second digit where the 4 bits allow it
        exponent += 1
    exponent = max(exponent, 0)  # above 15 errors per bit cannot happen: saturate
    mantissa = min(round(ratio * 10 ** exponent), 15)
    if exponent > 0xFF:
        return 0
    return mantissa << 8 | exponent


def _ber(g: dict[str, Any], errors_per_flit_error: int) -> list[int]:
    rate = g["nvlink_error_rate"]
    return [_pack_ber(errors_per_flit_error * float(rate.get(str(link), 0.0)) / _LINK_BITS_PER_S)
            for link in range(len(g["nvlink_up"]))]


def _per_link(g: dict[str, Any], value: int = 0) -> tuple[int, list[int]]:
    return _ULL, [value] * len(g["nvlink_up"])


_DEVICE_FIELDS: dict[int, Callable[[dict], tuple[int, Any]]] = {
    pynvml.NVML_FI_DEV_MEMORY_TEMP: lambda g: (_UI, g["mem_temp_c"]),
    pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: lambda g: (_UI, g["recovery_action"]),
    pynvml.NVML_FI_DEV_POWER_INSTANT: lambda g: (_UI, g["power_mw"]),
    pynvml.NVML_FI_DEV_ENERGY: lambda g: (_ULL, g["energy_mj"]),
    pynvml.NVML_FI_DEV_C2C_LINK_ERROR_INTR: lambda g: (_ULL, g["c2c_errors"] and g["c2c_errors"][0]),
    pynvml.NVML_FI_DEV_C2C_LINK_ERROR_REPLAY: lambda g: (_ULL, g["c2c_errors"] and g["c2c_errors"][1]),
    pynvml.NVML_FI_DEV_C2C_LINK_ERROR_REPLAY_B2B: lambda g: (_ULL, g["c2c_errors"] and g["c2c_errors"][2]),
}
# Per-link fields as (valueType, value of every link). Simulated NVLink5 counters are derived from the
# model's flit-CRC counts: ~4 symbol errors per flit error.
_LINK_FIELDS: dict[int, Callable[[dict], tuple[int, list]]] = {
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: lambda g: (_ULL, [e[0] for e in g["nvlink_errors"]]),
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: lambda g: (_ULL, [e[1] for e in g["nvlink_errors"]]),
    pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC: lambda g: (_ULL, [e[2] for e in g["nvlink_errors"]]),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: lambda g: (_ULL, g["tx_kib"]),
    pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: lambda g: (_ULL, g["rx_kib"]),
    pynvml.NVML_FI_DEV_NVLINK_GET_STATE: lambda g: (_UI, [int(up) for up in g["nvlink_up"]]),
    pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS: lambda g: (_ULL, [4 * e[2] for e in g["nvlink_errors"]]),
    pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS: lambda g: (_ULL, [e[2] for e in g["nvlink_errors"]]),
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS:
        lambda g: (_ULL, [0 if up else 1 for up in g["nvlink_up"]]),
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS: lambda g: (_ULL, [e[1] for e in g["nvlink_errors"]]),
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS:
        lambda g: (_ULL, [e[1] + (0 if up else 1) for e, up in zip(g["nvlink_errors"], g["nvlink_up"])]),
    pynvml.NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS: lambda g: (_ULL, [e[3] for e in g["nvlink_errors"]]),
    pynvml.NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS: _per_link,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_BUFFER_OVERRUN_ERRORS: _per_link,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS: _per_link,
    pynvml.NVML_FI_DEV_NVLINK_COUNT_XMIT_DISCARDS: _per_link,
    # The driver answers the BER fields as an unsigned long long holding the packed mantissa and exponent.
    pynvml.NVML_FI_DEV_NVLINK_COUNT_SYMBOL_BER: lambda g: (_ULL, _ber(g, 4)),
    pynvml.NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_BER: lambda g: (_ULL, _ber(g, 1)),
}
_NVLINK5_FIELDS = frozenset(fid for fid, names in _FIELD_NAMES.items()
                            if fid in _LINK_FIELDS and any(n.startswith("NVML_FI_DEV_NVLINK_COUNT_") for n in names))
