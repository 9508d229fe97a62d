"""GPU and NVLink collector over NVML (nvidia-ml-py, or the simulator's twin with the same names).

Why it is shaped this way:
- A hung GPU is one GPU: each GPU's reads have a time budget (`gpu_timeout`,
  exporters/gpu/nvml_lanes.py). A GPU that overruns it reads `supernode_gpu_hung 1`
  and `supernode_gpu_up 0` and is skipped until a cheap probe answers, while
  the other GPUs keep reporting fresh values in the same cycle.
- Init and enumeration run through `BlockingCaller`: a wedged driver as a
  whole stalls only this source's thread, the poll gives up after
  `call_timeout` (`SourceError("timeout")`, source down) and no new cycle
  starts until the hung call returns.
- `NotSupported` is answered once with an UNSUPPORTED reading and that
  function (or field) is never asked again for that GPU: no error storm.
- `GPU_IS_LOST`, or fewer GPUs than the inventory expects, yields
  `supernode_gpu_up 0` and nothing else for that GPU: no stale values.
- Per-link NVLink counters come in one `nvmlDeviceGetFieldValues` batch per
  GPU and each entry's own return code is checked.
- Error counters (NVLink, C2C, ECC, remapped rows, PCIe replays and link: ~85 % of a
  GB200 node's series) are read every `counters_every` cycles, as DCGM
  watches slow fields less often than power and temperature; between reads
  a cycle gives the last read's readings again, with their own timestamps,
  so a rate is never taken over a sample read twice. A GPU that missed a
  cycle (lost, hung, renumbered) reads them again at once.
- XIDs arrive on the NVML event stream, read by a dedicated thread, and are
  published on their own path (`event_stream`, store entry `nvml_events`)
  within one event wait, never only inside a poll cycle that may be hung.
This module never imports `agent` (layering): `lib` is handed in.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import math
import struct
import threading
import time
from typing import Any, Mapping

from exporters.gpu import nvml_metrics as M
from exporters.base import BlockingCaller, EventStream, HeldCounters, off_loop
from exporters.model import MetricSpec, PollResult, Quality, Reading, SourceError, make_reading
from exporters.gpu.nvml_fabric import HEALTH_FALSE, HEALTH_TRUE, FabricReader
from exporters.gpu.nvml_lanes import GpuLanes
from exporters.gpu.nvml_profile import LinkField, NvmlProfile, decode_ber, load_profile
from exporters.gpu.xid_actions import immediate_actions
from exporters.gpu.nvlink_rollup import gpu_rollups

log = logging.getLogger("exporters.gpu.nvml")

_VALUE_ATTR = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
_COUNTER_METRICS = frozenset({"errors", "bit_error_rate"})  # NVLink fields read with the error counters
_DOUBLE, _ULL = 0, 3  # NVML_VALUE_TYPE_DOUBLE, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: the types decoded from bytes
_OK = Quality.OK


def _text(v: Any) -> str:
    """pynvml returns str on Python 3 for most calls, bytes for some struct fields."""
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


_layouts: dict[type, tuple[struct.Struct, struct.Struct] | None] = {}


def _field_layout(t: Any) -> tuple[struct.Struct, struct.Struct] | None:
    """Unpackers for one c_nvmlFieldValue_t in a buffer: (valueType, nvmlReturn, value as u64) and (value as double).

    Built from the ctypes type's own field offsets, so it follows whatever
    pynvml declares; None if the layout is not the expected one (then the
    entries are read attribute by attribute).
    """
    if t in _layouts:
        return _layouts[t]
    layout = None
    try:
        vt, ret, val, size = t.valueType, t.nvmlReturn, t.value, ctypes.sizeof(t)
        if (vt.size, ret.size, val.size) == (4, 4, 8) and ret.offset == vt.offset + 4 and val.offset == ret.offset + 4:
            tail = size - val.offset - 8
            layout = (struct.Struct(f"={vt.offset}xIIQ{tail}x"), struct.Struct(f"={val.offset}xd{tail}x"))
    except (AttributeError, TypeError):
        pass
    _layouts[t] = layout
    return layout


def _field_value(fv: Any) -> float:
    get = ctypes.Structure.__getattribute__ if isinstance(fv, ctypes.Structure) else getattr
    return float(getattr(get(fv, "value"), _VALUE_ATTR.get(get(fv, "valueType"), "ullVal")))


def _field_answers(values: Any, success: int) -> list[tuple[int, float]]:
    """(nvmlReturn, value) of each entry of an nvmlDeviceGetFieldValues answer, in order.

    pynvml returns a ctypes array of c_nvmlFieldValue_t whose struct
    overrides __getattribute__ in Python (to decode bytes): ~4 reads per
    entry at ~1500 entries a cycle. The numeric fields are unpacked from the
    array's buffer in C instead; only value types other than double and
    unsigned long long (a few device fields) are read through the struct.
    The value is NaN where nvmlReturn is not `success` (the entry's value is then undefined).
    """
    layout = _field_layout(values._type_) if isinstance(values, ctypes.Array) else None
    if layout is None:
        get = ctypes.Structure.__getattribute__ if len(values) and isinstance(values[0], ctypes.Structure) else getattr
        return [(ret, _field_value(fv) if ret == success else math.nan)
                for fv in values for ret in (get(fv, "nvmlReturn"),)]
    ints, dbl = layout
    raw = bytes(values)
    return [(ret, math.nan if ret != success else float(u) if vt == _ULL else d if vt == _DOUBLE
             else _field_value(values[i]))
            for i, ((vt, ret, u), (d,)) in enumerate(zip(ints.iter_unpack(raw), dbl.iter_unpack(raw)))]


class _GpuPlan:
    """What one GPU's cycle reuses, built once per (index, uuid): label sets, the info labels,
    the field batch and the per-link calls. Keyed by index too, since every label set carries
    `gpu` (the index) and NVML renumbers GPUs when one falls off the bus."""

    __slots__ = ("labels", "info", "fields", "links")

    def __init__(self, base: dict[str, str]):
        self.labels: dict[tuple, dict[str, str]] = {(): base}  # never mutated once built
        self.info: dict[str, str] | None = None
        # (ids, fills) read every cycle and (ids, fills) of the error counters: rebuilt after a NotSupported
        self.fields: tuple[tuple[list, list], tuple[list, list]] | None = None
        self.links: list[tuple] | None = None


class _GpuCycle:
    """Readings of one GPU in one cycle; `ask` applies the NotSupported-once rule."""

    __slots__ = ("src", "uuid", "base", "out", "partial", "ts", "plan", "labels")

    def __init__(self, src: "NvmlSource", uuid: str, partial: dict[str, int], ts: float, plan: _GpuPlan):
        self.src, self.uuid, self.partial, self.ts, self.plan = src, uuid, partial, ts, plan
        self.labels = plan.labels
        self.base = plan.labels[()]
        self.out: list[Reading] = []

    def ask(self, key: str, spec: MetricSpec, fn: Any, *args: Any) -> Any:
        src = self.src
        if (self.uuid, key) in src._unsupported:
            return None
        try:
            return fn(*args)
        except src._not_supported:
            self.unsupported(key, spec)
        except src._lost:
            raise
        except src._nvml_error as e:
            self.error(key, e)
        return None

    def unsupported(self, key: str, spec: MetricSpec, labels: dict[str, str] | None = None) -> None:
        self.src._unsupported.add((self.uuid, key))
        self.out.append(Reading(spec, math.nan, labels or self.base, Quality.UNSUPPORTED, self.ts))

    def error(self, key: str, e: Exception) -> None:
        self.partial[key] = self.partial.get(key, 0) + 1
        self.src._log_once(("err", self.uuid, key), "nvml call failed gpu=%s call=%s error=%r", self.base["gpu"], key, str(e))

    def add(self, spec: MetricSpec, value: float, labels: dict[str, str] | None = None) -> None:
        self.out.append(make_reading(spec, float(value), labels or self.base, _OK, self.ts))

    def with_(self, *kv: str) -> dict[str, str]:
        """Base labels plus extra key, value pairs: with_("link", "3", "type", "replay")."""
        d = self.labels.get(kv)
        if d is None:
            d = self.labels[kv] = {**self.base, **dict(zip(kv[::2], kv[1::2]))}
        return d


class NvmlSource:
    """The `nvml` source: every GPU of this node and its NVLinks, plus XIDs from the event stream."""

    name = "nvml"

    def __init__(self, lib: Any, node_inventory_gpu_count: int, nvlinks: int, call_timeout: float,
                 xid_events: bool = True, device: str = "gpus", profile: NvmlProfile | None = None,
                 event_wait_ms: int = 500, gpu_timeout: float = 0.5, counters_every: int = 1,
                 xid_overrides: Mapping[int, str] | None = None):
        self.device = device
        self._held = HeldCounters(counters_every)  # by (index, uuid), as the plans
        self._cycle = 0
        self._lib = lib
        self._expected = node_inventory_gpu_count
        self._nvlinks = nvlinks
        self._timeout = call_timeout
        self._xid_events = xid_events
        self._event_wait_ms = event_wait_ms
        self._p = profile or load_profile()
        self._caller = BlockingCaller("nvml")
        self._lanes = GpuLanes(gpu_timeout, self._probe_gpu)
        # XIDs published on their own (once the runtime attaches a sink): see EventStream
        self.event_stream: EventStream | None = EventStream("nvml_events", device) if xid_events else None
        self._present: dict[int, str] = {}  # index -> uuid of the GPUs enumerated by the last cycle
        self._handle_uuids: dict[Any, str] = {}  # event handle -> uuid, learnt at registration
        self._hung_logged: set[int] = set()
        self._nvml_error = lib.NVMLError
        self._not_supported = lib.NVMLError_NotSupported
        self._lost = (lib.NVMLError_GpuIsLost, lib.NVMLError_GpuNotFound)
        self._timeout_error = lib.NVMLError_Timeout
        self._initialized = False
        self._temp_v = True  # cleared once the driver turns out to lack nvmlDeviceGetTemperatureV
        self._fabric = FabricReader(lib)
        self._system: tuple[str, str] = ("", "")
        self._static: dict[str, dict[str, Any]] = {}  # uuid -> facts read once
        self._plans: dict[tuple[int, str], _GpuPlan] = {}  # (index, uuid) -> what each cycle reuses
        self._uuids: dict[int, str] = {}  # index -> last uuid seen there
        self._unsupported: set[tuple[str, str]] = set()  # (uuid, call or "field:<id>")
        self._field_meaning: dict[int, Any] = {f.id: key for key, f in self._p.gpu_fields.items()}
        self._field_meaning.update({f.id: f for f in self._p.nvlink_fields})
        self._field_meaning.update({f.id: ("c2c", f.label) for f in self._p.c2c_fields})
        self._logged: set[tuple] = set()
        self._links = [str(link) for link in range(nvlinks)]
        # XID -> the catalogue's immediate action (the `action` label), read once: the config's overrides win.
        self._xid_actions: dict[int, str] = immediate_actions()
        self._xid_actions.update(xid_overrides or {})
        self._xid_lock = threading.Lock()
        self._xids: dict[str, dict[int, int]] = {}
        self._last_xid: dict[str, int] = {}
        self._xids_sent: list | None = None  # what _publish_xids published last (the same again is a keepalive)
        self._stop = threading.Event()
        self._events: threading.Thread | None = None
        self.events_ready = threading.Event()  # set once the XID thread has registered (tests wait on it)

    # -- Source protocol -------------------------------------------------------------

    async def poll(self) -> PollResult:
        return await self._caller.call(self._collect, timeout=self._timeout)

    async def close(self) -> None:
        self._stop.set()
        if self.event_stream is not None:
            self.event_stream.detach()
        events = self._events
        if events is not None:
            await off_loop(lambda: events.join(self._event_wait_ms / 1000 + 1.0), self._event_wait_ms / 1000 + 1.5,
                           "nvml-events-join")
        self._caller.shutdown()
        self._lanes.shutdown()
        if self._initialized and not self._caller.busy:
            self._initialized = False
            await off_loop(self._shutdown_quietly, 1.0, "nvml-shutdown")

    def _shutdown_quietly(self) -> None:
        try:
            self._lib.nvmlShutdown()
        except self._nvml_error:
            pass

    # -- one cycle (runs on the driver thread) -----------------------------------------

    def _collect(self) -> PollResult:
        lib = self._lib
        ts = time.time()
        self._cycle += 1
        if not self._initialized:
            try:
                lib.nvmlInit()
            except self._nvml_error as e:
                raise SourceError("driver", f"nvmlInit: {e}") from None
            self._initialized = True
            self._system = (self._safe_text(lib.nvmlSystemGetDriverVersion),
                            self._safe_text(lambda: _cuda_text(lib.nvmlSystemGetCudaDriverVersion())))
        try:
            count = lib.nvmlDeviceGetCount()
        except self._nvml_error as e:
            raise SourceError("driver", f"nvmlDeviceGetCount: {e}") from None
        readings: list[Reading] = []
        partial: dict[str, int] = {}
        results, hung = self._lanes.read(count, lambda i: self._gpu(i, ts, partial))
        for i in range(count):
            out = results.get(i)
            if out is None:  # hung: skipped this cycle
                readings += self._hung_readings(i, ts)
            elif isinstance(out, BaseException):
                raise out
            else:
                readings += out
        self._note_hung(hung)
        self._present = {i: self._uuids.get(i, "") for i in range(count)}
        for i in range(count, self._expected):
            self._log_once(("missing", i), "gpu missing against inventory gpu=%s seen=%s expected=%s", i, count, self._expected)
            readings.append(Reading(M.GPU_UP, 0.0, {"gpu": str(i), "uuid": ""}, Quality.OK, ts))
        if self._xid_events and self._events is None:
            self._events = threading.Thread(target=self._event_loop, name="nvml-events", daemon=True)
            self._events.start()
        readings += gpu_rollups(readings)  # the per-GPU NVLink families, always exported (per link: where it informs)
        return PollResult(readings, dict(partial))  # a copy: a hung GPU's late return may still count into it

    def _hung_readings(self, i: int, ts: float) -> list[Reading]:
        labels = {"gpu": str(i), "uuid": self._uuids.get(i, "")}
        return [Reading(M.GPU_UP, 0.0, labels, _OK, ts), Reading(M.GPU_HUNG, 1.0, labels, _OK, ts)]

    def _note_hung(self, hung: list[int]) -> None:
        """Log a GPU going hung, and coming back, once each (only the cycle's thread touches `_hung_logged`)."""
        for i in hung:
            if i not in self._hung_logged:
                self._hung_logged.add(i)
                log.warning("gpu hung: nvml calls exceed the per-gpu budget gpu=%s uuid=%s budget_s=%s",
                            i, self._uuids.get(i, ""), self._lanes.budget)
        for i in sorted(self._hung_logged.difference(hung)):
            self._hung_logged.discard(i)
            log.warning("gpu answers again gpu=%s uuid=%s", i, self._uuids.get(i, ""))

    def _probe_gpu(self, i: int) -> None:
        """The cheap call that says a hung GPU answers again (run on a thread of its own)."""
        lib = self._lib
        self._temperature_fn()[1](lib.nvmlDeviceGetHandleByIndex(i), lib.NVML_TEMPERATURE_GPU)

    def _safe_text(self, fn: Any) -> str:
        try:
            return _text(fn())
        except self._nvml_error:
            return ""

    def _gpu(self, i: int, ts: float, partial: dict[str, int]) -> list[Reading]:
        lib = self._lib
        try:
            h = lib.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(lib.nvmlDeviceGetUUID(h))
        except self._lost:
            return [self._lost_reading(i, ts)]
        except self._nvml_error as e:
            partial["nvmlDeviceGetHandleByIndex"] = partial.get("nvmlDeviceGetHandleByIndex", 0) + 1
            self._log_once(("handle", i), "nvml gpu unreadable gpu=%s error=%r", i, str(e))
            return [self._lost_reading(i, ts)]
        self._uuids[i] = uuid
        plan = self._plans.get((i, uuid))
        if plan is None:
            plan = self._plans[(i, uuid)] = _GpuPlan({"gpu": str(i), "uuid": uuid})
        c = _GpuCycle(self, uuid, partial, ts, plan)
        key, cycle = (i, uuid), self._cycle
        try:
            self._read_gpu(c, h, key, cycle)
        except self._lost:
            self._held.forget(key)
            self._log_once(("lost", uuid), "gpu lost gpu=%s uuid=%s", i, uuid)
            return [self._lost_reading(i, ts)]
        self._logged.discard(("lost", uuid))
        return c.out

    def _lost_reading(self, i: int, ts: float) -> Reading:
        return Reading(M.GPU_UP, 0.0, {"gpu": str(i), "uuid": self._uuids.get(i, "")}, Quality.OK, ts)

    def _read_gpu(self, c: _GpuCycle, h: Any, key: tuple[int, str], cycle: int) -> None:
        lib = self._lib
        st = self._static.get(c.uuid) or self._read_static(c, h)
        if c.plan.info is None:
            c.plan.info = {**c.base, **st["info"]}
        c.add(M.GPU_INFO, 1.0, c.plan.info)
        c.add(M.GPU_UP, 1.0)
        c.add(M.GPU_HUNG, 0.0)
        for label, value in st["thresholds"]:
            c.add(M.THRESHOLD, value, c.with_("threshold", label))
        v = self._read_temperature(c, h)
        if v is not None:
            c.add(M.TEMPERATURE, v, c.with_("sensor", "gpu"))
        v = c.ask("nvmlDeviceGetPowerUsage", M.POWER, lib.nvmlDeviceGetPowerUsage, h)
        if v is not None:
            c.add(M.POWER, v / 1000.0)
        v = c.ask("nvmlDeviceGetTotalEnergyConsumption", M.ENERGY, lib.nvmlDeviceGetTotalEnergyConsumption, h)
        if v is not None:
            c.add(M.ENERGY, v / 1000.0)
        for label, value in st["limits"]:
            c.add(M.POWER_LIMIT, value, c.with_("limit", label))
        for label, fn in (("current", lib.nvmlDeviceGetPowerManagementLimit), ("enforced", lib.nvmlDeviceGetEnforcedPowerLimit)):
            v = c.ask(fn.__name__, M.POWER_LIMIT, fn, h)
            if v is not None:
                c.add(M.POWER_LIMIT, v / 1000.0, c.with_("limit", label))
        u = c.ask("nvmlDeviceGetUtilizationRates", M.UTILIZATION, lib.nvmlDeviceGetUtilizationRates, h)
        if u is not None:
            c.add(M.UTILIZATION, u.gpu / 100.0, c.with_("engine", "gpu"))
            c.add(M.UTILIZATION, u.memory / 100.0, c.with_("engine", "memory"))
        mem = c.ask("nvmlDeviceGetMemoryInfo", M.MEMORY_USED, lib.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            c.add(M.MEMORY_USED, mem.used)
            c.add(M.MEMORY_TOTAL, mem.total)
        for label, kind in (("sm", lib.NVML_CLOCK_SM), ("memory", lib.NVML_CLOCK_MEM)):
            v = c.ask("nvmlDeviceGetClockInfo", M.CLOCK, lib.nvmlDeviceGetClockInfo, h, kind)
            if v is not None:
                c.add(M.CLOCK, v * 1e6, c.with_("clock", label))
        mask = c.ask("nvmlDeviceGetCurrentClocksEventReasons", M.CLOCK_EVENT, lib.nvmlDeviceGetCurrentClocksEventReasons, h)
        if mask is not None:
            for r in self._p.clock_event_reasons:
                c.add(M.CLOCK_EVENT, 1.0 if mask & r.id else 0.0, c.with_("reason", r.label))
        v = c.ask("nvmlDeviceGetPersistenceMode", M.PERSISTENCE, lib.nvmlDeviceGetPersistenceMode, h)
        if v is not None:
            c.add(M.PERSISTENCE, 1.0 if v == lib.NVML_FEATURE_ENABLED else 0.0)
        self._read_fields(c, h, counters=False)
        self._read_links(c, h, counters=False)
        self._read_fabric(c, h)
        if self._held.due(key, cycle):
            start = len(c.out)
            self._read_counters(c, h)
            # what answered NotSupported was said once, in this read, and is not given again
            self._held.read(key, cycle, [r for r in c.out[start:] if r.quality is not Quality.UNSUPPORTED])
        else:
            c.out += self._held.again(key, cycle)
        stream = self.event_stream
        if stream is None or not stream.attached:
            self._read_xids(c)

    def _read_counters(self, c: _GpuCycle, h: Any) -> None:
        """The error counters, every `counters_every` cycles: those that need calls of their own, then the
        batched fields and per-link counters that `_read_fields` and `_read_links` left for this part."""
        lib = self._lib
        self._read_ecc(c, h)
        rows = c.ask("nvmlDeviceGetRemappedRows", M.REMAPPED, lib.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            corr, unc, pending, failure = rows
            c.add(M.REMAPPED, corr, c.with_("kind", "correctable"))
            c.add(M.REMAPPED, unc, c.with_("kind", "uncorrectable"))
            c.add(M.REMAP_PENDING, 1.0 if pending else 0.0)
            c.add(M.REMAP_FAILURE, 1.0 if failure else 0.0)
        v = c.ask("nvmlDeviceGetPcieReplayCounter", M.PCIE_REPLAYS, lib.nvmlDeviceGetPcieReplayCounter, h)
        if v is not None:
            c.add(M.PCIE_REPLAYS, v)
        self._read_pcie_link(c, h)
        self._read_fields(c, h, counters=True)
        self._read_links(c, h, counters=True)
        self._read_remote(c, h)

    def _read_fabric(self, c: _GpuCycle, h: Any) -> None:
        """The GPU's NVLink fabric registration, every cycle: one call per GPU, and what a drained node's resume
        waits for (exporters/gpu/nvml_fabric.py). A GPU without a fabric reads state not_supported and nothing else."""
        f = c.ask("nvmlDeviceGetGpuFabricInfoV", M.FABRIC_STATE, self._fabric.read, h)
        if f is None:
            return
        states = self._p.fabric_states
        if f.state not in {s.id for s in states}:
            c.error("nvmlDeviceGetGpuFabricInfoV", ValueError(f"state: unknown NVML_GPU_FABRIC_STATE value {f.state}"))
            return
        for s in states:
            c.add(M.FABRIC_STATE, 1.0 if f.state == s.id else 0.0, c.with_("state", s.label))
        if not f.has_fabric:
            return
        c.add(M.FABRIC_STATUS, f.status)
        c.add(M.FABRIC_CLIQUE, 1.0, c.with_("cluster_uuid", f.cluster_uuid, "clique_id", str(f.clique_id)))
        for cond in self._p.fabric_health:
            v = f.condition(cond.id)
            if v in (HEALTH_TRUE, HEALTH_FALSE):  # 0 (not supported) or a value nvml.h does not define: no series
                c.add(M.FABRIC_HEALTH, 1.0 if v == HEALTH_TRUE else 0.0, c.with_("condition", cond.label))

    def _read_remote(self, c: _GpuCycle, h: Any) -> None:
        """What each NVLink reaches (remote device type, and PCI bus id where the driver gives one), with the error
        counters: it changes only when the fabric is recabled or the driver reloads, and costs two calls per link."""
        lib, unsup = self._lib, self._unsupported
        if (c.uuid, "nvmlDeviceGetNvLinkState") in unsup:
            return  # no NVLink
        types = {t.id: t.label for t in self._p.nvlink_remote_types}
        pci_key = "nvmlDeviceGetNvLinkRemotePciInfo"
        for link, s in enumerate(self._links):
            t = c.ask("nvmlDeviceGetNvLinkRemoteDeviceType", M.NVLINK_REMOTE, lib.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
            if t is None:
                if (c.uuid, "nvmlDeviceGetNvLinkRemoteDeviceType") in unsup:
                    return  # said once, with the GPU's labels
                continue
            bus = ""
            if (c.uuid, pci_key) not in unsup:
                try:
                    bus = _text(lib.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId)
                except self._not_supported:  # the remote's type is still worth its series: no reading of its own
                    unsup.add((c.uuid, pci_key))
                except self._lost:
                    raise
                except self._nvml_error as e:
                    c.error(pci_key, e)
            c.add(M.NVLINK_REMOTE, 1.0, c.with_("link", s, "remote_type", types.get(int(t), "unknown"),
                                                "remote_pci_bus_id", bus))

    def _read_pcie_link(self, c: _GpuCycle, h: Any) -> None:
        """The PCIe link's trained and maximum width and generation, with the error counters: a link trains at
        boot or reset and rarely changes, so four calls per GPU every cycle would buy nothing. The maximum is
        nvmlDeviceGetMaxPcieLinkGeneration/Width (the GPU and its slot together), not the GPU's own maximum
        (nvmlDeviceGetGpuMaxPcieLinkGeneration): a Gen5 GPU in a Gen4 slot is not downtrained."""
        lib = self._lib
        for spec, kind, fn in ((M.PCIE_WIDTH, "current", lib.nvmlDeviceGetCurrPcieLinkWidth),
                               (M.PCIE_WIDTH, "max", lib.nvmlDeviceGetMaxPcieLinkWidth),
                               (M.PCIE_GENERATION, "current", lib.nvmlDeviceGetCurrPcieLinkGeneration),
                               (M.PCIE_GENERATION, "max", lib.nvmlDeviceGetMaxPcieLinkGeneration)):
            v = c.ask(fn.__name__, spec, fn, h)
            if v is not None:
                c.add(spec, v, c.with_("kind", kind))

    def _temperature_fn(self) -> tuple[str, Any]:
        """nvmlDeviceGetTemperatureV where the library and driver have it (nvmlDeviceGetTemperature is
        deprecated in CUDA 13 and goes in 14), else the legacy call; the choice is made once per source."""
        lib = self._lib
        if self._temp_v:
            fn = getattr(lib, "nvmlDeviceGetTemperatureV", None)
            if fn is not None:
                return "nvmlDeviceGetTemperatureV", fn
            self._temp_v = False
        return "nvmlDeviceGetTemperature", lib.nvmlDeviceGetTemperature

    def _read_temperature(self, c: _GpuCycle, h: Any) -> Any:
        name, fn = self._temperature_fn()
        if name == "nvmlDeviceGetTemperatureV":
            try:
                return c.ask(name, M.TEMPERATURE, _no_function_is_absent(fn, self._lib), h, self._lib.NVML_TEMPERATURE_GPU)
            except _FunctionAbsent:
                log.info("nvmlDeviceGetTemperatureV not in this driver: using nvmlDeviceGetTemperature")
                self._temp_v = False
                name, fn = self._temperature_fn()
        return c.ask(name, M.TEMPERATURE, fn, h, self._lib.NVML_TEMPERATURE_GPU)

    def _read_static(self, c: _GpuCycle, h: Any) -> dict[str, Any]:
        """Facts that do not change while the driver is loaded: read once per GPU."""
        lib = self._lib
        txt = {}
        for key, fn in (("name", lib.nvmlDeviceGetName), ("serial", lib.nvmlDeviceGetSerial),
                        ("vbios", lib.nvmlDeviceGetVbiosVersion)):
            v = c.ask(fn.__name__, M.GPU_INFO, fn, h)
            txt[key] = _text(v) if v is not None else ""
        pci = c.ask("nvmlDeviceGetPciInfo", M.GPU_INFO, lib.nvmlDeviceGetPciInfo, h)
        driver, cuda = self._system
        info = {"name": txt["name"], "serial": txt["serial"],
                "pci_bus_id": _text(pci.busId) if pci is not None else "", "vbios": txt["vbios"],
                "driver": driver, "cuda": cuda}
        thresholds = []
        for t in self._p.temperature_thresholds:
            v = c.ask("nvmlDeviceGetTemperatureThreshold", M.THRESHOLD, lib.nvmlDeviceGetTemperatureThreshold, h, t.id)
            if v is not None:
                thresholds.append((t.label, float(v)))
        limits = []
        v = c.ask("nvmlDeviceGetPowerManagementDefaultLimit", M.POWER_LIMIT, lib.nvmlDeviceGetPowerManagementDefaultLimit, h)
        if v is not None:
            limits.append(("default", v / 1000.0))
        v = c.ask("nvmlDeviceGetPowerManagementLimitConstraints", M.POWER_LIMIT,
                  lib.nvmlDeviceGetPowerManagementLimitConstraints, h)
        if v is not None:
            limits += [("min", v[0] / 1000.0), ("max", v[1] / 1000.0)]
        st = {"info": info, "thresholds": thresholds, "limits": limits}
        self._static[c.uuid] = st
        return st

    def _read_ecc(self, c: _GpuCycle, h: Any) -> None:
        lib = self._lib
        for tlabel, etype in (("corrected", lib.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                              ("uncorrected", lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            for slabel, scope in (("volatile", lib.NVML_VOLATILE_ECC), ("aggregate", lib.NVML_AGGREGATE_ECC)):
                v = c.ask("nvmlDeviceGetTotalEccErrors", M.ECC, lib.nvmlDeviceGetTotalEccErrors, h, etype, scope)
                if v is not None:
                    c.add(M.ECC, v, c.with_("type", tlabel, "scope", slabel))

    def _field_plan(self, c: _GpuCycle) -> tuple[tuple[list, list], tuple[list, list]]:
        """The batched field ids still asked of this GPU and for each the family and labels it fills: those read
        every cycle, and the error counters' (`_read_counters`).

        Built once per GPU (and again after a field answers NotSupported), so
        a cycle does no label or lookup work per field beyond the reading itself.
        """
        plan = c.plan.fields
        if plan is None:
            unsup = self._unsupported
            ids: list = []
            fills: list = []
            for key, f in self._p.gpu_fields.items():
                if (c.uuid, f"field:{f.id}") not in unsup:
                    ids.append(f.id)
                    fills.append((M.TEMPERATURE, c.with_("sensor", "memory"), 1.0) if key == "memory_temp" else None)
            counter_ids: list = []
            counter_fills: list = []
            for f in self._p.c2c_fields:
                if (c.uuid, f"field:{f.id}") not in unsup:
                    counter_ids.append(f.id)
                    counter_fills.append((M.C2C_ERRORS, c.with_("type", f.label), 1.0))
            for f in self._p.nvlink_fields:
                if (c.uuid, f"field:{f.id}") not in unsup:
                    if f.metric in _COUNTER_METRICS:
                        self._plan_link_field(c, f, counter_ids, counter_fills)
                    else:
                        self._plan_link_field(c, f, ids, fills)
            plan = c.plan.fields = ((ids, fills), (counter_ids, counter_fills))
        return plan

    def _plan_link_field(self, c: _GpuCycle, f: LinkField, ids: list, fills: list) -> None:
        spec = M.NVLINK_BY_METRIC[f.metric]
        extra = ("kind" if f.metric == "bit_error_rate" else "type", f.label) if f.label else ()
        scale = None if f.encoding == "ber_packed" else f.scale  # None: decode_ber
        for link in range(self._nvlinks):
            ids.append((f.id, link))
            fills.append((spec, c.with_("link", self._links[link], *extra), scale))

    def _read_fields(self, c: _GpuCycle, h: Any, counters: bool) -> None:
        """One batch: the fields read every cycle, or (`counters`) the error counters' fields."""
        lib = self._lib
        ids, fills = self._field_plan(c)[1 if counters else 0]
        if not ids:
            return
        values = c.ask("nvmlDeviceGetFieldValues", M.NVLINK_ERRORS, lib.nvmlDeviceGetFieldValues, h, ids)
        if values is None:
            return
        success, not_supported, lost = lib.NVML_SUCCESS, lib.NVML_ERROR_NOT_SUPPORTED, lib.NVML_ERROR_GPU_IS_LOST
        out, ts, new = c.out, c.ts, make_reading
        dropped = False
        # NVML fills the answers in the order of the request, so the request says which field and link each is.
        for want, fill, (ret, v) in zip(ids, fills, _field_answers(values, success)):
            if ret != success:
                fid = want[0] if isinstance(want, tuple) else want
                key = f"field:{fid}"
                if ret == lost:
                    raise self._nvml_error(ret)
                if ret == not_supported:
                    if (c.uuid, key) not in self._unsupported:
                        c.unsupported(key, *self._field_spec(c, self._field_meaning.get(fid)))
                        dropped = True
                else:
                    c.error(key, self._nvml_error(ret))
                continue
            if fill is not None:
                spec, labels, scale = fill
                out.append(new(spec, decode_ber(v) if scale is None else v * scale, labels, _OK, ts))
            else:  # the recovery action, as a state set
                for a in self._p.recovery_actions:
                    c.add(M.RECOVERY, 1.0 if int(v) == a.id else 0.0, c.with_("action", a.label))
        if dropped:
            c.plan.fields = None

    @staticmethod
    def _field_spec(c: _GpuCycle, what: Any) -> tuple[MetricSpec, dict[str, str]]:
        """The family and labels an unsupported field would have filled (for its UNSUPPORTED reading)."""
        if isinstance(what, LinkField):
            extra = ("kind" if what.metric == "bit_error_rate" else "type", what.label) if what.label else ()
            return M.NVLINK_BY_METRIC[what.metric], c.with_(*extra)
        if what == "recovery_action":
            return M.RECOVERY, c.base
        if isinstance(what, tuple):  # ("c2c", type)
            return M.C2C_ERRORS, c.with_("type", what[1])
        return M.TEMPERATURE, c.with_("sensor", "memory")

    def _link_calls(self, c: _GpuCycle) -> list[tuple]:
        """(key, family, function, extra args, labels per link) of the per-link calls: built once per GPU."""
        calls = c.plan.links
        if calls is None:
            lib = self._lib
            calls = [("nvmlDeviceGetNvLinkState", M.NVLINK_UP, lib.nvmlDeviceGetNvLinkState, (),
                      [c.with_("link", s) for s in self._links])]
            calls += [(f"nvmlDeviceGetNvLinkErrorCounter:{k.label}", M.NVLINK_ERRORS,
                       lib.nvmlDeviceGetNvLinkErrorCounter, (k.id,),
                       [c.with_("link", s, "type", k.label) for s in self._links])
                      for k in self._p.nvlink_error_counters]
            c.plan.links = calls
        return calls

    def _read_links(self, c: _GpuCycle, h: Any, counters: bool) -> None:
        """Link state, or (`counters`) the per-link counters that have no scoped field (18 calls each per GPU:
        kept tight); a GPU whose link state is NotSupported has no NVLink, and no link series at all."""
        enabled = self._lib.NVML_FEATURE_ENABLED
        out, ts, new = c.out, c.ts, make_reading
        calls = self._link_calls(c)
        if counters:
            if (c.uuid, calls[0][0]) in self._unsupported:
                return
            calls = calls[1:]
        else:
            calls = calls[:1]
        for key, spec, fn, extra, labels in calls:
            if (c.uuid, key) in self._unsupported:
                if spec is M.NVLINK_UP:
                    return  # a GPU without NVLink: no link series at all
                continue
            for link, lab in enumerate(labels):
                try:
                    v = fn(h, link, *extra)
                except self._not_supported:  # said once per GPU and counter (its `type`), not per link
                    c.unsupported(key, spec, {k: v for k, v in lab.items() if k != "link"})
                    break
                except self._lost:
                    raise
                except self._nvml_error as e:
                    c.error(key, e)
                    continue
                if spec is M.NVLINK_UP:
                    v = 1.0 if v == enabled else 0.0
                out.append(new(spec, float(v), lab, _OK, ts))
            else:
                continue
            if spec is M.NVLINK_UP:
                return

    def _read_xids(self, c: _GpuCycle) -> None:
        c.out += self._xid_readings(c.base, c.ts)

    def _xid_readings(self, base: dict[str, str], ts: float) -> list[Reading]:
        uuid = base["uuid"]
        with self._xid_lock:
            counts = dict(self._xids.get(uuid, {}))
            last = self._last_xid.get(uuid, 0)
        actions = self._xid_actions
        out = [make_reading(M.XID, float(n), {**base, "xid": str(xid), "action": actions.get(xid, "unknown")}, _OK, ts)
               for xid, n in sorted(counts.items())]
        out.append(make_reading(M.LAST_XID, float(last), base, _OK, ts))
        return out

    def _publish_xids(self) -> bool:
        """Every enumerated GPU's XID counters on the event stream's own path (from the event thread).

        Readings equal to the last published ones (no XID came, no GPU came or went) are only a keepalive."""
        stream = self.event_stream
        if stream is None or not stream.attached:
            return False
        ts = time.time()
        readings: list[Reading] = []
        for i, uuid in sorted(self._present.items()):
            if uuid:
                readings += self._xid_readings({"gpu": str(i), "uuid": uuid}, ts)
        same = [(r.spec.name, tuple(r.labels.items()), r.value) for r in readings]
        if same == self._xids_sent:
            return stream.keepalive(readings)
        sent = stream.publish(readings)
        self._xids_sent = same if sent else None
        return sent

    # -- XID event stream (its own thread) ---------------------------------------------

    def _event_loop(self) -> None:
        lib = self._lib
        try:
            es = lib.nvmlEventSetCreate()
        except self._nvml_error as e:
            log.warning("nvml event set unavailable error=%r", str(e))
            if self.event_stream is not None:  # no XID series at all rather than zeros nobody counts
                self.event_stream.fail("driver", f"nvmlEventSetCreate: {e}")
            return
        try:
            self._register_events(es)
            self.events_ready.set()
            published = time.monotonic() if self._publish_xids() else -math.inf
            while not self._stop.is_set():
                got = False
                every = self.event_stream.every if self.event_stream is not None else math.inf
                # wait at most half the publishing period, so the stream's entry never goes stale between events
                wait_ms = self._event_wait_ms if math.isinf(every) else min(self._event_wait_ms, max(50, int(every * 500)))
                try:
                    d = lib.nvmlEventSetWait_v2(es, wait_ms)
                except self._timeout_error:
                    pass
                except self._nvml_error as e:
                    self._log_once(("events",), "nvml event wait failed error=%r", str(e))
                    self._stop.wait(1.0)
                    continue
                else:
                    self._logged.discard(("events",))
                    if int(d.eventType) & self._p.xid_event_mask:
                        got = self._record_xid(d)
                if (got or time.monotonic() - published >= every) and not self._stop.is_set() and self._publish_xids():
                    published = time.monotonic()
        finally:
            try:
                lib.nvmlEventSetFree(es)
            except self._nvml_error:
                pass

    def _register_events(self, es: Any) -> None:
        lib = self._lib
        want = self._p.xid_event_mask
        hung = set(self._lanes.hung())
        for i in range(lib.nvmlDeviceGetCount()):
            if i in hung:  # registering would block on it: its XIDs are missed until a restart
                log.warning("nvml xid events not registered gpu=%s error=%r", i, "gpu hung")
                continue
            try:
                h = lib.nvmlDeviceGetHandleByIndex(i)
                # an event names its GPU by handle: learn the uuid now, so a hung GPU's XID needs no NVML call
                self._handle_uuids[_handle_key(h)] = _text(lib.nvmlDeviceGetUUID(h))
                mask = lib.nvmlDeviceGetSupportedEventTypes(h) & want
                if mask:
                    lib.nvmlDeviceRegisterEvents(h, mask, es)
            except self._nvml_error as e:
                log.warning("nvml xid events not registered gpu=%s error=%r", i, str(e))

    def _record_xid(self, d: Any) -> bool:
        uuid = self._handle_uuids.get(_handle_key(d.device))
        if uuid is None:
            try:
                uuid = _text(self._lib.nvmlDeviceGetUUID(d.device))
            except self._nvml_error as e:
                log.warning("nvml xid from unidentified gpu xid=%s error=%r", int(d.eventData), str(e))
                return False
        xid = int(d.eventData)
        with self._xid_lock:
            per = self._xids.setdefault(uuid, {})
            per[xid] = per.get(xid, 0) + 1
            self._last_xid[uuid] = xid
        log.warning("gpu xid uuid=%s xid=%s", uuid, xid)
        return True

    def _log_once(self, key: tuple, msg: str, *args: Any) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(msg, *args)


class _FunctionAbsent(Exception):
    """The driver lacks the function (NVML_ERROR_FUNCTION_NOT_FOUND): not an NVML error of this GPU."""


def _no_function_is_absent(fn: Any, lib: Any) -> Any:
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except lib.NVMLError_FunctionNotFound:
            raise _FunctionAbsent() from None
    return call


def _handle_key(h: Any) -> Any:
    """What identifies a device handle: pynvml's is a ctypes pointer (a new object per event), the twin's an object."""
    try:
        return ctypes.cast(h, ctypes.c_void_p).value
    except (ctypes.ArgumentError, TypeError):
        return h


def _cuda_text(v: int) -> str:
    """nvmlSystemGetCudaDriverVersion returns 12080 for CUDA 12.8."""
    return f"{v // 1000}.{v % 1000 // 10}"


def probe_nvml(lib: Any, gpus: int = 0, nvlinks: int = 18, timeout: float = 10.0) -> str:
    """One poll against `lib` (real pynvml or a twin), as Prometheus text: what `probe nvml` prints."""
    from exporters.render import render_readings

    async def once() -> PollResult:
        src = NvmlSource(lib, gpus, nvlinks, call_timeout=timeout, xid_events=False)
        try:
            return await src.poll()
        finally:
            await src.close()

    result = asyncio.run(once())
    text = render_readings(result.readings).decode()
    notes = [f"# unsupported: {r.reading_id()}" for r in result.readings if r.quality is Quality.UNSUPPORTED]
    notes += [f"# partial error: {k} x{n}" for k, n in sorted(result.partial_errors.items())]
    return text + "".join(n + "\n" for n in notes)


def main() -> None:
    """`python -m exporters.gpu.nvml`: one poll of the real NVML, printed as Prometheus text."""
    import argparse

    import pynvml

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--nvlinks", type=int, default=18, help="NVLinks per GPU to read")
    ap.add_argument("--gpus", type=int, default=0, help="GPUs expected (0: whatever is found)")
    args = ap.parse_args()
    try:
        print(probe_nvml(pynvml, args.gpus, args.nvlinks), end="")
    except SourceError as e:
        raise SystemExit(f"nvml probe failed: kind={e.kind} {e}") from None


if __name__ == "__main__":
    main()
