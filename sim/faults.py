"""Fault kinds the simulator can inject, each a validated parameter list and a function.

Kinds register here with their parameters, so the API refuses a bad
injection with a message that names the parameter, and `sim inject --help`
lists what exists. Every kind records how to undo itself, so `sim clear`
returns the rack to nominal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from sim.server import Simulator


class FaultError(ValueError):
    """A bad injection request; the message names the parameter."""


@dataclass(frozen=True)
class Param:
    name: str
    type: type = str
    required: bool = False
    default: Any = None
    help: str = ""


@dataclass(frozen=True)
class FaultKind:
    name: str
    help: str
    apply: Callable[["Simulator", dict[str, Any]], str]
    params: tuple[Param, ...] = field(default_factory=tuple)

    def parse(self, raw: dict[str, Any]) -> dict[str, Any]:
        known = {p.name for p in self.params}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise FaultError(f"{self.name}: unknown parameter(s) {', '.join(unknown)}; "
                             f"expected {', '.join(sorted(known)) or 'none'}")
        out: dict[str, Any] = {}
        for p in self.params:
            if p.name not in raw or raw[p.name] is None:
                if p.required:
                    raise FaultError(f"{self.name}: parameter {p.name!r} is required ({p.help})")
                out[p.name] = p.default
                continue
            try:
                out[p.name] = p.type(raw[p.name])
            except (TypeError, ValueError):
                raise FaultError(f"{self.name}: parameter {p.name!r} expects {p.type.__name__}, "
                                 f"got {raw[p.name]!r}") from None
        return out


REGISTRY: dict[str, FaultKind] = {}


def as_bool(value: Any) -> bool:
    text = str(value).lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


def fault(name: str, help: str, *params: Param) -> Callable[[Callable[["Simulator", dict[str, Any]], str]], Callable]:
    def deco(fn: Callable[["Simulator", dict[str, Any]], str]) -> Callable:
        REGISTRY[name] = FaultKind(name, help, fn, tuple(params))
        return fn
    return deco


NODE = Param("node", str, False, None, "node name (default: the first node)")
GPU = Param("gpu", int, False, 0, "GPU index")


def _gpu(sim: "Simulator", p: dict[str, Any]):
    node = p.get("node") or next(iter(sim.model.nodes))
    if node not in sim.model.nodes:
        raise FaultError(f"node: {node!r} is not a simulated node ({', '.join(sim.model.nodes)})")
    gpus = sim.model.nodes[node].gpus
    idx = p.get("gpu", 0) or 0
    if not 0 <= idx < len(gpus):
        raise FaultError(f"gpu: {idx} out of range 0..{len(gpus) - 1}")
    return gpus[idx]


@fault("gpu-lost", "GPU falls off the bus: every NVML call on it answers GPU_IS_LOST.", NODE, GPU)
def _gpu_lost(sim: "Simulator", p: dict[str, Any]) -> str:
    from sim.nvml_faults import set_lost

    g = _gpu(sim, p)
    return set_lost(sim.model, g.node, g.index, True)


@fault("xid", "Raise an XID event on a GPU, by its entry in NVIDIA's XID catalogue for the GPU's architecture.",
       NODE, GPU, Param("code", int, True, None, "XID number (one the catalogue lists for this GPU model)"),
       Param("sticky", as_bool, False, False,
             "the hardware holds the fault until its recovery: a RESET_GPU-class XID (or 48) until gpu-reset, "
             "RESTART_BM (79: the GPU falls off the bus) until reboot; NVML's recovery action says which"),
       Param("recurs", as_bool, False, False,
             "with --sticky, a reset-class fault a GPU reset does not fix: the XID comes again right after each "
             "reset, only a reboot clears it"))
def _xid(sim: "Simulator", p: dict[str, Any]) -> str:
    from sim.nvml_faults import raise_catalogued_xid

    g = _gpu(sim, p)
    try:
        return raise_catalogued_xid(sim.model, g.node, g.index, p["code"], p["sticky"], p["recurs"])
    except ValueError as exc:
        raise FaultError(f"xid: {exc}") from None


@fault("gpu-reset", "Reset one GPU as `nvidia-smi --gpu-reset -i N` does: refused while a process runs on it "
       "(workload above idle) or when it is off the bus; clears RESET_GPU-class faults and pending row remaps, "
       "not RESTART_BM-class ones.", NODE, GPU)
def _gpu_reset(sim: "Simulator", p: dict[str, Any]) -> str:
    from sim.nvml_faults import RecoveryRefused, gpu_reset

    g = _gpu(sim, p)
    try:
        return gpu_reset(sim.model, g.node, g.index)
    except RecoveryRefused as exc:
        raise FaultError(f"gpu-reset refused: {exc}") from None


@fault("reboot", "The node reboots (what Slurm's RebootProgram asks for): every GPU fault a power cycle clears is "
       "cleared, and the node gets a new boot id and boot time (`supernode-sim state`).",
       Param("node", str, True, None, "node name"))
def _reboot(sim: "Simulator", p: dict[str, Any]) -> str:
    from sim.nvml_faults import reboot_node

    return reboot_node(sim.model, _gpu(sim, p).node)


@fault("row-remap", "An HBM row remap as nvmlDeviceGetRemappedRows reports it: pending (applied at the next GPU "
       "reset) or failed (no spare row: the GPU needs service).", NODE, GPU,
       Param("state", str, True, None, "pending or failed"))
def _row_remap(sim: "Simulator", p: dict[str, Any]) -> str:
    from sim.nvml_faults import set_row_remap

    g = _gpu(sim, p)
    try:
        return set_row_remap(sim.model, g.node, g.index, p["state"])
    except ValueError as exc:
        raise FaultError(f"row-remap: {exc}") from None


@fault("pcie-downtrain", "The GPU's PCIe link trains below its maximum width and/or generation (survives resets "
       "and reboots; `sim clear` ends it).", NODE, GPU,
       Param("width", int, False, None, "lanes (1, 2, 4, 8, 16; default: the maximum)"),
       Param("gen", int, False, None, "PCIe generation (default: the maximum)"))
def _pcie_downtrain(sim: "Simulator", p: dict[str, Any]) -> str:
    from sim.nvml_faults import set_pcie_link

    g = _gpu(sim, p)
    try:
        return set_pcie_link(sim.model, g.node, g.index, p["width"], p["gen"])
    except ValueError as exc:
        raise FaultError(f"pcie-downtrain: {exc}") from None


@fault("clock-slowdown", "The GPU holds its SM clock down, reporting an NVML clock-event reason (hw_slowdown, "
       "hw_power_brake) or none (a straggler nothing explains); `sim clear` ends it.", NODE, GPU,
       Param("reason", str, False, "hw_slowdown", "hw_slowdown, hw_power_brake or none"),
       Param("ratio", float, False, 0.5, "share of its SM clock the GPU keeps"))
def _clock_slowdown(sim: "Simulator", p: dict[str, Any]) -> str:
    from sim.nvml_faults import set_clock_slowdown

    g = _gpu(sim, p)
    try:
        return set_clock_slowdown(sim.model, g.node, g.index, p["reason"], p["ratio"])
    except ValueError as exc:
        raise FaultError(f"clock-slowdown: {exc}") from None


@fault("nvlink-errors", "NVLink CRC/replay errors at a rate (per second) on one link.", NODE, GPU,
       Param("link", int, False, 0, "NVLink index"), Param("rate", float, False, 100.0, "errors per second"))
def _nvlink(sim: "Simulator", p: dict[str, Any]) -> str:
    with sim.model.lock:
        g = _gpu(sim, p)
        if not 0 <= p["link"] < g.nvlink_count:
            raise FaultError(f"link: {p['link']} out of range 0..{g.nvlink_count - 1}")
        g.nvlink_error_rate[p["link"]] = p["rate"]
    return f"{g.node} gpu {g.index} link {p['link']} errors {p['rate']}/s"


@fault("fabric-state", "The GPU's NVLink fabric registration (nvmlDeviceGetGpuFabricInfoV) reads this state, status "
       "and health-mask conditions (GB200 only: an H100 has no fabric); `sim clear` puts it back on the fabric.",
       NODE, GPU, Param("state", str, True, None, "not_started, in_progress or completed"),
       Param("status", int, False, 0, "the registration's nvmlReturn_t (0: success)"),
       Param("health", str, False, "", "comma-separated conditions that hold: degraded_bandwidth, route_recovery, "
             "route_unhealthy, access_timeout_recovery"))
def _fabric_state(sim: "Simulator", p: dict[str, Any]) -> str:
    from sim.nvml_faults import set_fabric_state

    g = _gpu(sim, p)
    health = [c.strip() for c in p["health"].split(",") if c.strip()]
    try:
        return set_fabric_state(sim.model, g.node, g.index, p["state"], p["status"], health)
    except ValueError as exc:
        raise FaultError(f"fabric-state: {exc}") from None


@fault("thermal", "Blocked cold plate: the GPU runs this much hotter (default: into HW slowdown).", NODE, GPU,
       Param("celsius", float, False, 30.0, "extra degrees"))
def _thermal(sim: "Simulator", p: dict[str, Any]) -> str:
    with sim.model.lock:
        g = _gpu(sim, p)
        g.thermal_extra_c = p["celsius"]
    return f"{g.node} gpu {g.index} +{p['celsius']} C"


@fault("gpu-hang", "NVML calls on this GPU's handle block, other GPUs answer (one wedged GPU).", NODE, GPU,
       Param("seconds", float, False, 30.0, "how long each call blocks at most (sim clear ends it at once)"))
def _hang(sim: "Simulator", p: dict[str, Any]) -> str:
    from sim.nvml_faults import set_hang

    g = _gpu(sim, p)
    return set_hang(sim.model, g.node, g.index, p["seconds"])


@fault("nvml-driver-hang", "Every NVML call on the node blocks: init, enumeration, every GPU, events (a wedged driver).",
       NODE, Param("seconds", float, False, 30.0, "how long each call blocks at most (sim clear ends it at once)"))
def _driver_hang(sim: "Simulator", p: dict[str, Any]) -> str:
    from sim.nvml_faults import set_driver_hang

    return set_driver_hang(sim.model, _gpu(sim, p).node, p["seconds"])


@fault("workload", "Set the GPU workload (fraction of the default power limit the job would draw).", NODE,
       Param("gpu", int, False, None, "GPU index (default: all GPUs of the node, or of the rack without --node)"),
       Param("ratio", float, True, None, "0..1"))
def _workload(sim: "Simulator", p: dict[str, Any]) -> str:
    if not 0.0 <= p["ratio"] <= 1.0:
        raise FaultError("ratio: expected 0..1")
    with sim.model.lock:
        nodes = [p["node"]] if p["node"] else list(sim.model.nodes)
        for n in nodes:
            if n not in sim.model.nodes:
                raise FaultError(f"node: {n!r} is not a simulated node")
            for g in sim.model.nodes[n].gpus:
                if p["gpu"] is None or g.index == p["gpu"]:
                    g.workload = p["ratio"]
    return f"workload {p['ratio']}"


# -- links (one simulated sysfs tree per node) ---------------------------------------

PORT = Param("port", str, True, None, "port name (mlx5_0/1, eth0, ...)")


def _tree(sim: "Simulator", p: dict[str, Any]):
    from sim.device_set import link_tree

    node = p.get("node") or next(iter(sim.model.nodes))
    return node, link_tree(sim, node)


def _port_call(fn: Callable[[], None]) -> None:
    try:
        fn()
    except (ValueError, KeyError) as exc:
        raise FaultError(str(exc).strip("'\"")) from None


@fault("optic-degrade", "Receive power of a port's module drops to this level (dBm).", NODE, PORT,
       Param("rx_dbm", float, True, None, "receive power in dBm, e.g. -12"))
def _optic(sim: "Simulator", p: dict[str, Any]) -> str:
    node, tree = _tree(sim, p)
    _port_call(lambda: tree.optic_degrade(p["port"], p["rx_dbm"]))
    return f"{node} {p['port']} rx {p['rx_dbm']} dBm"


@fault("link-flap", "The port goes down and up COUNT times between two polls.", NODE, PORT,
       Param("count", int, False, 1, "number of down/up cycles"))
def _flap(sim: "Simulator", p: dict[str, Any]) -> str:
    node, tree = _tree(sim, p)
    _port_call(lambda: tree.link_flap(p["port"], p["count"]))
    return f"{node} {p['port']} flapped {p['count']}x"


@fault("ib-errors", "An IB error counter grows at RATE per second.", NODE, PORT,
       Param("counter", str, False, "symbol_error", "counter name (symbol_error, link_downed, ...)"),
       Param("rate", float, False, 10.0, "per second"))
def _ib_errors(sim: "Simulator", p: dict[str, Any]) -> str:
    node, tree = _tree(sim, p)
    _port_call(lambda: tree.ib_errors(p["port"], p["counter"], p["rate"]))
    return f"{node} {p['port']} {p['counter']} +{p['rate']}/s"


@fault("link-down", "Take a port down (or up again with --up true).", NODE, PORT,
       Param("up", as_bool, False, False, "true to bring it back up"))
def _link_down(sim: "Simulator", p: dict[str, Any]) -> str:
    node, tree = _tree(sim, p)
    _port_call(lambda: tree.set_link(p["port"], p["up"]))
    return f"{node} {p['port']} {'up' if p['up'] else 'down'}"


# -- more GPU faults (see sim/nvml_faults.py) ----------------------------------


@fault("gpu-missing", "GPU not enumerated at all (fewer GPUs than the inventory expects).", NODE, GPU)
def _gpu_missing(sim: "Simulator", p: dict[str, Any]) -> str:
    from sim.nvml_faults import set_missing

    g = _gpu(sim, p)
    return set_missing(sim.model, g.node, g.index, True)


@fault("nvml-unsupported", "NVML answers NotSupported for these functions or NVML_FI_* fields.", NODE, GPU,
       Param("names", str, True, None, "comma-separated pynvml function or field names"))
def _unsupported(sim: "Simulator", p: dict[str, Any]) -> str:
    from sim.nvml_faults import set_unsupported

    g = _gpu(sim, p)
    return set_unsupported(sim.model, g.node, g.index, [n.strip() for n in p["names"].split(",") if n.strip()])


@fault("nvlink-down", "One NVLink goes down.", NODE, GPU, Param("link", int, False, 0, "NVLink index"))
def _nvlink_down(sim: "Simulator", p: dict[str, Any]) -> str:
    from sim.nvml_faults import set_nvlink_down

    g = _gpu(sim, p)
    try:
        return set_nvlink_down(sim.model, g.node, g.index, p["link"], True)
    except ValueError as exc:
        raise FaultError(f"nvlink-down: {exc}") from None


@fault("nvswitch-down", "NVSwitch chip K fails: NVLink K goes down on every GPU of the rack (GB200 NVL72: link k "
       "of each GPU reaches chip k).", Param("switch", int, True, None, "NVSwitch chip index (0..17 on GB200)"))
def _nvswitch_down(sim: "Simulator", p: dict[str, Any]) -> str:
    from sim.nvml_faults import set_switch_down

    try:
        return set_switch_down(sim.model, p["switch"])
    except ValueError as exc:
        raise FaultError(f"nvswitch-down: {exc}") from None


@fault("recovery-action", "The driver asks for a recovery action (NVML_GPU_RECOVERY_ACTION_*).", NODE, GPU,
       Param("action", int, True, None, "0 none, 1 gpu_reset, 2 node_reboot, 3 drain_p2p, 4 drain_and_reset"))
def _recovery(sim: "Simulator", p: dict[str, Any]) -> str:
    from sim.nvml_faults import set_recovery_action

    g = _gpu(sim, p)
    return set_recovery_action(sim.model, g.node, g.index, p["action"])


# -- coolant and leak (the rack model) and the Modbus devices -------------------------

ZONE = Param("zone", str, True, None, "leak zone name")
DEVICE = Param("device", str, False, None, "simulated Modbus device (default cdu1)")


def _zone(sim: "Simulator", p: dict[str, Any]) -> str:
    if p["zone"] not in sim.model.coolant.leak_zones:
        raise FaultError(f"zone: {p['zone']!r} is not a leak zone ({', '.join(sorted(sim.model.coolant.leak_zones))})")
    return p["zone"]


@fault("leak", "A leak sensor in the zone gets wet.", ZONE)
def _leak(sim: "Simulator", p: dict[str, Any]) -> str:
    with sim.model.lock:
        sim.model.coolant.leak_zones[_zone(sim, p)] = "wet"
    return f"leak in {p['zone']}"


@fault("leak-cable-break", "The zone's sensing cable breaks (a sensor fault, never a leak).", ZONE)
def _cable(sim: "Simulator", p: dict[str, Any]) -> str:
    with sim.model.lock:
        sim.model.coolant.leak_zones[_zone(sim, p)] = "cable_break"
    return f"cable break in {p['zone']}"


CDU = Param("cdu", str, False, None, "simulated CDU (Modbus cdu1 or Redfish rfcdu1: both show the rack's one loop)")


def _cdu(sim: "Simulator", p: dict[str, Any]) -> str:
    """The CDU named (default: the first): every simulated CDU shows the rack model's one secondary loop."""
    from sim.modbus_devices import SimModbusDevice
    from sim.redfish.cdu import RedfishCdu
    from sim.snmp_cdu import SimSnmpCdu

    cdus = sorted(n for n, d in sim.devices.items() if isinstance(d, (RedfishCdu, SimSnmpCdu))
                  or (isinstance(d, SimModbusDevice) and not n.startswith("leak")))
    name = p.get("cdu") or (cdus[0] if cdus else "")
    if cdus and name not in cdus:
        raise FaultError(f"cdu: {name!r} is not a simulated CDU ({', '.join(cdus)})")
    return name


@fault("pump-fail", "A CDU pump stops, or (--speed) runs at only that share of its set speed.",
       CDU, Param("pump", int, False, 1, "pump number (1-based)"),
       Param("speed", float, False, 0.0, "share of its set speed the pump still reaches, 0..1 (0: stopped)"))
def _pump(sim: "Simulator", p: dict[str, Any]) -> str:
    c = sim.model.coolant
    cdu = _cdu(sim, p)
    if not 0 <= p["speed"] < 1:
        raise FaultError(f"speed: {p['speed']} out of range 0..1 (1 is a healthy pump)")
    with sim.model.lock:
        if not 1 <= p["pump"] <= len(c.pump_running):
            raise FaultError(f"pump: {p['pump']} out of range 1..{len(c.pump_running)}")
        if p["speed"] == 0:
            c.pump_running[p["pump"] - 1] = False
        else:
            c.pump_wear[p["pump"] - 1] = p["speed"]
    if p["speed"] == 0:
        return f"{cdu} pump {p['pump']} failed"
    return f"{cdu} pump {p['pump']} at {p['speed']:.0%} of its set speed"


@fault("filter-clogging", "The CDU's strainer clogs: its pressure drop rises by RATE Pa/s, the loop's flow falls "
       "(the pump's head is spent across it), return temperature and GPU temperatures rise.", CDU,
       Param("rate", float, False, 2000.0, "rise of the filter pressure drop, Pa per second"))
def _filter(sim: "Simulator", p: dict[str, Any]) -> str:
    cdu = _cdu(sim, p)
    if p["rate"] <= 0:
        raise FaultError(f"rate: {p['rate']} must be above 0 Pa/s")
    with sim.model.lock:
        sim.model.coolant.filter_clog_rate_pa_s = p["rate"]
    return f"{cdu} filter clogging at {p['rate']:g} Pa/s"


@fault("flow-drop", "Secondary coolant flow drops by PERCENT.", Param("percent", float, True, None, "0..100"))
def _flow(sim: "Simulator", p: dict[str, Any]) -> str:
    if not 0 <= p["percent"] <= 100:
        raise FaultError("percent: expected 0..100")
    with sim.model.lock:
        sim.model.coolant.flow_factor = 1 - p["percent"] / 100
    return f"flow -{p['percent']}%"


@fault("supply-hot", "Secondary supply runs hotter by CELSIUS (facility water too warm).",
       Param("celsius", float, True, None, "extra degrees"))
def _supply_hot(sim: "Simulator", p: dict[str, Any]) -> str:
    with sim.model.lock:
        sim.model.coolant.supply_hot_extra_c = p["celsius"]
    return f"supply +{p['celsius']} C"


def _modbus(sim: "Simulator", p: dict[str, Any]) -> Any:
    from sim.device_set import modbus_device

    return modbus_device(sim, p.get("device"))


@fault("sensor-stuck", "A CDU point stops updating (frozen value).", DEVICE,
       Param("point", str, True, None, "profile point name"))
def _stuck(sim: "Simulator", p: dict[str, Any]) -> str:
    dev = _modbus(sim, p)
    _port_call(lambda: dev.set_stuck(p["point"]))
    return f"{dev.name}.{p['point']} stuck"


@fault("sensor-sentinel", "A CDU point serves its invalid sentinel (e.g. 0x7FFF).", DEVICE,
       Param("point", str, True, None, "profile point name"))
def _sentinel(sim: "Simulator", p: dict[str, Any]) -> str:
    dev = _modbus(sim, p)
    _port_call(lambda: dev.set_sentinel(p["point"]))
    return f"{dev.name}.{p['point']} sentinel"


@fault("cdu-offline", "The Modbus device (connections closed) or the SNMP CDU stops answering.", DEVICE)
def _offline(sim: "Simulator", p: dict[str, Any]) -> str:
    from sim.snmp_cdu import SimSnmpCdu

    dev = sim.devices.get(p.get("device") or "cdu1")
    if not isinstance(dev, SimSnmpCdu):
        dev = _modbus(sim, p)
    dev.set_offline(True)
    return f"{dev.name} offline"


@fault("cdu-slow", "The Modbus device answers after a delay.", DEVICE, Param("ms", float, True, None, "delay in ms"))
def _slow(sim: "Simulator", p: dict[str, Any]) -> str:
    dev = _modbus(sim, p)
    dev.set_slow(p["ms"])
    return f"{dev.name} +{p['ms']} ms"


@fault("cdu-exception", "The Modbus device answers with exception CODE (6 busy, 11 gateway target failed).",
       DEVICE, Param("code", int, True, None, "Modbus exception code"))
def _exception(sim: "Simulator", p: dict[str, Any]) -> str:
    dev = _modbus(sim, p)
    dev.set_exception(p["code"])
    return f"{dev.name} exception {p['code']}"


# -- PDU (SNMP) ------------------------------------------------------------------------

PDU = Param("pdu", str, False, "pdu-a", "simulated PDU")


def _pdu(sim: "Simulator", p: dict[str, Any]) -> Any:
    from sim.snmp_pdu import SimulatedRaritanPdu

    dev = sim.devices.get(p["pdu"])
    if not isinstance(dev, SimulatedRaritanPdu):
        raise FaultError(f"pdu: {p['pdu']!r} is not a simulated PDU")
    return dev


@fault("pdu-offline", "The PDU stops answering SNMP.", PDU)
def _pdu_offline(sim: "Simulator", p: dict[str, Any]) -> str:
    _pdu(sim, p).set_offline(True)
    return f"{p['pdu']} offline"


@fault("pdu-counter-wrap", "The PDU's energy counters jump to just below 2^32 and wrap.", PDU)
def _wrap(sim: "Simulator", p: dict[str, Any]) -> str:
    _pdu(sim, p).counter_wrap()
    return f"{p['pdu']} energy counters near wrap"


@fault("pdu-counter-reset", "The PDU's energy counters are reset to 0 (as a user reset does).", PDU)
def _reset(sim: "Simulator", p: dict[str, Any]) -> str:
    _pdu(sim, p).counter_reset()
    return f"{p['pdu']} energy counters reset"


@fault("outlet-trip", "An outlet switches off by itself (breaker trip).", PDU,
       Param("outlet", int, True, None, "outlet number"))
def _trip(sim: "Simulator", p: dict[str, Any]) -> str:
    dev = _pdu(sim, p)
    _port_call(lambda: dev.trip_outlet(p["outlet"]))
    return f"{p['pdu']} outlet {p['outlet']} tripped"


# -- Redfish (tray BMCs and the Redfish CDU) -------------------------------------------

BMC = Param("node", str, False, None, "node whose tray BMC (default: the first node), or a Redfish service (rfcdu1)")
DETECTOR = Param("detector", str, False, "0", "leak detector Id, or its position (default 0: the first)")


def _bmc(sim: "Simulator", p: dict[str, Any]) -> Any:
    from sim.device_set import redfish_service

    return redfish_service(sim, p.get("node"))


def _detector(sim: "Simulator", p: dict[str, Any]) -> tuple[Any, str, dict[str, str]]:
    """The service, the detector Id and the model's leak-state dict the detector reads."""
    dev = _bmc(sim, p)
    if dev.leaks is None:
        raise FaultError(f"node: {dev.name!r} has no leak detectors")
    try:
        det = dev.leaks.resolve(p["detector"])
    except ValueError as exc:
        raise FaultError(f"{exc} ({dev.name})") from None
    return dev, det, dev.leaks.states()


@fault("tray-leak", "A moisture detector of a tray (its BMC's Chassis_0) sees water: Critical, an event at once.",
       BMC, DETECTOR, Param("level", str, False, "critical", "critical or warning"))
def _tray_leak(sim: "Simulator", p: dict[str, Any]) -> str:
    if p["level"] not in ("critical", "warning"):
        raise FaultError("level: expected critical or warning")
    with sim.model.lock:
        dev, det, states = _detector(sim, p)
        states[det] = p["level"]
    return f"{dev.name} {det} {p['level']}"


@fault("tray-leak-sensor-fault", "A tray leak detector fails (DetectorState unknown, Health Warning, a Condition): never a leak.",
       BMC, DETECTOR)
def _tray_sensor_fault(sim: "Simulator", p: dict[str, Any]) -> str:
    with sim.model.lock:
        dev, det, states = _detector(sim, p)
        states[det] = "sensor_fault"
    return f"{dev.name} {det} sensor fault"


@fault("switch-tray-leak", "A moisture detector of an NVLink switch tray (its BMC's Chassis_0) sees water: a leak "
       "in the switch tray's zone.",
       Param("tray", str, True, None, "switch tray (switch01...)"), DETECTOR,
       Param("level", str, False, "critical", "critical or warning"))
def _switch_tray_leak(sim: "Simulator", p: dict[str, Any]) -> str:
    if p["level"] not in ("critical", "warning"):
        raise FaultError("level: expected critical or warning")
    trays = sim.model.switch_trays
    if p["tray"] not in trays:
        raise FaultError(f"tray: {p['tray']!r} is not a simulated switch tray ({', '.join(trays) or 'none'})")
    with sim.model.lock:
        dev, det, states = _detector(sim, {**p, "node": f"bmc-{p['tray']}"})
        states[det] = p["level"]
    return f"{dev.name} {det} {p['level']} (zone {trays[p['tray']].zone})"


@fault("bmc-offline", "The Redfish service stops answering: open connections close, new ones are refused.", BMC)
def _bmc_offline(sim: "Simulator", p: dict[str, Any]) -> str:
    dev = _bmc(sim, p)
    dev.set_offline(True)
    return f"{dev.name} offline"


@fault("bmc-slow", "The Redfish service answers every request after a delay.", BMC,
       Param("ms", float, True, None, "delay in ms"))
def _bmc_slow(sim: "Simulator", p: dict[str, Any]) -> str:
    dev = _bmc(sim, p)
    dev.set_slow(p["ms"])
    return f"{dev.name} +{p['ms']} ms"


@fault("bmc-auth-fail", "The Redfish service refuses every credential with 401: session login, tokens and Basic.", BMC)
def _bmc_auth(sim: "Simulator", p: dict[str, Any]) -> str:
    dev = _bmc(sim, p)
    dev.set_auth_fail(True)
    return f"{dev.name} refuses credentials"


@fault("bmc-events-held", "The Redfish service's EventService is not ready (as on a BMC still starting it): an SSE "
       "request gets no answer and a push subscription a 503, until --held 0 or `sim clear`; polling still answers.",
       BMC, Param("held", int, False, 1, "1: hold events back, 0: release them"))
def _bmc_events_held(sim: "Simulator", p: dict[str, Any]) -> str:
    dev = _bmc(sim, p)
    dev.set_events_held(bool(p["held"]))
    return f"{dev.name} events {'held back' if p['held'] else 'released'}"


@fault("bmc-sessions-expire", "The Redfish service drops every session now (their tokens answer 401; login works).", BMC)
def _bmc_expire(sim: "Simulator", p: dict[str, Any]) -> str:
    dev = _bmc(sim, p)
    return f"{dev.name} dropped {dev.expire_sessions()} session(s)"


GARBAGE_KINDS = ("long-line", "not-json", "not-utf8")


@fault("bmc-event-garbage", "The Redfish service writes one malformed frame to its open SSE streams (--frame): "
       "long-line (one data line of --mib MiB), not-json or not-utf8. A client must survive it and reconnect.", BMC,
       Param("frame", str, True, None, "long-line, not-json or not-utf8"),
       Param("mib", float, False, 2.0, "long-line: the line's size in MiB (default 2)"))
def _bmc_event_garbage(sim: "Simulator", p: dict[str, Any]) -> str:
    if p["frame"] not in GARBAGE_KINDS:
        raise FaultError(f"frame: expected one of {', '.join(GARBAGE_KINDS)}, got {p['frame']!r}")
    if not 0 < p["mib"] <= 64:
        raise FaultError("mib: expected more than 0 and at most 64")
    dev = _bmc(sim, p)
    n = dev.events.send_garbage(p["frame"], int(p["mib"] * (1 << 20)))
    return f"{dev.name}: {p['frame']} written to {n} SSE stream(s)"


# -- cold plates and tray coolant flow (issue 35) ----------------------------------------


@fault("cold-plate-fouling", "A GPU's cold plate fouls (deposits, trapped air): its thermal resistance rises by "
       "PERCENT, so under load the GPU runs hotter over the coolant in proportion to its power; idle, it hardly "
       "shows. Survives resets and reboots (it is plumbing); `sim clear` cleans it.", NODE, GPU,
       Param("percent", float, True, None, "rise of the plate's thermal resistance, in % (30: R x 1.3)"))
def _plate_fouling(sim: "Simulator", p: dict[str, Any]) -> str:
    if not 0 <= p["percent"] <= 1000:
        raise FaultError("percent: expected 0..1000")
    with sim.model.lock:
        g = _gpu(sim, p)
        g.plate_fouling = p["percent"] / 100
    return f"{g.node} gpu {g.index} cold plate R +{p['percent']}%"


@fault("tray-flow-blocked", "A tray's coolant path blocks (a clogged quick-disconnect, a kinked hose): at the same "
       "CDU pressure it passes PERCENT less flow than its peers, its BMC's coolant connector reads it, and its "
       "GPUs run hotter. `sim clear` unblocks it.", Param("node", str, True, None, "node whose tray"),
       Param("percent", float, False, 50.0, "share of the peers' flow lost, in % (default 50)"))
def _tray_flow_blocked(sim: "Simulator", p: dict[str, Any]) -> str:
    if not 0 <= p["percent"] < 100:
        raise FaultError("percent: expected 0..100 (100 would be no flow at all: a closed valve)")
    with sim.model.lock:
        node = p["node"]
        if node not in sim.model.nodes:
            raise FaultError(f"node: {node!r} is not a simulated node ({', '.join(sim.model.nodes)})")
        sim.model.nodes[node].tray_flow_factor = 1 - p["percent"] / 100
    return f"{node} tray flow -{p['percent']}%"


def clear_plates_and_tray_flow(model: Any) -> None:
    """`sim clear`'s part for the two faults above: every plate clean, every tray's path open."""
    with model.lock:
        for node in model.nodes.values():
            node.tray_flow_factor = 1.0
            for g in node.gpus:
                g.plate_fouling = 0.0
