"""Writes simulated transceiver EEPROM dumps in `ethtool -m` text layout.

The simulator's optics are served the way the agent reads real ones: as the
text ethtool prints (sff-common.c value formats, SFF-8636 labels for QSFP28,
CMIS labels for OSFP), so the agent's parser is the same for both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# Thresholds of the simulated modules (typical 100G-SR4 / 400G-DR4 datasheet values).
RX_LOW_ALARM_DBM = -13.5
RX_LOW_WARNING_DBM = -9.5
RX_HIGH_WARNING_DBM = 2.4
RX_HIGH_ALARM_DBM = 3.4
TX_LOW_ALARM_DBM = -8.0
TX_LOW_WARNING_DBM = -6.0
TX_HIGH_WARNING_DBM = 3.0
TX_HIGH_ALARM_DBM = 4.0
TEMP_THRESHOLDS_C = (75.0, -5.0, 70.0, 0.0)  # high alarm, low alarm, high warning, low warning
VOLT_THRESHOLDS_V = (3.63, 2.97, 3.465, 3.135)
BIAS_THRESHOLDS_MA = (13.0, 2.0, 12.0, 3.0)


@dataclass
class SimModule:
    """The DOM state of one simulated module."""

    layout: str = "sff8636"  # sff8636 (QSFP28, 4 lanes) or cmis (OSFP, 8 lanes)
    vendor: str = "SIMOPTICS"
    serial: str = "SIM0000001"
    temperature_c: float = 45.0
    voltage_v: float = 3.30
    rx_dbm: list[float] = field(default_factory=list)
    tx_dbm: list[float] = field(default_factory=list)
    bias_ma: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        lanes = 8 if self.layout == "cmis" else 4
        self.rx_dbm = self.rx_dbm or [-1.5] * lanes
        self.tx_dbm = self.tx_dbm or [-0.8] * lanes
        self.bias_ma = self.bias_ma or [7.5] * lanes


def _mw(dbm: float) -> float:
    return 0.0 if math.isinf(dbm) else 10 ** (dbm / 10)


def _pwr(dbm: float) -> str:
    return f"{_mw(dbm):.4f} mW / {'-inf' if math.isinf(dbm) else f'{dbm:.2f}'} dBm"


def _temp(c: float) -> str:
    return f"{c:.2f} degrees C / {c * 1.8 + 32:.2f} degrees F"


def _line(label: str, value: str) -> str:
    return f"\t{label:<41} : {value}"


def _flags(name: str, value: float, high_alarm: float, low_alarm: float, high_warn: float, low_warn: float,
           suffix: str = "") -> list[str]:
    on = lambda b: "On" if b else "Off"  # noqa: E731
    return [_line(f"{name} high alarm{suffix}", on(value >= high_alarm)),
            _line(f"{name} low alarm{suffix}", on(value <= low_alarm)),
            _line(f"{name} high warning{suffix}", on(value >= high_warn)),
            _line(f"{name} low warning{suffix}", on(value <= low_warn))]


def render(m: SimModule) -> str:
    """The module as `ethtool -m` would print it."""
    cmis = m.layout == "cmis"
    lanes = len(m.rx_dbm)
    lines = [_line("Identifier", "0x19 (OSFP 8X Pluggable Transceiver)" if cmis else "0x11 (QSFP28)"),
             _line("Connector", "0x0c (MPO 1x12)" if cmis else "0x0c (MPO Parallel Optic)"),
             _line("Transceiver type", "400GBASE-DR4" if cmis else "100G Ethernet: 100G Base-SR4 or 25GBase-SR"),
             _line("Vendor name", m.vendor), _line("Vendor PN", "SIM-OPT-1"), _line("Vendor SN", m.serial),
             _line("Module temperature", _temp(m.temperature_c)), _line("Module voltage", f"{m.voltage_v:.4f} V")]
    if not cmis:
        lines.append(_line("Alarm/warning flags implemented", "Yes"))
    rx_sep = " " if cmis else ""
    lines += [_line(f"Laser tx bias current (Channel {i + 1})", f"{b:.3f} mA") for i, b in enumerate(m.bias_ma)]
    lines += [_line(f"Transmit avg optical power (Channel {i + 1})", _pwr(p)) for i, p in enumerate(m.tx_dbm)]
    lines += [_line(f"Rcvr signal avg optical power{rx_sep}(Channel {i + 1})", _pwr(p)) for i, p in enumerate(m.rx_dbm)]
    mod_flags = (_flags("Module temperature", m.temperature_c, *TEMP_THRESHOLDS_C)
                 + _flags("Module voltage", m.voltage_v, *VOLT_THRESHOLDS_V))
    chan_flags: list[str] = []
    for i in range(lanes):
        chan_flags += _flags("Laser bias current", m.bias_ma[i], *BIAS_THRESHOLDS_MA, suffix=f"   (Chan {i + 1})")
    for i in range(lanes):
        chan_flags += _flags("Laser tx power", m.tx_dbm[i], TX_HIGH_ALARM_DBM, TX_LOW_ALARM_DBM, TX_HIGH_WARNING_DBM,
                             TX_LOW_WARNING_DBM, suffix=f"   (Channel {i + 1})")
    for i in range(lanes):
        chan_flags += _flags("Laser rx power", m.rx_dbm[i], RX_HIGH_ALARM_DBM, RX_LOW_ALARM_DBM, RX_HIGH_WARNING_DBM,
                             RX_LOW_WARNING_DBM, suffix=f"   (Channel {i + 1})")
    lines += (mod_flags + chan_flags) if cmis else (chan_flags[: 4 * lanes] + mod_flags + chan_flags[4 * lanes:])
    names = ("high alarm", "low alarm", "high warning", "low warning")
    lines += [_line(f"Laser bias current {n} threshold", f"{v:.3f} mA") for n, v in zip(names, BIAS_THRESHOLDS_MA)]
    tx = (TX_HIGH_ALARM_DBM, TX_LOW_ALARM_DBM, TX_HIGH_WARNING_DBM, TX_LOW_WARNING_DBM)
    lines += [_line(f"Laser output power {n} threshold", _pwr(v)) for n, v in zip(names, tx)]
    lines += [_line(f"Module temperature {n} threshold", _temp(v)) for n, v in zip(names, TEMP_THRESHOLDS_C)]
    lines += [_line(f"Module voltage {n} threshold", f"{v:.4f} V") for n, v in zip(names, VOLT_THRESHOLDS_V)]
    rx = (RX_HIGH_ALARM_DBM, RX_LOW_ALARM_DBM, RX_HIGH_WARNING_DBM, RX_LOW_WARNING_DBM)
    lines += [_line(f"Laser rx power {n} threshold", _pwr(v)) for n, v in zip(names, rx)]
    return "\n".join(lines) + "\n"
