"""Port state, counters and flaps of the node's scale-out ports, from sysfs.

Ethernet/RoCE ports are read from `<root>/class/net/<if>/`, InfiniBand ports
(`<dev>/<port>`) from `<root>/class/infiniband/<dev>/ports/<port>/`; the root
is configurable so tests and the simulator point it at a tree of their own.
Which files mean what (IB state codes, counter widths) is in
profiles/links/sysfs.yaml.

A port that goes down and comes back between two polls must still count as a
flap, so flaps are the larger of the down transitions the agent saw and the
kernel's own count of downs since the last poll (carrier_down_count, or half
the carrier_changes delta, or the IB link_downed delta).

Attribute text is untrusted (issue 18: a `speed` of `--1` or a counter above
1e308 failed the whole source): reads are capped at a page, numbers must be
ASCII digits within 64 bits, and a bad value is a sensor fault of that one
reading while the rest of the port and the other ports stay good.
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from exporters.base import BlockingCaller, HeldCounters
from exporters.links.links_profile import load_links_profile, require
from exporters.model import MetricSpec, PollResult, Quality, Reading, SourceError, counter, gauge, make_reading
from exporters.links.ports import PortSpec, as_port_specs

LINK_UP = gauge("supernode_link_up", "Port is up (1): Ethernet operstate up, InfiniBand port state ACTIVE.",
                ("port", "kind"))
LINK_FLAPS = counter("supernode_link_flaps_total",
                     "Transitions of the port to down, seen by the agent or counted by the kernel between polls.",
                     ("port",))
LINK_CARRIER_CHANGES = counter("supernode_link_carrier_changes_total",
                               "Kernel carrier changes of an Ethernet port (a down and up adds 2).", ("port",))
LINK_ERRORS = counter("supernode_link_errors_total",
                      "Port error counters (IB PortCounters, Ethernet statistics), events.", ("port", "counter"))
LINK_SATURATED = gauge("supernode_link_errors_saturated",
                       "1 when an IB error counter sits at its maximum (it stops counting until reset).",
                       ("port", "counter"))
LINK_RX_BYTES = counter("supernode_link_receive_bytes_total", "Bytes received on the port, bytes.", ("port",),
                        unit="bytes")
LINK_TX_BYTES = counter("supernode_link_transmit_bytes_total", "Bytes transmitted on the port, bytes.", ("port",),
                        unit="bytes")
LINK_RX_PACKETS = counter("supernode_link_receive_packets_total", "Packets received on the port.", ("port",))
LINK_TX_PACKETS = counter("supernode_link_transmit_packets_total", "Packets transmitted on the port.", ("port",))
LINK_SPEED = gauge("supernode_link_speed_bytes_per_second", "Negotiated port speed, bytes per second.", ("port",),
                   unit="bytes_per_second")
LINK_IB_STATE = gauge("supernode_link_ib_state",
                      "IB logical port state code: 1 down, 2 init, 3 armed, 4 active, 5 active_defer.", ("port",))
LINK_IB_PHYS_STATE = gauge("supernode_link_ib_phys_state",
                           "IB physical port state code: 1 sleep, 2 polling, 3 disabled, 4 training, 5 link_up, "
                           "6 link_error_recovery, 7 phy_test.", ("port",))

TRAFFIC_SPECS = {"receive_bytes": LINK_RX_BYTES, "transmit_bytes": LINK_TX_BYTES,
                 "receive_packets": LINK_RX_PACKETS, "transmit_packets": LINK_TX_PACKETS}
METRICS = (LINK_UP, LINK_FLAPS, LINK_CARRIER_CHANGES, LINK_ERRORS, LINK_SATURATED, LINK_SPEED, LINK_IB_STATE,
           LINK_IB_PHYS_STATE, *TRAFFIC_SPECS.values())

_CODE = re.compile(r"\s*([0-9]{1,9})\s*:", re.ASCII)
_RATE = re.compile(r"\s*([0-9]{1,9}(?:\.[0-9]{1,9})?)\s*Gb/sec", re.ASCII)
MAX_ATTR = 4096  # a sysfs attribute is at most one page
_O_RDONLY = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_OK = Quality.OK
U64_DIGITS = 20  # 18446744073709551615
Fault = tuple[MetricSpec, dict[str, str]]


@dataclass
class PortSample:
    """One read of one port's sysfs directory."""

    port: PortSpec
    present: bool = True
    up: bool | None = None  # None: state unreadable
    state: str = ""  # operstate text, or IB state name
    ib_state: int | None = None
    ib_phys_state: int | None = None
    speed_bps: float | None = None
    carrier_changes: int | None = None
    down_count: int | None = None  # kernel count of downs: carrier_down_count / IB link_downed
    errors: dict[str, int] = field(default_factory=dict)
    saturated: dict[str, bool] = field(default_factory=dict)
    traffic: dict[str, int] = field(default_factory=dict)  # metric -> value in base units
    problems: list[str] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)  # series whose attribute held no well-formed value
    counters_read: bool = True  # False: a poll between two reads of the error counters (only the down counter)


def port_dir(sysfs_root: Path, port: PortSpec) -> Path:
    if port.kind == "ib":
        dev, _, num = port.name.partition("/")
        return sysfs_root / "class" / "infiniband" / dev / "ports" / num
    return sysfs_root / "class" / "net" / port.name


def _read(path: str) -> str | None:
    """A sysfs attribute's text, or None when absent or refused (carrier/speed give EINVAL on a down link).

    At most one page is read, so a file that is not a real attribute cannot eat memory. Plain os calls
    on a string path: a poll reads ~20 attributes per port, and a pathlib join plus a text-mode file
    object per attribute cost more than the read itself.
    """
    try:
        fd = os.open(path, _O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, MAX_ATTR + 1).decode("utf-8", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)


def parse_uint(text: str) -> int | None:
    """A non-negative integer of ASCII digits that fits 64 bits; None otherwise ('--1', '²', 400 digits)."""
    if not text or len(text) > U64_DIGITS or not text.isascii() or not text.isdigit():
        return None
    v = int(text)
    return v if v < 1 << 64 else None


def _read_int(path: str, sample: PortSample, required: bool = False, fault: Fault | None = None) -> int | None:
    text = _read(path)
    if text is None:
        if required:
            sample.problems.append(f"{path}: unreadable")
        return None
    value = parse_uint(text)
    if value is None:
        sample.problems.append(f"{path}: not a 64-bit unsigned integer: {text[:40]!r}")
        if fault is not None:
            sample.faults.append(fault)
    return value


class SysfsReader:
    """Reads port samples from a sysfs tree, as the profile describes it."""

    def __init__(self, sysfs_root: Path | str):
        self.root = Path(sysfs_root)
        profile = load_links_profile("sysfs")
        where = "profiles/links/sysfs.yaml"
        self.ib_up = set(require(profile, "infiniband.up_states", list, where))
        self.ib_states: dict[int, str] = require(profile, "infiniband.states", dict, where)
        self.ib_counters: dict[str, int] = require(profile, "infiniband.error_counters", dict, where)
        self.ib_down_counter: str = require(profile, "infiniband.down_counter", str, where)
        self.ib_traffic: dict[str, dict] = require(profile, "infiniband.traffic", dict, where)
        # What a poll between two counter reads reads of the error counters: the down count, for flaps.
        self._ib_down_only = {k: v for k, v in self.ib_counters.items() if k == self.ib_down_counter}
        self.eth_up = set(require(profile, "ethernet.up_states", list, where))
        self.eth_counters: list[str] = require(profile, "ethernet.error_counters", list, where)
        self.eth_traffic: dict[str, dict] = require(profile, "ethernet.traffic", dict, where)
        self._dirs: dict[str, str] = {}  # port name -> its directory

    def read(self, port: PortSpec, counters: bool = True) -> PortSample:
        """One port's sample; without `counters`, of its error counters only the kernel's down count (flaps)."""
        sample = PortSample(port, counters_read=counters)
        base = self._dirs.get(port.name)
        if base is None:
            base = self._dirs[port.name] = str(port_dir(self.root, port))
        if not os.path.isdir(base):
            sample.present = False
            sample.up = False
            sample.problems.append(f"{base}: port not present")
            return sample
        if port.kind == "ib":
            self._read_ib(base, sample, counters)
        else:
            self._read_eth(base, sample, counters)
        return sample

    def _read_ib(self, base: str, s: PortSample, counters: bool = True) -> None:
        for attr in ("state", "phys_state"):
            text = _read(f"{base}/{attr}")
            m = _CODE.match(text or "")
            if not m:
                s.problems.append(f"{base}/{attr}: unreadable or not '<code>: <name>': {text!r}")
                continue
            setattr(s, "ib_state" if attr == "state" else "ib_phys_state", int(m.group(1)))
        if s.ib_state is not None:
            s.up = s.ib_state in self.ib_up
            s.state = self.ib_states.get(s.ib_state, str(s.ib_state))
        rate = _read(f"{base}/rate")
        m = _RATE.match(rate or "")
        if m:
            s.speed_bps = float(m.group(1)) * 1e9
        elif rate:
            s.problems.append(f"{base}/rate: not '<n> Gb/sec': {rate[:40]!r}")
            s.faults.append((LINK_SPEED, {"port": s.port.name}))
        for name, width in (self.ib_counters if counters else self._ib_down_only).items():
            value = _read_int(f"{base}/counters/{name}", s, fault=(LINK_ERRORS, {"port": s.port.name, "counter": name}))
            if value is not None:
                s.errors[name] = value
                s.saturated[name] = value >= (1 << int(width)) - 1
        s.down_count = s.errors.get(self.ib_down_counter)
        self._read_traffic(f"{base}/counters", self.ib_traffic, s)

    def _read_eth(self, base: str, s: PortSample, counters: bool = True) -> None:
        operstate = _read(f"{base}/operstate")
        if operstate is None:
            s.problems.append(f"{base}/operstate: unreadable")
        else:
            s.state = operstate
            s.up = operstate in self.eth_up
        speed = _read(f"{base}/speed")
        if speed and speed != "-1":  # -1: the driver does not know the speed (link down): no reading
            mbps = parse_uint(speed)
            if mbps is None:
                s.problems.append(f"{base}/speed: not a speed in Mb/s: {speed[:40]!r}")
                s.faults.append((LINK_SPEED, {"port": s.port.name}))
            elif mbps > 0:
                s.speed_bps = mbps * 1e6
        s.carrier_changes = _read_int(f"{base}/carrier_changes", s, fault=(LINK_CARRIER_CHANGES, {"port": s.port.name}))
        s.down_count = _read_int(f"{base}/carrier_down_count", s)
        for name in (self.eth_counters if counters else ()):
            value = _read_int(f"{base}/statistics/{name}", s, fault=(LINK_ERRORS, {"port": s.port.name, "counter": name}))
            if value is not None:
                s.errors[name] = value
        self._read_traffic(f"{base}/statistics", self.eth_traffic, s)

    @staticmethod
    def _read_traffic(directory: str, table: dict[str, dict], s: PortSample) -> None:
        for fname, entry in table.items():
            value = _read_int(f"{directory}/{fname}", s, fault=(TRAFFIC_SPECS[entry["metric"]], {"port": s.port.name}))
            if value is not None:
                s.traffic[entry["metric"]] = value * int(entry.get("scale", 1))


class FlapTracker:
    """Counts transitions to down per port across polls, including those between two polls."""

    def __init__(self) -> None:
        self._prev: dict[str, PortSample] = {}
        self.flaps: dict[str, int] = {}

    @staticmethod
    def _delta(now: int | None, before: int | None) -> int | None:
        if now is None or before is None:
            return None
        return now - before if now >= before else 0  # a reset counter (driver reload) restarts: no events known

    def update(self, s: PortSample) -> int:
        """Record a sample; returns the flaps it adds (the first sample of a port only sets the baseline)."""
        name = s.port.name
        self.flaps.setdefault(name, 0)
        prev = self._prev.get(name)
        if s.up is None:  # unreadable state: keep the previous sample as the baseline
            return 0
        self._prev[name] = s
        if prev is None or prev.up is None:
            return 0
        observed = 1 if prev.up and not s.up else 0
        kernel = self._delta(s.down_count, prev.down_count)
        if kernel is None:
            changes = self._delta(s.carrier_changes, prev.carrier_changes)
            if changes is not None:  # alternating changes starting from the previous state
                kernel = (changes + 1) // 2 if prev.up else changes // 2
        added = max(observed, kernel or 0)
        self.flaps[name] += added
        return added


def sample_readings(s: PortSample, flaps: int) -> list[Reading]:
    """The readings of one port sample plus its flap count."""
    port, labels, ts, new = s.port.name, {"port": s.port.name}, time.time(), make_reading
    if s.up is None:
        out = [new(LINK_UP, math.nan, {"port": port, "kind": s.port.kind}, Quality.SENSOR_FAULT, ts)]
    else:
        out = [new(LINK_UP, 1.0 if s.up else 0.0, {"port": port, "kind": s.port.kind}, _OK, ts)]
    out.append(new(LINK_FLAPS, float(flaps), labels, _OK, ts))
    if s.carrier_changes is not None:
        out.append(new(LINK_CARRIER_CHANGES, float(s.carrier_changes), labels, _OK, ts))
    if s.speed_bps is not None:
        out.append(new(LINK_SPEED, s.speed_bps / 8, labels, _OK, ts))
    if s.ib_state is not None:
        out.append(new(LINK_IB_STATE, float(s.ib_state), labels, _OK, ts))
    if s.ib_phys_state is not None:
        out.append(new(LINK_IB_PHYS_STATE, float(s.ib_phys_state), labels, _OK, ts))
    for name, value in s.errors.items():
        out.append(new(LINK_ERRORS, float(value), {"port": port, "counter": name}, _OK, ts))
    for name, saturated in s.saturated.items():
        out.append(new(LINK_SATURATED, 1.0 if saturated else 0.0, {"port": port, "counter": name}, _OK, ts))
    for metric, value in s.traffic.items():
        out.append(new(TRAFFIC_SPECS[metric], float(value), labels, _OK, ts))
    out.extend(new(spec, math.nan, fault_labels, Quality.SENSOR_FAULT, ts) for spec, fault_labels in s.faults)
    return out


class LinkSource:
    """Source `links`: one poll reads every watched port's sysfs directory (in a worker thread)."""

    def __init__(self, ports: Iterable[Any], sysfs_root: Path | str = Path("/sys"), name: str = "links",
                 device: str = "ports", timeout: float = 2.0, counters_every: int = 1):
        self.name = name
        self.device = device
        self.ports: list[PortSpec] = as_port_specs(ports)
        self.reader = SysfsReader(sysfs_root)
        self.tracker = FlapTracker()
        self.timeout = timeout
        self.last_problems: list[str] = []  # what the last poll could not read, for logs and probe
        self._caller = BlockingCaller(f"{name}-{device}")
        # Error counters every `counters_every` polls (sources.links.counters_interval), by port: on an HCA each
        # counters/ file read is a query to the firmware, and they change rarely.
        self._held = HeldCounters(counters_every)
        self._polls = 0

    @property
    def counters_every(self) -> int:
        return self._held.every

    def _read_all(self, due: list[bool]) -> list[PortSample]:
        return [self.reader.read(p, counters) for p, counters in zip(self.ports, due)]

    def _counter_readings(self, s: PortSample, readings: list[Reading]) -> list[Reading]:
        """The port's error readings to give with this poll's: held ones between reads (kept fresh ones after a
        read); none for a port that could not be read, so its next poll reads them at once."""
        name = s.port.name
        if not s.present or s.up is None:
            self._held.forget(name)
            return []
        if s.counters_read:
            down = self.reader.ib_down_counter if s.port.kind == "ib" else None  # read every poll, never held
            kept = [r for r in readings if (r.spec is LINK_ERRORS or r.spec is LINK_SATURATED)
                    and r.labels.get("counter") != down]
            self._held.read(name, self._polls, kept)
            return []
        return self._held.again(name, self._polls)

    async def poll(self) -> PollResult:
        self._polls += 1  # first: a poll that fails still breaks every port's chain of held counters
        if not (self.reader.root / "class").is_dir():
            raise SourceError("config", f"links: {self.reader.root / 'class'} does not exist (sysfs_root)")
        due = [self._held.due(p.name, self._polls) for p in self.ports]  # all, when nothing is held (every poll)
        samples = await self._caller.call(self._read_all, due, timeout=self.timeout)
        readings: list[Reading] = []
        errors: dict[str, int] = {}
        self.last_problems = []
        for s in samples:
            self.tracker.update(s)
            fresh = sample_readings(s, self.tracker.flaps[s.port.name])
            readings.extend(fresh)
            if self.counters_every > 1:
                readings.extend(self._counter_readings(s, fresh))
            if s.problems:
                kind = "driver" if not s.present or s.up is None else "decode"
                errors[kind] = errors.get(kind, 0) + 1
                self.last_problems.extend(s.problems)
        return PollResult(readings, errors)

    async def close(self) -> None:
        self._caller.shutdown()
