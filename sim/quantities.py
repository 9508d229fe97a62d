"""The rack model's coolant quantities by name, in base units: one vocabulary for every simulated cooling device.

The Modbus devices (sim/modbus_bindings/) and the Redfish CDU
(sim/redfish/bindings/) name these quantities in their binding files,
so the two protocols show the very same loop: a value a Modbus CDU serves
and the one a Redfish CDU serves come from one reader here.
"""

from __future__ import annotations

import math
from typing import Callable

from sim.rack import CoolantState, RackModel

LEAK_DISTANCE_M = 12.5  # where along the rope the simulated leak is


def _dew_point(c: CoolantState) -> float:
    rh = max(min(c.humidity_pct / 100.0, 1.0), 0.01)
    g = math.log(rh) + 17.625 * c.ambient_c / (243.04 + c.ambient_c)
    return 243.04 * g / (17.625 - g)


def _pump(i: str) -> int:
    return int(i) - 1


# Model quantity -> value in base units (Celsius, m^3/s, Pa, ratio, metres, 0/1).
# Quantities taking a pump number are written "pump_speed.2"; leak and valve
# quantities use the point's channel, mapped to a model leak zone.
READERS: dict[str, Callable[[RackModel, str, str | None], float]] = {
    "secondary_supply_c": lambda m, a, z: m.coolant.secondary_supply_c,
    "secondary_return_c": lambda m, a, z: m.coolant.secondary_return_c,
    "primary_supply_c": lambda m, a, z: m.coolant.primary_supply_c,
    "primary_return_c": lambda m, a, z: m.coolant.primary_return_c,
    "secondary_delta_c": lambda m, a, z: m.coolant.secondary_return_c - m.coolant.secondary_supply_c,
    "primary_delta_c": lambda m, a, z: m.coolant.primary_return_c - m.coolant.primary_supply_c,
    "supply_setpoint": lambda m, a, z: m.coolant.secondary_supply_setpoint_c,
    "flow": lambda m, a, z: m.coolant.flow_lpm / 60000.0,
    "primary_flow": lambda m, a, z: m.coolant.nominal_flow_lpm * 0.9 / 60000.0,
    "supply_pressure": lambda m, a, z: m.coolant.supply_pressure_pa,
    "return_pressure": lambda m, a, z: m.coolant.return_pressure_pa,
    "delta_pressure": lambda m, a, z: m.coolant.supply_pressure_pa - m.coolant.return_pressure_pa,
    "filter_dp": lambda m, a, z: m.coolant.filter_dp_pa,
    "heat": lambda m, a, z: m.heat_w(),  # W the loop carries away (the GPUs' power)
    "pump_speed": lambda m, a, z: m.coolant.pump_actual_speed(_pump(a)),
    "pump_running": lambda m, a, z: float(m.coolant.pump_running[_pump(a)]),
    "pump_setpoint": lambda m, a, z: sum(m.coolant.pump_speed) / len(m.coolant.pump_speed),
    "reservoir": lambda m, a, z: m.coolant.reservoir_level,
    "ambient_c": lambda m, a, z: m.coolant.ambient_c,
    "humidity": lambda m, a, z: m.coolant.humidity_pct / 100.0,
    "valve": lambda m, a, z: float(m.coolant.valve_open.get(z, True)) if z else 1.0,
    "leak.wet": lambda m, a, z: float(m.coolant.leak_zones.get(z) == "wet"),
    "leak.cable_break": lambda m, a, z: float(m.coolant.leak_zones.get(z) == "cable_break"),
    "leak.contamination": lambda m, a, z: float(m.coolant.leak_zones.get(z) == "contamination"),
    "leak.comm_loss": lambda m, a, z: float(m.coolant.leak_zones.get(z) == "comm_loss"),
    "leak.distance": lambda m, a, z: LEAK_DISTANCE_M if m.coolant.leak_zones.get(z) == "wet" else 0.0,
    "alarm.pump_fail": lambda m, a, z: float(not all(m.coolant.pump_running)),
    "alarm.low_flow": lambda m, a, z: float(m.coolant.flow_lpm < 0.5 * m.coolant.nominal_flow_lpm),
    "alarm.supply_high": lambda m, a, z: float(m.coolant.secondary_supply_c > m.coolant.secondary_supply_setpoint_c + 3),
    "alarm.reservoir_low": lambda m, a, z: float(m.coolant.reservoir_level < 0.3),
    "alarm.leak": lambda m, a, z: float(any(s == "wet" for s in m.coolant.leak_zones.values())),
    "alarm.condensation": lambda m, a, z: float(m.coolant.secondary_supply_c < _dew_point(m.coolant)),
}
