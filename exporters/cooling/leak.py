"""What every leak source means by a reading, whichever protocol brought it (Modbus, SNMP).

A leak input whose cable is broken or contaminated, or whose controller lost
it, cannot say "wet": its leak reading becomes `sensor_fault`, never
`supernode_leak_detected 1` on its own (ARCHITECTURE.md rule 3).
"""

from __future__ import annotations

from exporters.cooling import modbus_metrics as mm
from exporters.model import Quality, Reading

LEAK_METRICS = frozenset({mm.LEAK_DETECTED.name, mm.LEAK_FAULT.name, mm.LEAK_LOCATION.name})


def apply_leak_faults(readings: list[Reading]) -> list[Reading]:
    """A leak input with an active cable-break/contamination/comm-loss fault (or an unreadable fault) cannot report
    a leak: its leak reading turns `sensor_fault`."""
    faulty = {(r.label("zone"), r.label("sensor")) for r in readings
              if r.spec is mm.LEAK_FAULT and (r.value >= 1 or not r.ok)}
    if not faulty:
        return readings
    out = []
    for r in readings:
        if r.spec is mm.LEAK_DETECTED and r.ok and (r.label("zone"), r.label("sensor")) in faulty:
            r = Reading(r.spec, r.value, r.labels, Quality.SENSOR_FAULT, r.timestamp)
        out.append(r)
    return out
