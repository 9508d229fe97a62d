"""Detectors of the network links: optic receive power, link flaps, symbol errors.

Why apart: these read the links source (sysfs counters, ethtool -m) and target
a port; a degraded optic is a warning of its own, unrelated to the GPUs' NVLink.
"""

from __future__ import annotations

from typing import Iterator

from agent.snapshot import Snapshot

from .detectors_base import DetectorBase
from .hysteresis import Observation, targets_of


class OpticDetectors(DetectorBase):
    """Optics and links, methods of the detector table (`Detectors`)."""

    def _optic(self, snap: Snapshot) -> Iterator[Observation]:
        s = self.s
        why: dict[str, list[str]] = {}
        rx_low: dict[str, float] = {}  # port -> its first ok rx_low_warning threshold (what snap.value gives)
        for r in snap.select("supernode_optic_threshold_dbm", kind="rx_low_warning"):
            if r.ok:
                rx_low.setdefault(r.label("port"), r.value)
        for item in self._ok_or_fault(snap.select("supernode_optic_rx_power_dbm")):
            if isinstance(item, Observation):
                yield item
                continue
            port = item.label("port")
            warn = rx_low.get(port)
            why.setdefault(port, [])
            if warn is not None and item.value < warn + s.optic_rx_margin_db:
                why[port].append(f"rx lane {item.label('lane')} {item.value:.2f} dBm < {warn:.2f}")
        for r in snap.select("supernode_link_flaps_total"):
            if not r.ok:
                continue
            port = r.label("port")
            why.setdefault(port, [])
            hist = self.flaps.setdefault(port, [])
            if not hist or hist[-1][1] != r.value:
                hist.append((snap.monotonic, r.value))
            window = [v for t, v in hist if snap.monotonic - t <= s.optic_flap_window_seconds]
            hist[:] = [(t, v) for t, v in hist if snap.monotonic - t <= s.optic_flap_window_seconds] or hist[-1:]
            if len(window) >= 2 and window[-1] - window[0] >= s.optic_flaps:
                why[port].append(f"{int(window[-1] - window[0])} flaps")
        for r in snap.select("supernode_link_errors_total", counter="symbol_error"):
            if not r.ok:
                continue
            port = r.label("port")
            why.setdefault(port, [])
            rate = self.rates.rate(r)
            if rate is not None and rate > s.optic_symbol_error_rate_per_second:
                why[port].append(f"symbol errors {rate:.1f}/s")
        for port, reasons in why.items():
            yield Observation("optic_degraded", targets_of(port=port), "warning", bool(reasons),
                              detail={"why": reasons})
