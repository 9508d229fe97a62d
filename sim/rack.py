"""A small physical model of a liquid-cooled rack, the simulator's single source of truth.

GPU power follows workload and power limits; GPU temperature follows power
and the coolant supply temperature and flow; the CDU's secondary loop
carries the rack's heat (return = supply + P / (flow * rho * cp)); the PDUs
see GPU power plus a base load per node. Device simulators (NVML twin, Modbus
CDU, SNMP PDU, sysfs links) only read and write this model, so a power cap
set over NVML really lowers the return temperature a CDU reports.
"""

from __future__ import annotations

import math
import random
import threading
import time
import uuid
from dataclasses import dataclass, field

from sim.nvml_personality import DEFAULT as DEFAULT_PERSONALITY
from sim.nvml_personality import apply as apply_personality

PG25_DENSITY = 1020.0  # kg/m^3 at ~30 C
PG25_HEAT_CAPACITY = 3900.0  # J/(kg K)
FILTER_CLEAN_DP_PA = 20_000.0  # a clean strainer's pressure drop at nominal flow
LOOP_DP_NOMINAL_PA = 100_000.0  # the secondary loop's supply - return at nominal flow (the pump head it spends)
FILTER_DP_MAX_PA = 400_000.0  # a strainer blocked solid: past this no more head is lost across it
IDLE_WORKLOAD = 0.05  # below this workload no job runs on the GPU (no compute process, the GpuIdle reason)


@dataclass
class GpuState:
    node: str
    index: int
    uuid: str
    serial: str
    pci_bus_id: str
    name: str = "NVIDIA H100 80GB HBM3"
    workload: float = 0.85  # fraction of the power limit the job would draw
    power_limit_mw: int = 700_000
    default_limit_mw: int = 700_000
    min_limit_mw: int = 200_000
    max_limit_mw: int = 700_000
    idle_w: float = 70.0
    power_w: float = 70.0
    temp_c: float = 35.0
    mem_temp_c: float = 38.0
    energy_mj: float = 0.0
    slowdown_c: int = 87
    shutdown_c: int = 92
    gpu_max_c: int = 85
    mem_max_c: int = 95
    memory_total: int = 80 * 1024**3
    sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    pcie_replays: int = 0
    remapped_correctable: int = 0
    remapped_uncorrectable: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    recovery_action: int = 0
    # XIDs whose catalogue class the hardware holds until a GPU reset or a node reboot clears it (injected with
    # --sticky): [{"code", "mnemonic", "immediate_action", "cleared_by": "gpu_reset" | "node_reboot"}, ...]
    xid_faults: list[dict] = field(default_factory=list)
    last_xid: dict | None = None  # the last XID raised, with its catalogue entry's meaning (sim/nvml_faults.py)
    architecture: str = "H100"  # the XID catalogue's "Applies to" column this GPU answers for
    pcie_max_gen: int = 5  # the link's maximum (GPU and slot): nvmlDeviceGetMaxPcieLinkGeneration / Width
    pcie_max_width: int = 16
    pcie_gen: int = 5  # what the link trained to (below the maximum: downtrained; see nvml_api.gpu_state)
    pcie_width: int = 16
    lost: bool = False
    missing: bool = False  # fallen off the bus: not enumerated by NVML at all (nvmlDeviceGetCount drops it)
    nvlink_version: int = 6  # NVML_NVLINK_VERSION_* (6 = NVLink4 as on H100, 7 = NVLink5: BER and symbol-error fields)
    hang_seconds: float = 0.0  # calls on this GPU block this long (simulates a wedged driver)
    unsupported: set[str] = field(default_factory=set)  # pynvml function/field names answering NotSupported
    base_unsupported: frozenset[str] = frozenset()  # what the GPU model itself never supports (its personality)
    thermal_extra_c: float = 0.0  # injected: extra heat (blocked cold plate)
    # injected (cold-plate-fouling): the cold plate's thermal resistance is this much above its clean value
    # (0.3 = +30 %), so the GPU's rise over the coolant grows with its power, as a fouled plate's does
    plate_fouling: float = 0.0
    # injected: a clock slowdown the GPU reports with these NVML reasons (hw_slowdown, hw_power_brake; empty with
    # slow_clock_ratio < 1: clocks held down with no reason given) and the share of its SM clock it keeps
    slowdown_reasons: set[str] = field(default_factory=set)
    slow_clock_ratio: float = 1.0
    nvlink_count: int = 18
    nvlink_up: list[bool] = field(default_factory=list)
    # per link: replay, recovery, crc_flit, crc_data, ecc_data (NVML_NVLINK_ERROR_* order)
    nvlink_errors: list[list[int]] = field(default_factory=list)
    nvlink_error_rate: dict[int, float] = field(default_factory=dict)  # link -> errors/s (crc_flit)
    nvlink_tx_kib: list[float] = field(default_factory=list)
    nvlink_rx_kib: list[float] = field(default_factory=list)
    xids: list[tuple[int, int]] = field(default_factory=list)  # (sequence, xid)
    persistence: bool = True  # persistence mode, as production nodes run
    c2c_errors: list[int] | None = None  # C2C link errors (crc, replay, replay_b2b); None: no C2C link
    # NVML answers pinned over the physics (a GPU built from a real capture: sim/nvml_capture.py)
    nvml_pinned: dict = field(default_factory=dict)
    # NVLink fabric registration (nvmlDeviceGetGpuFabricInfoV): NVML_GPU_FABRIC_STATE_* value, or None where the
    # GPU answers NotSupported (the H100 personality); status an nvmlReturn_t; health the healthMask conditions
    # that hold (degraded_bandwidth, route_recovery, route_unhealthy, access_timeout_recovery: sim/nvml_twin.py)
    fabric_state: int | None = None
    fabric_status: int = 0
    fabric_health: set[str] = field(default_factory=set)
    fabric_cluster_uuid: str = ""
    fabric_clique_id: int = 0
    # what every NVLink reaches: NVML_NVLINK_DEVICE_TYPE_* (None: NotSupported) and remote PCI bus ids (None:
    # NotSupported, as the twin answers on GB200 where the switch chips sit in other trays)
    nvlink_remote_type: int | None = None
    nvlink_remote_pci: list[str] | None = None

    def __post_init__(self) -> None:
        if not self.nvlink_up:
            self.nvlink_up = [True] * self.nvlink_count
            self.nvlink_errors = [[0, 0, 0, 0, 0] for _ in range(self.nvlink_count)]
            self.nvlink_tx_kib = [0.0] * self.nvlink_count
            self.nvlink_rx_kib = [0.0] * self.nvlink_count

    @property
    def busy(self) -> bool:
        """A job runs on the GPU (one compute process): NVML's idle clock-event reason is off, a reset is refused."""
        return self.workload >= IDLE_WORKLOAD

    @property
    def target_power_w(self) -> float:
        """What the GPU draws once settled: its workload's demand, within its power limit."""
        demand = self.idle_w + self.workload * (self.default_limit_mw / 1000 - self.idle_w)
        return min(demand, self.power_limit_mw / 1000)

    @property
    def hw_thermal_slowdown(self) -> bool:
        return self.temp_c >= self.slowdown_c

    @property
    def sw_power_cap(self) -> bool:
        return self.workload * self.default_limit_mw / 1000 > self.power_limit_mw / 1000 * 0.98


@dataclass
class CoolantState:
    """Secondary (rack) loop of the CDU, plus the facility (primary) side and the room."""

    primary_supply_c: float = 18.0
    secondary_supply_setpoint_c: float = 25.0
    secondary_supply_c: float = 25.0
    secondary_return_c: float = 30.0
    primary_return_c: float = 26.0
    nominal_flow_lpm: float = 300.0
    flow_factor: float = 1.0  # injected flow drop (0.6 = 40 % drop)
    pump_speed: list[float] = field(default_factory=lambda: [0.7, 0.7])  # ratio per pump
    pump_running: list[bool] = field(default_factory=lambda: [True, True])
    # injected (pump-fail --speed): the share of its set speed each pump reaches (a worn impeller, a failing drive)
    pump_wear: list[float] = field(default_factory=lambda: [1.0, 1.0])
    # injected (filter-clogging): how fast the strainer's pressure drop rises, Pa/s of simulated time
    filter_clog_rate_pa_s: float = 0.0
    supply_hot_extra_c: float = 0.0
    reservoir_level: float = 0.82
    ambient_c: float = 24.0
    humidity_pct: float = 45.0
    supply_pressure_pa: float = 250_000.0
    return_pressure_pa: float = 150_000.0
    filter_dp_pa: float = FILTER_CLEAN_DP_PA
    leak_zones: dict[str, str] = field(default_factory=dict)  # zone -> "dry" | "wet" | "cable_break" | "contamination"
    valve_open: dict[str, bool] = field(default_factory=dict)  # zone -> valve open
    # The Redfish CDU's own leak detectors (in its cabinet): detector id -> "critical" | "warning" | "sensor_fault".
    cdu_leaks: dict[str, str] = field(default_factory=dict)

    def pump_actual_speed(self, i: int) -> float:
        """What pump i really turns at: its set speed times its wear, 0 when stopped."""
        return self.pump_speed[i] * self.pump_wear[i] if self.pump_running[i] else 0.0

    @property
    def clog_factor(self) -> float:
        """Flow left by a clogging strainer: the pump's head is fixed, the strainer's extra drop is taken from
        the loop's, and flow goes with the square root of the head (turbulent flow, dp ~ flow^2)."""
        extra = max(self.filter_dp_pa - FILTER_CLEAN_DP_PA, 0.0)
        return 1.0 / math.sqrt(1.0 + extra / LOOP_DP_NOMINAL_PA)

    @property
    def flow_lpm(self) -> float:
        running = [self.pump_actual_speed(i) for i, on in enumerate(self.pump_running) if on]
        if not running:
            return 0.0
        # Flow grows with the mean running pump speed; one pump can carry ~60 % of the load.
        share = sum(running) / len(self.pump_speed) / 0.7
        return self.nominal_flow_lpm * min(share, 1.6) * self.flow_factor * self.clog_factor


@dataclass
class NodeState:
    name: str
    base_load_w: float = 900.0  # CPUs, NICs, fans of the tray
    gpus: list[GpuState] = field(default_factory=list)
    powered: bool = True  # False when every PDU outlet feeding the node is off (simulated PDU)
    host_on: bool = True  # False after the tray's BMC powered its host off (Redfish ComputerSystem.Reset ForceOff)
    standby_w: float = 60.0  # what a tray whose host is off still draws: its BMC and fans at idle
    # Every power action the tray's BMC carried out, in order: {"reset_type", "power_state", "time", "wall"}.
    power_actions: list[dict] = field(default_factory=list)
    # The tray's own leak detectors (BMC-local moisture sensors): detector id -> "critical" | "warning" |
    # "sensor_fault"; a detector not named here is dry. Kept apart from the CDU's leak zones on purpose.
    tray_leaks: dict[str, str] = field(default_factory=dict)
    nvml_hang_seconds: float = 0.0  # every NVML call on the node blocks up to this long (a wedged driver)
    nvml_pinned: dict = field(default_factory=dict)  # driver / cuda of a captured node
    # injected (tray-flow-blocked): the share of its peers' coolant flow this tray's manifold still passes at
    # the same CDU pressure (1.0: clear; 0.2: a clogged quick-disconnect or a kinked hose)
    tray_flow_factor: float = 1.0
    # The host's boot: a new id and time at every simulated reboot (sim/nvml_faults.reboot_node), as
    # /proc/sys/kernel/random/boot_id and the boot time change on a real host, so a check after a reboot can
    # tell that the node did reboot.
    boot_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    boot_time: float = field(default_factory=time.time)
    boots: int = 1

    @property
    def power_w(self) -> float:
        if not self.powered:
            return 0.0
        if not self.host_on:
            return self.standby_w
        return self.base_load_w + sum(g.power_w for g in self.gpus if not g.lost)


@dataclass
class SwitchTrayState:
    """An NVLink switch tray: its NVSwitch chips (the NVLink index of every GPU that reaches each), the leak zone
    it sits in, and its BMC's leak detectors (detector id -> "critical" | "warning" | "sensor_fault"; absent is
    dry), set by the `switch-tray-leak` fault."""

    name: str
    chips: list[int]
    zone: str
    leaks: dict[str, str] = field(default_factory=dict)


def switch_tray_count(nodes: int) -> int:
    """A GB200 NVL72 has 9 switch trays for 18 compute trays: one per two compute trays, at least one, at most
    the 9 of an NVLink domain (18 NVSwitch chips)."""
    return min(9, max(1, math.ceil(nodes / 2)))


class RackModel:
    """The rack's state and its physics; every mutation goes through `lock`.

    Devices may read fields directly under `lock`; `step(dt)` advances time.
    """

    def __init__(self, rack: str = "r01", nodes: int = 2, gpus_per_node: int = 4, nvlinks: int = 18,
                 seed: int = 1, leak_zones: dict[str, list[str]] | None = None, personality: str = DEFAULT_PERSONALITY):
        self.lock = threading.RLock()
        self.rack = rack
        self.rng = random.Random(seed)
        self.time = 0.0
        self.xid_seq = 0
        self.nodes: dict[str, NodeState] = {}
        for n in range(nodes):
            name = f"node{n + 1:02d}"
            node = NodeState(name)
            for i in range(gpus_per_node):
                uid = f"GPU-{seed:02x}{n:02x}{i:02x}00-5eed-4c0d-9a1e-{n:06x}{i:06x}"
                gpu = GpuState(node=name, index=i, uuid=uid, serial=f"165{seed:03d}{n:03d}{i:04d}",
                               pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0", nvlink_count=nvlinks)
                apply_personality(gpu, personality)
                if gpu.fabric_state is not None:  # one NVLink domain per simulated rack: one cluster, one clique
                    gpu.fabric_cluster_uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"supernode-sim/{rack}/fabric"))
                    gpu.fabric_clique_id = 1
                node.gpus.append(gpu)
            self.nodes[name] = node
        zones = leak_zones if leak_zones is not None else {"zone-a": list(self.nodes)}
        self.zone_nodes = zones
        self.coolant = CoolantState(leak_zones={z: "dry" for z in zones}, valve_open={z: True for z in zones})
        # Switch tray j (1-based) holds chips 2(j-1) and 2(j-1)+1 and sits with compute trays 2j-1 and 2j: its leak
        # endangers the zone of the first of them.
        names = list(self.nodes)
        self.switch_trays: dict[str, SwitchTrayState] = {}
        for j in range(switch_tray_count(nodes)):
            first = names[min(2 * j, len(names) - 1)] if names else ""
            zone = next((z for z, ns in zones.items() if first in ns), next(iter(zones), ""))
            name = f"switch{j + 1:02d}"
            self.switch_trays[name] = SwitchTrayState(name, [2 * j, 2 * j + 1], zone)
        # Sized like a real CDU loop: about 1.5 L/min per kW of GPU power at full load.
        max_kw = sum(g.max_limit_mw for n in self.nodes.values() for g in n.gpus) / 1e6
        self.coolant.nominal_flow_lpm = max(1.5 * max_kw, 5.0)
        self.base_time = 0.0
        for _ in range(2):  # the loop sees the GPUs' power one step late: settle the initial state
            self.step(0.0)

    # -- queries -----------------------------------------------------------------

    def gpu(self, node: str, index: int) -> GpuState:
        return self.nodes[node].gpus[index]

    def node_power_w(self, node: str) -> float:
        with self.lock:
            return self.nodes[node].power_w

    def rack_power_w(self) -> float:
        with self.lock:
            return sum(n.power_w for n in self.nodes.values())

    def heat_w(self) -> float:
        """Heat into the secondary loop: GPU power (the cold plates carry the GPUs only)."""
        with self.lock:
            return sum(g.power_w for n in self.nodes.values() for g in n.gpus if not g.lost)

    def tray_flow_lpm(self, node: str) -> float:
        """The coolant flow through one tray's manifold: its share of the secondary loop's flow at the CDU's
        pressure, times what its own path still passes (a closed zone valve: a trickle). A blocked tray does not
        push more flow through the others: the CDU holds its pressure, and the others' paths are unchanged."""
        with self.lock:
            c = self.coolant
            share = c.flow_lpm / max(len(self.nodes), 1)
            closed = any(not c.valve_open.get(z, True) for z, ns in self.zone_nodes.items() if node in ns)
            return share * (0.05 if closed else self.nodes[node].tray_flow_factor)

    # -- physics -----------------------------------------------------------------

    def step(self, dt: float) -> None:
        with self.lock:
            self.time += dt
            c = self.coolant
            if c.filter_clog_rate_pa_s > 0:
                c.filter_dp_pa = min(c.filter_dp_pa + c.filter_clog_rate_pa_s * dt, FILTER_DP_MAX_PA)
            flow_m3s = c.flow_lpm / 60000.0
            c.secondary_supply_c = c.secondary_supply_setpoint_c + c.supply_hot_extra_c
            heat = self.heat_w()
            if flow_m3s > 1e-6:
                delta = heat / (flow_m3s * PG25_DENSITY * PG25_HEAT_CAPACITY)
            else:
                delta = 40.0
            c.secondary_return_c = c.secondary_supply_c + min(delta, 40.0)
            c.primary_return_c = c.primary_supply_c + 0.8 * (c.secondary_return_c - c.primary_supply_c) * 0.5
            c.supply_pressure_pa = 150_000.0 + 100_000.0 * (c.flow_lpm / c.nominal_flow_lpm) if c.nominal_flow_lpm else 150_000.0
            flow_ratio = c.flow_lpm / c.nominal_flow_lpm if c.nominal_flow_lpm else 0.0
            for node in self.nodes.values():
                # A closed zone valve starves that zone's cold plates: only a trickle gets through.
                closed = any(not c.valve_open.get(z, True) for z, ns in self.zone_nodes.items() if node.name in ns)
                for g in node.gpus:
                    if not (node.powered and node.host_on):  # tray off: GPUs draw nothing and cool to the coolant
                        g.power_w = 0.0
                        g.temp_c += (c.secondary_supply_c - g.temp_c) * (1.0 if dt <= 0 else min(1.0, dt / 3.0))
                        continue
                    tray_ratio = 0.05 if closed else flow_ratio * node.tray_flow_factor
                    self._step_gpu(g, dt, c.secondary_supply_c, tray_ratio)

    def _step_gpu(self, g: GpuState, dt: float, supply_c: float, flow_ratio: float) -> None:
        if g.lost:
            g.power_w = 0.0
            return
        target_power = g.target_power_w
        # First-order response: power settles within a few seconds of a new limit.
        alpha = 1.0 if dt <= 0 else min(1.0, dt / 1.0)
        g.power_w += (target_power - g.power_w) * alpha
        g.power_w = max(g.power_w, 0.0)
        g.energy_mj += g.power_w * dt * 1000.0
        # Cold plate: thermal resistance grows as flow falls. A bigger GPU sits on a bigger cold plate: the
        # resistance scales with the board power (0.06 K/W at H100's 700 W), so full load stays below slowdown.
        # A fouled plate (deposits, trapped air) multiplies that resistance: its rise over the coolant grows with power.
        r_th = 0.06 * 700.0 / max(g.default_limit_mw / 1000, 1.0) / max(flow_ratio, 0.15) ** 0.8 * (1 + g.plate_fouling)
        target_temp = supply_c + g.power_w * r_th + g.thermal_extra_c
        g.temp_c += (target_temp - g.temp_c) * (1.0 if dt <= 0 else min(1.0, dt / 3.0))
        g.mem_temp_c = g.temp_c + 4.0
        util = g.power_w / (g.default_limit_mw / 1000)
        for link in range(g.nvlink_count):
            if g.nvlink_up[link]:
                g.nvlink_tx_kib[link] += 25_000_000 * util * dt / 1024
                g.nvlink_rx_kib[link] += 25_000_000 * util * dt / 1024
        for link, rate in g.nvlink_error_rate.items():
            g.nvlink_errors[link][2] += int(rate * dt + self.rng.random())
            g.nvlink_errors[link][0] += int(rate * dt / 4)

    # -- mutations used by devices and fault injection ----------------------------

    def set_power_limit(self, node: str, index: int, limit_mw: int) -> None:
        with self.lock:
            g = self.gpu(node, index)
            g.power_limit_mw = int(limit_mw)

    def set_host_power(self, node: str, on: bool, reset_type: str, wall: float) -> None:
        """The tray's BMC switches its host on or off; every action is recorded, in order, for the tests."""
        with self.lock:
            n = self.nodes[node]
            n.host_on = on
            n.power_actions.append({"reset_type": reset_type, "power_state": "On" if on else "Off",
                                    "time": self.time, "wall": wall})

    def raise_xid(self, node: str, index: int, xid: int) -> int:
        with self.lock:
            self.xid_seq += 1
            self.gpu(node, index).xids.append((self.xid_seq, xid))
            return self.xid_seq
