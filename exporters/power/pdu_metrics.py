"""The PDU metric families (METRICS.md, "PDUs (SNMP)"), declared once.

Profiles map device columns onto these families by name; the profile
loader checks every mapping against this table, so a typo in a profile is
refused at load instead of exporting a series nobody graphs.
"""

from __future__ import annotations

from exporters.model import MetricSpec, counter, gauge, info

PDU_INFO = info("supernode_pdu_info", "PDU identity (1): vendor, model, firmware and the profile that decodes it.",
                ("pdu", "vendor", "model", "firmware", "profile"))
INLET_POWER = gauge("supernode_pdu_inlet_power_watts", "Active power of a PDU inlet, in watts (polled).",
                    ("pdu", "inlet"), "watts")
INLET_APPARENT = gauge("supernode_pdu_inlet_apparent_power_volt_amperes",
                       "Apparent power of a PDU inlet, in volt-amperes (polled).", ("pdu", "inlet"), "volt_amperes")
INLET_ENERGY = counter("supernode_pdu_inlet_energy_joules_total",
                       "Active energy through a PDU inlet, in joules; device counter wraps (at the MIB's width: 2^32 "
                       "unsigned, 2^31 signed) and resets are absorbed so the series only grows.", ("pdu", "inlet"), "joules")
INLET_CURRENT = gauge("supernode_pdu_inlet_current_amperes",
                      "RMS current of a PDU inlet, in amperes (single-phase units report no phases).", ("pdu", "inlet"),
                      "amperes")
INLET_VOLTAGE = gauge("supernode_pdu_inlet_voltage_volts", "RMS voltage of a PDU inlet, in volts.", ("pdu", "inlet"),
                      "volts")
INLET_NOMINAL_VOLTAGE = gauge("supernode_pdu_inlet_nominal_voltage_volts",
                              "Line-to-line voltage a PDU that measures current only is configured with and computes "
                              "its power from (APC AP7xxx rPDUIdentDeviceLinetoLineVoltage), in volts: a setting, "
                              "not a measurement.", ("pdu", "inlet"), "volts")
INLET_POWER_FACTOR = gauge("supernode_pdu_inlet_power_factor_ratio", "Power factor of a PDU inlet (0..1).",
                           ("pdu", "inlet"), "ratio")
INLET_CURRENT_LIMIT = gauge("supernode_pdu_inlet_current_limit_amperes",
                            "Current threshold of a PDU inlet set on the device (threshold: upper_critical or "
                            "upper_warning), in amperes.", ("pdu", "inlet", "threshold"), "amperes")
PHASE_CURRENT = gauge("supernode_pdu_phase_current_amperes", "RMS current of one inlet phase (pole), in amperes.",
                      ("pdu", "inlet", "phase"), "amperes")
PHASE_VOLTAGE = gauge("supernode_pdu_phase_voltage_volts", "RMS voltage of one inlet phase (pole), in volts.",
                      ("pdu", "inlet", "phase"), "volts")
PHASE_POWER = gauge("supernode_pdu_phase_power_watts", "Active power of one inlet phase (pole), in watts.",
                    ("pdu", "inlet", "phase"), "watts")
PHASE_CURRENT_LIMIT = gauge("supernode_pdu_phase_current_limit_amperes",
                            "Current threshold of one inlet phase (breaker rating or upper critical), in amperes.",
                            ("pdu", "inlet", "phase"), "amperes")
BREAKER_CURRENT = gauge("supernode_pdu_breaker_current_amperes",
                        "RMS current through one overcurrent-protected circuit (APC bank, Sentry4 cord line or "
                        "branch, Vertiv/Geist breaker circuit or inlet line, Raritan overcurrent protector), in "
                        "amperes: the one "
                        "that trips first is what a power playbook watches.", ("pdu", "breaker"), "amperes")
BREAKER_LIMIT = gauge("supernode_pdu_breaker_current_limit_amperes",
                      "Current limit of one overcurrent-protected circuit read from the device (threshold: "
                      "upper_critical = overload or high alarm, upper_warning = near overload or high warning, "
                      "rated = its rated capacity), in amperes.", ("pdu", "breaker", "threshold"), "amperes")
OUTLET_POWER = gauge("supernode_pdu_outlet_power_watts", "Active power of one outlet, in watts (polled).",
                     ("pdu", "outlet"), "watts")
OUTLET_CURRENT = gauge("supernode_pdu_outlet_current_amperes", "RMS current of one outlet, in amperes (polled).",
                       ("pdu", "outlet"), "amperes")
OUTLET_VOLTAGE = gauge("supernode_pdu_outlet_voltage_volts", "RMS voltage at one outlet, in volts (where the MIB has it).",
                       ("pdu", "outlet"), "volts")
OUTLET_ENERGY = counter("supernode_pdu_outlet_energy_joules_total",
                        "Active energy through one outlet, in joules; wraps and resets absorbed.",
                        ("pdu", "outlet"), "joules")
OUTLET_ON = gauge("supernode_pdu_outlet_on", "1 when a switched outlet is powered, 0 when off.", ("pdu", "outlet"))
OUTLET_INFO = info("supernode_pdu_outlet_info", "Which node an outlet feeds, from the inventory (1).",
                   ("pdu", "outlet", "feeds"))
RACK_POWER = gauge("supernode_rack_power_watts", "Rack power: the sum of all PDU inlets' active power, in watts; "
                   "absent while any inventory PDU is not read (never a partial sum).", (), "watts")
RACK_BUDGET = gauge("supernode_rack_power_budget_watts", "Rack power budget from the config, in watts.", (), "watts")

# Families a profile may map columns onto (the rest are computed by the collector).
PROFILE_METRICS: dict[str, MetricSpec] = {s.name: s for s in (
    INLET_POWER, INLET_APPARENT, INLET_ENERGY, INLET_CURRENT, INLET_VOLTAGE, INLET_NOMINAL_VOLTAGE, INLET_POWER_FACTOR,
    INLET_CURRENT_LIMIT,
    PHASE_CURRENT, PHASE_VOLTAGE, PHASE_POWER, PHASE_CURRENT_LIMIT, BREAKER_CURRENT, BREAKER_LIMIT,
    OUTLET_POWER, OUTLET_CURRENT, OUTLET_VOLTAGE, OUTLET_ENERGY, OUTLET_ON)}
ALL_METRICS: tuple[MetricSpec, ...] = (PDU_INFO, *PROFILE_METRICS.values(), OUTLET_INFO, RACK_POWER, RACK_BUDGET)
