"""Metric families the Modbus collectors fill (CDU and leak rows of METRICS.md).

Profiles name these families by their exposition name; the profile loader
checks every name and label set against this table, so a typo in a YAML file
fails at load, not as a missing series on a dashboard.
"""

from __future__ import annotations

from typing import Mapping

from exporters.model import MetricSpec, counter, gauge, info

CDU_INFO = info("supernode_cdu_info", "Static facts of a coolant distribution unit (value 1).",
                ["cdu", "vendor", "model", "firmware", "profile"])
TEMPERATURE = gauge("supernode_cdu_temperature_celsius", "Coolant temperature in degrees Celsius, polled.",
                    ["cdu", "loop", "point"], "celsius")
FLOW = gauge("supernode_cdu_flow_cubic_meters_per_second", "Coolant flow in cubic metres per second, polled.",
             ["cdu", "loop"], "cubic_meters_per_second")
PRESSURE = gauge("supernode_cdu_pressure_pascals", "Coolant pressure in pascals, polled.",
                 ["cdu", "loop", "point"], "pascals")
PUMP_RUNNING = gauge("supernode_cdu_pump_running", "1 when the pump runs, polled.", ["cdu", "pump"])
PUMP_SPEED = gauge("supernode_cdu_pump_speed_ratio", "Pump speed as a ratio of full speed (0-1), polled.",
                   ["cdu", "pump"], "ratio")
PUMP_SETPOINT = gauge("supernode_cdu_pump_speed_setpoint_ratio",
                      "Pump speed set point as a ratio of full speed (0-1), polled.", ["cdu"], "ratio")
SUPPLY_SETPOINT = gauge("supernode_cdu_supply_temperature_setpoint_celsius",
                        "Secondary supply temperature set point in degrees Celsius, polled.", ["cdu"], "celsius")
RESERVOIR = gauge("supernode_cdu_reservoir_level_ratio", "Reservoir fill level as a ratio (0-1), polled.",
                  ["cdu"], "ratio")
AMBIENT_TEMP = gauge("supernode_cdu_ambient_temperature_celsius",
                     "Room air temperature at the CDU in degrees Celsius, polled.", ["cdu"], "celsius")
AMBIENT_HUMIDITY = gauge("supernode_cdu_ambient_humidity_ratio",
                         "Room relative humidity at the CDU as a ratio (0-1), polled.", ["cdu"], "ratio")
VALVE_OPEN = gauge("supernode_cdu_valve_open", "1 when the zone isolation valve is open, polled.", ["cdu", "zone"])
FAN_SPEED = gauge("supernode_cdu_fan_speed_rpm", "Fan speed in revolutions per minute, polled.", ["cdu", "fan"], "rpm")
VALVE_POSITION = gauge("supernode_cdu_valve_position_ratio", "Control valve position as a ratio (0-1), polled.",
                       ["cdu"], "ratio")
HEAT_REMOVED = gauge("supernode_cdu_heat_removed_watts",
                     "Heat carried off by the secondary loop in watts: flow x density x heat capacity x (return - supply).",
                     ["cdu"], "watts")
DEW_POINT = gauge("supernode_cdu_dew_point_celsius",
                  "Room dew point in degrees Celsius, from the CDU or from ambient temperature and humidity (Magnus).",
                  ["cdu"], "celsius")
DEW_MARGIN = gauge("supernode_cdu_dew_point_margin_celsius",
                   "Secondary supply temperature minus room dew point in degrees Celsius (condensation risk below ~2).",
                   ["cdu"], "celsius")
APPROACH = gauge("supernode_cdu_approach_celsius",
                 "Heat-exchanger approach in degrees Celsius: secondary supply minus primary supply (rising = fouling).",
                 ["cdu"], "celsius")
FLOW_PER_POWER = gauge("supernode_cdu_flow_per_power_cubic_meters_per_joule",
                       "Secondary flow per watt of rack power in m^3/s per W (1.5 L/min/kW = 2.5e-8).",
                       ["cdu"], "cubic_meters_per_joule")
CONDUCTIVITY = gauge("supernode_cdu_coolant_conductivity_siemens_per_meter",
                     "Coolant electrical conductivity in siemens per metre, polled.", ["cdu"], "siemens_per_meter")
PH = gauge("supernode_cdu_coolant_ph", "Coolant pH, polled.", ["cdu"])
ALARM = gauge("supernode_cdu_alarm_active", "1 while the CDU reports this alarm, polled.", ["cdu", "alarm"])
LEAK_DETECTED = gauge("supernode_leak_detected", "1 when the leak sensor is wet, polled.", ["zone", "sensor"])
LEAK_FAULT = gauge("supernode_leak_sensor_fault",
                   "1 while the leak sensor reports this fault (never a leak on its own), polled; "
                   "fault=source_down: 1 while the agent cannot read the sensor at all (state unknown).",
                   ["zone", "sensor", "fault"])
LEAK_LOCATION = gauge("supernode_leak_location_meters", "Distance along the sensing cable to the leak in metres.",
                      ["zone", "sensor"], "meters")
EXCEPTIONS = counter("supernode_modbus_exceptions_total",
                     "Modbus exception responses received, by exception code.", ["device", "code"])
REQUESTS = counter("supernode_modbus_requests_total", "Modbus read requests sent (retries included).", ["device"])

ALL: dict[str, MetricSpec] = {m.name: m for m in (
    CDU_INFO, TEMPERATURE, FLOW, PRESSURE, PUMP_RUNNING, PUMP_SPEED, PUMP_SETPOINT, SUPPLY_SETPOINT, RESERVOIR,
    AMBIENT_TEMP, AMBIENT_HUMIDITY, VALVE_OPEN, FAN_SPEED, VALVE_POSITION, HEAT_REMOVED, DEW_POINT, DEW_MARGIN,
    APPROACH, FLOW_PER_POWER, CONDUCTIVITY, PH, ALARM, LEAK_DETECTED, LEAK_FAULT, LEAK_LOCATION, EXCEPTIONS,
    REQUESTS)}

# Families a CDU source computes from its own readings (exporters.cooling.coolant_readings), whatever its profile.
DERIVED: tuple[MetricSpec, ...] = (HEAT_REMOVED, DEW_POINT, DEW_MARGIN, APPROACH, FLOW_PER_POWER)

# Labels the collector fills itself; a profile must not set them.
AUTO_LABELS = {"cdu", "zone", "device"}


def auto_labels(spec: MetricSpec, labels: Mapping[str, str], device: str, zone: str) -> dict[str, str]:
    """A profile point's labels with the ones the collector fills (AUTO_LABELS) that `spec` has: the CDU or device
    is the inventory name, the zone the inventory's for the point's channel. Every cooling protocol's collector."""
    out = dict(labels)
    if "cdu" in spec.labels:
        out["cdu"] = device
    if "zone" in spec.labels:
        out["zone"] = zone
    if "device" in spec.labels:
        out["device"] = device
    return out
