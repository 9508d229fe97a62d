"""Derived coolant readings: pure functions of what the CDU and the PDUs report.

Kept free of I/O so the agent can call them with readings from different
sources (flow from the CDU, rack power from the PDUs) and tests can check
them against hand-computed values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class CoolantProperties:
    """Density (kg/m^3) and specific heat (J/(kg K)) of the secondary-loop coolant.

    Default PG25 (25 % propylene glycol) near 30 C: ~1020-1030 kg/m^3 and
    ~3.9 kJ/(kg K); DEVICES.md section 7 quotes 1030, the simulator uses 1020.
    """
    density_kg_m3: float = 1025.0
    heat_capacity_j_kgk: float = 3900.0
    name: str = "PG25"


PG25 = CoolantProperties()

# Magnus coefficients (Alduchov & Eskridge 1996), valid -45..60 C over water.
_MAGNUS_B = 17.625
_MAGNUS_C = 243.04


def heat_removed_w(flow_m3s: float, supply_c: float, return_c: float, coolant: CoolantProperties = PG25) -> float:
    """Heat carried by a loop: Q = flow x density x heat capacity x (return - supply), in watts."""
    return flow_m3s * coolant.density_kg_m3 * coolant.heat_capacity_j_kgk * (return_c - supply_c)


def dew_point_c(temp_c: float, relative_humidity: float) -> float:
    """Dew point (Magnus formula) from air temperature and relative humidity as a ratio (0-1]."""
    if not 0.0 < relative_humidity <= 1.0:
        raise ValueError(f"relative humidity must be in (0, 1], got {relative_humidity}")
    gamma = math.log(relative_humidity) + _MAGNUS_B * temp_c / (_MAGNUS_C + temp_c)
    return _MAGNUS_C * gamma / (_MAGNUS_B - gamma)


def dew_point_margin_c(secondary_supply_c: float, dew_point: float) -> float:
    """How far the coolant supply stays above the room dew point (condensation below ~2 C)."""
    return secondary_supply_c - dew_point


def approach_c(secondary_supply_c: float, primary_supply_c: float) -> float:
    """Heat-exchanger approach: secondary supply minus primary supply (rises as the HX fouls)."""
    return secondary_supply_c - primary_supply_c


def flow_per_power(flow_m3s: float, rack_power_w: float) -> float | None:
    """Secondary flow per watt of rack power (m^3/s per W); None when power is unknown or zero.

    1.5 L/min per kW, the usual sizing for a 10 C rise, is 2.5e-8.
    """
    if rack_power_w <= 0:
        return None
    return flow_m3s / rack_power_w
