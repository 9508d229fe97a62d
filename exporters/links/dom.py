"""Transceiver DOM (digital optical monitoring) from `ethtool -m`, on its own slow schedule.

Reading a module's EEPROM takes about 0.1 s, so DOM is a source of its own
(`dom`), polled less often than port state and never in its way. Modules are
read concurrently with a bound and a per-module timeout: one slow or broken
module yields its own partial error and never fails the whole source.

The parser reads ethtool's text layout (SFF-8472 SFP, SFF-8636 QSFP+/QSFP28,
CMIS QSFP-DD/OSFP); which labels mean what is in
profiles/links/ethtool_dom.yaml. It is defensive: unknown lines are ignored,
an unparseable value is counted and reported as a sensor fault of that one
reading, dark lanes (`-inf dBm`) are kept as -Inf, and a module without DOM
says so instead of failing.

The text is untrusted (issue 18: a 5,000-space line made the old line regex
backtrack for 39 s on the event loop): lines are split at their first colon
and values tokenised on whitespace, so parsing is linear in the text; it runs
in a worker thread inside the per-module timeout; `+inf`, NaN and numbers too
large for a float are faults, only `-inf dBm` (a dark lane) is a value.
"""

from __future__ import annotations

import asyncio
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Protocol

from exporters.links.links_profile import ProfileError, load_links_profile, require
from exporters.model import PollResult, Quality, Reading, SourceError, gauge, info
from exporters.links.ports import PortSpec, as_port_specs

OPTIC_RX = gauge("supernode_optic_rx_power_dbm", "Transceiver received optical power per lane, dBm (-Inf: dark lane).",
                 ("port", "lane"), unit="dbm")
OPTIC_TX = gauge("supernode_optic_tx_power_dbm", "Transceiver transmitted optical power per lane, dBm (-Inf: dark lane).",
                 ("port", "lane"), unit="dbm")
OPTIC_BIAS = gauge("supernode_optic_tx_bias_amperes", "Transceiver laser bias current per lane, amperes.",
                   ("port", "lane"), unit="amperes")
OPTIC_TEMP = gauge("supernode_optic_temperature_celsius", "Transceiver module temperature, degrees Celsius.",
                   ("port",), unit="celsius")
OPTIC_VOLT = gauge("supernode_optic_voltage_volts", "Transceiver module supply voltage, volts.", ("port",), unit="volts")
OPTIC_ALARM = gauge("supernode_optic_alarm_active",
                    "Transceiver alarm/warning flag raised (1) or not (0); alarm=<quantity>_<high|low>_<alarm|warning>, "
                    "lane empty for module-wide flags.", ("port", "alarm", "lane"))
OPTIC_ALARMS_READ = gauge("supernode_optic_alarms_read",
                          "1 when this poll read the module's alarm and warning flags, 0 when the module gave none: with "
                          "supernode_optic_alarm_active exported only for raised flags by default (metrics.detail: "
                          "optic_alarms for every flag), 1 and no alarm series means no alarm, 0 or no series means unknown.",
                          ("port",))
OPTIC_THRESHOLD_DBM = gauge("supernode_optic_threshold_dbm",
                            "Transceiver's own optical power threshold, dBm; kind=<rx|tx>_<low|high>_<alarm|warning>.",
                            ("port", "kind"), unit="dbm")
OPTIC_THRESHOLD_C = gauge("supernode_optic_temperature_threshold_celsius",
                          "Transceiver's own temperature threshold, degrees Celsius; kind=<low|high>_<alarm|warning>.",
                          ("port", "kind"), unit="celsius")
OPTIC_THRESHOLD_V = gauge("supernode_optic_voltage_threshold_volts",
                          "Transceiver's own supply voltage threshold, volts; kind=<low|high>_<alarm|warning>.",
                          ("port", "kind"), unit="volts")
OPTIC_THRESHOLD_A = gauge("supernode_optic_tx_bias_threshold_amperes",
                          "Transceiver's own laser bias threshold, amperes; kind=<low|high>_<alarm|warning>.",
                          ("port", "kind"), unit="amperes")
OPTIC_DOM = gauge("supernode_optic_dom_supported",
                  "1 when the port's transceiver reports DOM values, 0 when it has none or its EEPROM is unreadable.",
                  ("port",))
OPTIC_INFO = info("supernode_optic_info", "Transceiver identity from its EEPROM (value 1).",
                  ("port", "identifier", "vendor", "part_number", "serial", "connector", "transceiver"))

METRICS = (OPTIC_RX, OPTIC_TX, OPTIC_BIAS, OPTIC_TEMP, OPTIC_VOLT, OPTIC_ALARM, OPTIC_ALARMS_READ, OPTIC_THRESHOLD_DBM,
           OPTIC_THRESHOLD_C, OPTIC_THRESHOLD_V, OPTIC_THRESHOLD_A, OPTIC_DOM, OPTIC_INFO)

_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")  # fullmatch on one short token: no backtracking to speak of
MAX_LINE = 1024  # ethtool's lines are under 100 characters; a longer one is not ethtool's
MAX_TOKEN = 64
# quantity -> (unit words after the number, factor to base units); power reads dBm, else mW.
_UNITS = {"tx_bias": (("mA",), 1e-3), "temperature": (("degrees", "C"), 1.0), "voltage": (("V",), 1.0)}


@dataclass(frozen=True, slots=True)
class Flag:
    quantity: str
    level: str  # high / low
    severity: str  # alarm / warning
    lane: str  # "" for module-wide flags
    on: bool

    @property
    def alarm(self) -> str:
        return f"{self.quantity}_{self.level}_{self.severity}"


@dataclass
class ModuleDom:
    """What one `ethtool -m` output says about one module."""

    info: dict[str, str] = field(default_factory=dict)
    temperature: float | None = None
    voltage: float | None = None
    lanes: dict[str, dict[str, float]] = field(default_factory=dict)  # quantity -> lane -> value (base units / dBm)
    flags: list[Flag] = field(default_factory=list)
    thresholds: dict[tuple[str, str, str], float] = field(default_factory=dict)  # (quantity, level, severity)
    no_dom_declared: bool = False
    bad_fields: list[str] = field(default_factory=list)  # labels whose value could not be parsed
    faults: set[tuple[str, str]] = field(default_factory=set)  # (quantity, lane) of monitored values that failed

    @property
    def has_dom(self) -> bool:
        return not self.no_dom_declared and (self.temperature is not None or any(self.lanes.values()))


class _DomLayout:
    """The compiled ethtool_dom profile."""

    def __init__(self, data: dict[str, Any]):
        where = "profiles/links/ethtool_dom.yaml"
        try:
            self.monitors = [(re.compile(m["pattern"]), m["quantity"]) for m in require(data, "monitors", list, where)]
            self.flags = re.compile(require(data, "flags", str, where))
            self.thresholds = re.compile(require(data, "thresholds", str, where))
        except (KeyError, TypeError, re.error) as exc:
            raise ProfileError(f"{where}: bad pattern entry: {exc}") from None
        self.quantities: dict[str, str] = require(data, "quantities", dict, where)
        self.info: dict[str, str] = require(data, "info", dict, where)
        self.no_dom: dict[str, str] = require(data, "no_dom", dict, where)
        self.unsupported: list[str] = require(data, "unsupported_messages", list, where)


_layout: _DomLayout | None = None


def _get_layout() -> _DomLayout:
    global _layout
    if _layout is None:
        _layout = _DomLayout(load_links_profile("ethtool_dom"))
    return _layout


def _number_before(tokens: list[str], unit: tuple[str, ...]) -> tuple[bool, float | None]:
    """(unit found, the number written just before it or glued to it; None when that is not a finite number)."""
    n = len(unit)
    for i, tok in enumerate(tokens):
        if tok.endswith(unit[0]) and tuple(tokens[i + 1:i + n]) == unit[1:]:
            glued = tok[:-len(unit[0])]
            text = glued if glued else (tokens[i - 1] if i else "")
            if len(text) > MAX_TOKEN:
                return True, None
            if unit == ("dBm",) and text.lower() == "-inf":
                return True, -math.inf  # a dark lane: the only infinite value that means something
            if not _NUMBER.fullmatch(text):
                return True, None
            v = float(text)
            return True, v if math.isfinite(v) else None
    return False, None


def _parse_power(tokens: list[str]) -> float | None:
    found, dbm = _number_before(tokens, ("dBm",))
    if found:  # a malformed dBm value is a fault even when the mW one reads well: the two disagree
        return dbm
    _, mw = _number_before(tokens, ("mW",))
    if mw is None:
        return None
    return 10 * math.log10(mw) if mw > 0 else -math.inf


def _parse_value(quantity: str, value: str) -> float | None:
    """A value in base units (power in dBm); None when the text holds no well-formed finite one."""
    tokens = value.split()
    if quantity in ("tx_power", "rx_power"):
        return _parse_power(tokens)
    unit, scale = _UNITS[quantity]
    _, v = _number_before(tokens, unit)
    return None if v is None else v * scale


def parse_module(text: str) -> ModuleDom:
    """Parse one `ethtool -m` output in linear time; never raises on odd content (bad values land in `bad_fields`)."""
    layout = _get_layout()
    dom = ModuleDom()
    info_keys = {label: key for key, label in layout.info.items()}
    for raw in text.splitlines():
        key, sep, value = raw.partition(":")
        label = key.strip()
        if not sep or not label:
            continue
        if len(raw) > MAX_LINE:
            dom.bad_fields.append(label[:40])
            continue
        value = value.strip()
        if label in info_keys:
            dom.info.setdefault(info_keys[label], value)
            continue
        if label == layout.no_dom.get("label"):
            dom.no_dom_declared = value == layout.no_dom.get("value")
            continue
        if _parse_monitor(layout, dom, label, value) or _parse_flag(layout, dom, label, value):
            continue
        _parse_threshold(layout, dom, label, value)
    return dom


def _parse_monitor(layout: _DomLayout, dom: ModuleDom, label: str, value: str) -> bool:
    for pattern, quantity in layout.monitors:
        m = pattern.match(label)
        if not m:
            continue
        parsed = _parse_value(quantity, value)
        if parsed is None:
            dom.bad_fields.append(label)
            lane = "" if quantity in ("temperature", "voltage") else m.groupdict().get("lane") or "1"
            dom.faults.add((quantity, lane))
        elif quantity == "temperature":
            dom.temperature = parsed
        elif quantity == "voltage":
            dom.voltage = parsed
        else:
            dom.lanes.setdefault(quantity, {})[m.groupdict().get("lane") or "1"] = parsed
        return True
    return False


def _parse_flag(layout: _DomLayout, dom: ModuleDom, label: str, value: str) -> bool:
    m = layout.flags.match(label)
    if not m:
        return False
    if value not in ("On", "Off"):
        dom.bad_fields.append(label)
        return True
    dom.flags.append(Flag(layout.quantities.get(m.group("quantity"), m.group("quantity")), m.group("level"),
                          m.group("severity"), m.group("lane") or "", value == "On"))
    return True


def _parse_threshold(layout: _DomLayout, dom: ModuleDom, label: str, value: str) -> None:
    m = layout.thresholds.match(label)
    if not m:
        return
    quantity = layout.quantities.get(m.group("quantity"), m.group("quantity"))
    parsed = _parse_value(quantity, value)
    if parsed is None:
        dom.bad_fields.append(label)
    elif not math.isinf(parsed):  # an unset power threshold reads 0 mW / -inf dBm: no threshold
        dom.thresholds[(quantity, m.group("level"), m.group("severity"))] = parsed


def module_readings(port: str, dom: ModuleDom) -> list[Reading]:
    """The readings of one parsed module, labelled with the watched port's name."""
    out = [Reading(OPTIC_DOM, 1.0 if dom.has_dom else 0.0, {"port": port})]
    if dom.info:
        labels = {"port": port, **{k: dom.info.get(k, "") for k in OPTIC_INFO.labels if k != "port"}}
        out.append(Reading(OPTIC_INFO, 1.0, labels))
    if not dom.has_dom:
        return out
    if dom.temperature is not None:
        out.append(Reading(OPTIC_TEMP, dom.temperature, {"port": port}))
    if dom.voltage is not None:
        out.append(Reading(OPTIC_VOLT, dom.voltage, {"port": port}))
    for quantity, spec in (("rx_power", OPTIC_RX), ("tx_power", OPTIC_TX), ("tx_bias", OPTIC_BIAS)):
        for lane, value in sorted(dom.lanes.get(quantity, {}).items(), key=lambda kv: int(kv[0])):
            out.append(Reading(spec, value, {"port": port, "lane": lane}))
    for quantity, lane in sorted(dom.faults):  # a value the module printed but that is not a well-formed one
        spec = {"rx_power": OPTIC_RX, "tx_power": OPTIC_TX, "tx_bias": OPTIC_BIAS, "temperature": OPTIC_TEMP,
                "voltage": OPTIC_VOLT}[quantity]
        labels = {"port": port, "lane": lane} if lane else {"port": port}
        out.append(Reading(spec, math.nan, labels, Quality.SENSOR_FAULT))
    out.append(Reading(OPTIC_ALARMS_READ, 1.0 if dom.flags else 0.0, {"port": port}))
    for flag in dom.flags:
        out.append(Reading(OPTIC_ALARM, 1.0 if flag.on else 0.0, {"port": port, "alarm": flag.alarm, "lane": flag.lane}))
    for (quantity, level, severity), value in sorted(dom.thresholds.items()):
        if quantity in ("rx_power", "tx_power"):
            spec, kind = OPTIC_THRESHOLD_DBM, f"{quantity.split('_')[0]}_{level}_{severity}"
        else:
            spec = {"temperature": OPTIC_THRESHOLD_C, "voltage": OPTIC_THRESHOLD_V, "tx_bias": OPTIC_THRESHOLD_A}[quantity]
            kind = f"{level}_{severity}"
        out.append(Reading(spec, value, {"port": port, "kind": kind}))
    return out


# -- readers --------------------------------------------------------------------------


class ModuleUnsupported(Exception):
    """The interface gives no module EEPROM (no cage, empty cage, virtual NIC): no DOM, not an error."""


class ModuleReadError(Exception):
    """Reading one module failed; `kind` is a SourceError kind (driver, decode, config)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class DomReader(Protocol):
    async def read(self, netdev: str) -> str:
        """The `ethtool -m` text for `netdev`; raises ModuleUnsupported or ModuleReadError."""
        ...


class EthtoolReader:
    """Runs `ethtool -m <netdev>` (argument list, no shell). The caller bounds its time."""

    def __init__(self, binary: str = "ethtool"):
        self.binary = binary

    async def read(self, netdev: str) -> str:
        try:
            proc = await asyncio.create_subprocess_exec(self.binary, "-m", netdev, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        except FileNotFoundError:
            raise ModuleReadError("config", f"ethtool binary {self.binary!r} not found") from None
        try:
            out, err = await proc.communicate()
        except asyncio.CancelledError:  # timed out by the caller: do not leave ethtool behind
            if proc.returncode is None:
                proc.kill()
            raise
        if proc.returncode != 0:
            message = err.decode(errors="replace").strip() or f"exit status {proc.returncode}"
            if any(s.lower() in message.lower() for s in _get_layout().unsupported):
                raise ModuleUnsupported(f"{netdev}: {message}")
            raise ModuleReadError("driver", f"ethtool -m {netdev}: {message}")
        return out.decode(errors="replace")


class DirReader:
    """Reads `<dom_dir>/<netdev>.txt`: ethtool -m output written by the simulator (or a capture)."""

    def __init__(self, dom_dir: Path | str):
        self.dom_dir = Path(dom_dir)

    async def read(self, netdev: str) -> str:
        path = self.dom_dir / f"{netdev}.txt"
        try:
            return path.read_text(errors="replace")
        except FileNotFoundError:
            raise ModuleUnsupported(f"{path}: no module") from None
        except OSError as exc:
            raise ModuleReadError("driver", f"{path}: {exc.strerror}") from None


def make_reader(dom_dir: Path | str | None = None, ethtool: str = "ethtool") -> DomReader:
    """The configured reader: files in `dom_dir` when set (simulator), else the ethtool binary."""
    return DirReader(dom_dir) if dom_dir else EthtoolReader(ethtool)


class DomSource:
    """Source `dom`: one poll reads every watched module, concurrently, each within its own timeout."""

    def __init__(self, ports: Iterable[Any], reader: DomReader, name: str = "dom", device: str = "ports",
                 concurrency: int = 4, module_timeout: float = 2.0):
        if concurrency < 1:
            raise ValueError("dom: concurrency must be at least 1")
        if module_timeout <= 0:
            raise ValueError("dom: module_timeout must be positive")
        self.name = name
        self.device = device
        self.ports: list[PortSpec] = as_port_specs(ports)
        self.reader = reader
        self.module_timeout = module_timeout
        self._concurrency = concurrency
        self.last_errors: list[str] = []  # messages of the last poll's failed modules, for logs and probe

    async def _read_one(self, port: PortSpec, gate: asyncio.Semaphore) -> tuple[list[Reading], str | None, str]:
        netdev = port.dom_netdev
        if netdev is None:  # an IB port without a netdev in the inventory: no way to ask ethtool
            return [Reading(OPTIC_DOM, 0.0, {"port": port.name})], None, ""
        async with gate:
            try:
                async with asyncio.timeout(self.module_timeout):
                    dom = await self._read_and_parse(netdev)
            except asyncio.TimeoutError:
                return [], "timeout", f"{port.name}: module read exceeded {self.module_timeout:.1f}s"
            except ModuleUnsupported:
                return [Reading(OPTIC_DOM, 0.0, {"port": port.name})], None, ""
            except ModuleReadError as exc:
                return [], exc.kind, f"{port.name}: {exc}"
        kind = "decode" if dom.bad_fields else None
        return module_readings(port.name, dom), kind, f"{port.name}: unparseable {dom.bad_fields}" if kind else ""

    async def _read_and_parse(self, netdev: str) -> ModuleDom:
        """Read and parse one module: both inside the module's timeout, the parse off the event loop."""
        text = await self.reader.read(netdev)
        return await asyncio.to_thread(parse_module, text)

    async def poll(self) -> PollResult:
        gate = asyncio.Semaphore(self._concurrency)
        results = await asyncio.gather(*(self._read_one(p, gate) for p in self.ports))
        readings: list[Reading] = []
        errors: dict[str, int] = {}
        self.last_errors = [msg for _, kind, msg in results if kind]
        for rs, kind, _ in results:
            readings.extend(rs)
            if kind:
                errors[kind] = errors.get(kind, 0) + 1
        if self.ports and not readings and set(errors) == {"config"}:
            raise SourceError("config", self.last_errors[0])
        return PollResult(readings, errors)

    async def close(self) -> None:
        return None
