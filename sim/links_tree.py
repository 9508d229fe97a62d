"""A simulated node's scale-out ports: a sysfs-shaped tree plus `ethtool -m` dumps.

The agent reads these exactly as it reads a real host (LinkSource with
`sysfs_root` = `root`, DomSource with `dom_dir` = `dom_dir`), so the only
simulated part is who writes the files. Counters move with the node's GPU
load; faults (optic degradation, flaps, IB error rates) are injected through
plain methods. Every file is written to a temporary name and renamed, so a
reader never sees half a file; unchanged files are not rewritten.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sim.ethtool_text import SimModule, render
from sim.rack import RackModel
from exporters.links.links_profile import load_links_profile

# Where the simulator's `ip`/`ibportstate` stand-in leaves the wanted admin state of a port.
SIM_ADMIN_FILE = "sim_admin_state"

# name, kind, netdev (for the DOM of IB ports)
DEFAULT_PORTS: tuple[tuple[str, str, str | None], ...] = (
    ("mlx5_0/1", "ib", "ib0"), ("mlx5_1/1", "ib", "ib1"), ("eth0", "eth", None), ("eth1", "eth", None))
IB_RATE = "400 Gb/sec (4X NDR)"
ETH_SPEED_MBPS = 100_000
WRITE_SECONDS = 0.5  # the link files are rewritten at least this often (write_files: at once after a fault)
LINE_RATE_BYTES = {"ib": 50e9, "eth": 12.5e9}


@dataclass
class SimPort:
    name: str
    kind: str
    netdev: str | None
    module: SimModule
    up: bool = True
    admin_up: bool = True
    carrier_changes: int = 1  # the kernel counts the first carrier up
    carrier_up: int = 1
    carrier_down: int = 0
    errors: dict[str, float] = field(default_factory=dict)  # counter -> value (float accumulates rates)
    error_rates: dict[str, float] = field(default_factory=dict)  # counter -> events per second
    rx_bytes: float = 0.0
    tx_bytes: float = 0.0

    @property
    def dom_file(self) -> str:
        return self.netdev or self.name


class SimLinkTree:
    """Simulated device `links-<node>`: no network endpoint, a directory tree the agent reads."""

    def __init__(self, model: RackModel, node: str, base_dir: Path | str | None = None,
                 ports: tuple[tuple[str, str, str | None], ...] | list = DEFAULT_PORTS):
        if node not in model.nodes:
            raise ValueError(f"links sim: node {node!r} not in the rack model ({sorted(model.nodes)})")
        self.name = f"links-{node}"
        self.node = node
        self._owns_dir = base_dir is None
        self._base = Path(base_dir) if base_dir is not None else Path(tempfile.mkdtemp(prefix="supernode-links-"))
        profile = load_links_profile("sysfs")
        self._ib_widths: dict[str, int] = profile["infiniband"]["error_counters"]
        self._eth_counters: list[str] = profile["ethernet"]["error_counters"]
        self._lock = threading.Lock()
        self._written: dict[Path, str] = {}
        self._last_time: float | None = None
        self._dirty = True  # a fault or a carrier changed since the last write: the next tick writes at once
        self._written_at = -math.inf  # monotonic time of the last write
        self.ports: dict[str, SimPort] = {}
        for i, (name, kind, netdev) in enumerate(ports):
            module = SimModule(layout="cmis" if kind == "ib" else "sff8636", serial=f"SIM{node[-2:]}{i:05d}")
            counters = self._ib_widths if kind == "ib" else self._eth_counters
            self.ports[name] = SimPort(name, kind, netdev, module, errors={c: 0.0 for c in counters})

    # -- plug-in contract ----------------------------------------------------------

    @property
    def root(self) -> Path:
        """The sysfs-shaped tree: point the agent's `sources.sysfs_root` here."""
        return self._base / self.node / "sys"

    @property
    def dom_dir(self) -> Path:
        """Directory of `<netdev>.txt` ethtool -m dumps: the agent's `sources.dom.dom_dir`."""
        return self._base / self.node / "dom"

    @property
    def endpoint(self) -> None:
        """No network endpoint: the agent reads `root` and `dom_dir`."""
        return None

    def port_specs(self) -> list[tuple[str, str, bool, str | None]]:
        """(name, kind, isolatable, netdev) of the simulated ports, for the agent's inventory."""
        return [(p.name, p.kind, True, p.netdev) for p in self.ports.values()]

    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.dom_dir.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._write_all()

    def update(self, model: RackModel, write: bool = True) -> None:
        """Advance counters by the model time elapsed and rewrite what changed (called under model.lock);
        `write=False`: the files later, by `write_files` (the simulator's ticker does that off its event loop)."""
        node = model.nodes[self.node]
        gpus = [g for g in node.gpus if not g.lost]
        load = sum(g.power_w / (g.default_limit_mw / 1000) for g in gpus) / len(gpus) if gpus else 0.0
        supply_c = model.coolant.secondary_supply_c
        with self._lock:
            dt = 0.0 if self._last_time is None else max(0.0, model.time - self._last_time)
            self._last_time = model.time
            for p in self.ports.values():
                self._apply_admin(p)
                if p.up:
                    p.rx_bytes += LINE_RATE_BYTES[p.kind] * 0.6 * load * dt
                    p.tx_bytes += LINE_RATE_BYTES[p.kind] * 0.6 * load * dt
                for counter, rate in p.error_rates.items():
                    self._bump(p, counter, rate * dt)
                p.module.temperature_c = round(supply_c + 20.0 + 5.0 * load, 1)
            if write:
                self._write_all()

    def write_files(self) -> None:
        """Rewrite what changed since the last write (any thread: the tree's own lock, not the model's): at once
        after a fault or a carrier change, else every WRITE_SECONDS. Why not every tick of the simulator (0.1 s):
        the traffic counters and module temperatures change with the load at every tick, so each tick rewrote
        some 20 files a node; that was half the simulator's CPU in a test module, for an agent that reads them
        every second or slower (its rates see the counters move in WRITE_SECONDS steps, as a kernel's do between
        the driver's own counter refreshes)."""
        with self._lock:
            if self._dirty or time.monotonic() - self._written_at >= WRITE_SECONDS:
                self._write_all()

    async def stop(self) -> None:
        if self._owns_dir:
            shutil.rmtree(self._base, ignore_errors=True)

    # -- fault kinds ---------------------------------------------------------------

    def optic_degrade(self, port: str, rx_dbm: float) -> None:
        """All receive lanes of the port's module read `rx_dbm` (flags follow the module's thresholds)."""
        with self._lock:
            p = self._port(port)
            p.module.rx_dbm = [float(rx_dbm)] * len(p.module.rx_dbm)
            self._dirty = True

    def link_flap(self, port: str, count: int = 1) -> None:
        """The port goes down and up `count` times at once: seen only through the kernel's counters."""
        if count < 1:
            raise ValueError("link_flap: count must be at least 1")
        with self._lock:
            p = self._port(port)
            p.carrier_changes += 2 * count
            p.carrier_down += count
            p.carrier_up += count
            self._dirty = True
            if p.kind == "ib":
                self._bump(p, "link_downed", count)

    def ib_errors(self, port: str, counter: str, rate: float) -> None:
        """IB error counter `counter` of `port` grows by `rate` per second (0 stops it)."""
        with self._lock:
            p = self._port(port)
            if p.kind != "ib" or counter not in self._ib_widths:
                raise ValueError(f"ib_errors: {port} has no IB counter {counter!r} "
                                 f"(known: {sorted(self._ib_widths)})")
            if rate < 0:
                raise ValueError("ib_errors: rate must be >= 0")
            p.error_rates[counter] = float(rate)
            self._dirty = True

    def set_link(self, port: str, up: bool) -> None:
        """Hold the port's carrier down (cable pulled) or let it come back."""
        with self._lock:
            self._set_up(self._port(port), up)

    def clear(self) -> None:
        """Remove every injected fault: nominal optics, no error rates, carriers back up."""
        with self._lock:
            for p in self.ports.values():
                p.module = SimModule(layout=p.module.layout, serial=p.module.serial,
                                     temperature_c=p.module.temperature_c)
                p.error_rates.clear()
                if p.admin_up:
                    self._set_up(p, True)
            self._dirty = True

    # -- internals -----------------------------------------------------------------

    def _port(self, port: str) -> SimPort:
        try:
            return self.ports[port]
        except KeyError:
            raise ValueError(f"{self.name}: no port {port!r} (have {sorted(self.ports)})") from None

    def _bump(self, p: SimPort, counter: str, amount: float) -> None:
        cap = float((1 << self._ib_widths[counter]) - 1) if p.kind == "ib" else math.inf
        p.errors[counter] = min(cap, p.errors.get(counter, 0.0) + amount)  # IB counters stick at their maximum

    def _set_up(self, p: SimPort, up: bool) -> None:
        if p.up == up:
            return
        self._dirty = True
        p.up = up
        p.carrier_changes += 1
        if up:
            p.carrier_up += 1
        else:
            p.carrier_down += 1
            if p.kind == "ib":
                self._bump(p, "link_downed", 1)

    def _apply_admin(self, p: SimPort) -> None:
        """Honour what the `ip`/`ibportstate` stand-in wrote (sim/link_shim.py), as the kernel would."""
        try:
            wanted = (self._port_dir(p) / SIM_ADMIN_FILE).read_text().strip()
        except OSError:
            return
        admin_up = wanted != "down"
        if admin_up != p.admin_up:
            p.admin_up = admin_up
            self._set_up(p, admin_up)

    def _port_dir(self, p: SimPort) -> Path:
        if p.kind == "ib":
            dev, _, num = p.name.partition("/")
            return self.root / "class" / "infiniband" / dev / "ports" / num
        return self.root / "class" / "net" / p.name

    def _write(self, path: Path, text: str) -> None:
        if self._written.get(path) == text:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
        self._written[path] = text

    def _write_all(self) -> None:
        self._dirty = False
        self._written_at = time.monotonic()
        for p in self.ports.values():
            d = self._port_dir(p)
            if p.kind == "ib":
                self._write(d / "state", "4: ACTIVE\n" if p.up else "1: DOWN\n")
                phys = "5: LinkUp" if p.up else ("3: Disabled" if not p.admin_up else "2: Polling")
                self._write(d / "phys_state", phys + "\n")
                self._write(d / "rate", IB_RATE + "\n")
                self._write(d / "link_layer", "InfiniBand\n")
                traffic = {"port_rcv_data": p.rx_bytes / 4, "port_xmit_data": p.tx_bytes / 4,  # 4-octet words
                           "port_rcv_packets": p.rx_bytes / 4096, "port_xmit_packets": p.tx_bytes / 4096}
                counters_dir = d / "counters"
            else:
                self._write(d / "operstate", "up\n" if p.up else "down\n")
                self._write(d / "carrier", "1\n" if p.up else "0\n")
                self._write(d / "speed", f"{ETH_SPEED_MBPS if p.up else -1}\n")
                self._write(d / "carrier_changes", f"{p.carrier_changes}\n")
                self._write(d / "carrier_up_count", f"{p.carrier_up}\n")
                self._write(d / "carrier_down_count", f"{p.carrier_down}\n")
                traffic = {"rx_bytes": p.rx_bytes, "tx_bytes": p.tx_bytes,
                           "rx_packets": p.rx_bytes / 1500, "tx_packets": p.tx_bytes / 1500}
                counters_dir = d / "statistics"
            for fname, value in {**p.errors, **traffic}.items():
                self._write(counters_dir / fname, f"{int(value)}\n")
            module = p.module
            if not p.up:  # no light on a down link
                module = SimModule(layout=module.layout, serial=module.serial, temperature_c=module.temperature_c,
                                   rx_dbm=[-math.inf] * len(module.rx_dbm))
            self._write(self.dom_dir / f"{p.dom_file}.txt", render(module))


def rack_link_trees(model: RackModel, base_dir: Path | str | None = None) -> dict[str, SimLinkTree]:
    """One tree per node of the rack (the demo's agents each read their node's tree)."""
    base = Path(base_dir) if base_dir is not None else None
    return {node: SimLinkTree(model, node, base) for node in model.nodes}
