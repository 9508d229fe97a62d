"""Readings derived from a CDU's own readings: heat removed, dew point and margin, approach, flow per watt.

Why apart from the collector: the agent computes flow per watt with rack power
from the PDUs, a different source; the physics itself is exporters/cooling/coolant.py.
"""

from __future__ import annotations

import time

from exporters.cooling import coolant as cool
from exporters.cooling import modbus_metrics as mm
from exporters.model import Reading


def _find(readings: list[Reading], spec, **labels: str) -> float | None:
    for r in readings:
        if r.spec is spec and r.ok and all(r.label(k) == v for k, v in labels.items()):
            return r.value
    return None


def derived_readings(cdu: str, readings: list[Reading], coolant: cool.CoolantProperties = cool.PG25,
                     rack_power_w: float | None = None, now: float | None = None) -> list[Reading]:
    """Heat removed, dew point (unless reported), dew-point margin, approach, flow per watt.

    Only OK inputs are used: a derived value never hides a sensor fault
    behind a plausible number; it is simply absent.
    """
    ts = time.time() if now is None else now
    lab = {"cdu": cdu}
    out: list[Reading] = []
    flow = _find(readings, mm.FLOW, loop="secondary")
    s_sup = _find(readings, mm.TEMPERATURE, loop="secondary", point="supply")
    s_ret = _find(readings, mm.TEMPERATURE, loop="secondary", point="return")
    p_sup = _find(readings, mm.TEMPERATURE, loop="primary", point="supply")
    if flow is not None and s_sup is not None and s_ret is not None:
        out.append(Reading(mm.HEAT_REMOVED, cool.heat_removed_w(flow, s_sup, s_ret, coolant), lab, timestamp=ts))
    dew = _find(readings, mm.DEW_POINT)
    if dew is None:
        amb, rh = _find(readings, mm.AMBIENT_TEMP), _find(readings, mm.AMBIENT_HUMIDITY)
        if amb is not None and rh is not None and 0 < rh <= 1:
            dew = cool.dew_point_c(amb, rh)
            out.append(Reading(mm.DEW_POINT, dew, lab, timestamp=ts))
    if dew is not None and s_sup is not None:
        out.append(Reading(mm.DEW_MARGIN, cool.dew_point_margin_c(s_sup, dew), lab, timestamp=ts))
    if s_sup is not None and p_sup is not None:
        out.append(Reading(mm.APPROACH, cool.approach_c(s_sup, p_sup), lab, timestamp=ts))
    if flow is not None and rack_power_w is not None:
        fpp = cool.flow_per_power(flow, rack_power_w)
        if fpp is not None:
            out.append(Reading(mm.FLOW_PER_POWER, fpp, lab, timestamp=ts))
    return out


def flow_per_power_reading(cdu: str, flow_m3s: float, rack_power_w: float, now: float | None = None) -> Reading | None:
    """For the agent side: the flow-per-power reading once the PDUs report rack power."""
    fpp = cool.flow_per_power(flow_m3s, rack_power_w)
    if fpp is None:
        return None
    return Reading(mm.FLOW_PER_POWER, fpp, {"cdu": cdu}, timestamp=time.time() if now is None else now)
