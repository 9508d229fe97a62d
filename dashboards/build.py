"""Grafana dashboards for supernode-agent, generated with grafanalib.

`python -m dashboards.build` (what `make dashboards` runs) writes one JSON file
per dashboard next to this module; the JSON is committed so users can import
it without Python, and a test fails when it is out of date with this source.

Every panel carries a Grafana unit id. Where Grafana has no unit for the
exposed base unit, the query converts and says so: coolant flow is exported in
m³/s (METRICS.md) and shown in L/min (`* 60000`, unit `flowlpm`), the unit
an operator reads on a CDU front panel.

Queries filter on `rack` and `node`, the target labels Prometheus attaches
from the scrape config, so one Prometheus (or a federated / long-term store)
serves any number of racks. Rack aggregates use the recording rules of
alerts/recording.rules.yml.

For current Grafana (10/11): schemaVersion 39; no `maxDataPoints` cap, so
Grafana asks for one point per pixel and a 30-second leak stays visible in a
6-hour view; every stat colours its value with explicit threshold steps (a
breaker that is open is red, never the default green); every dashboard
annotates the time line with the agent's own actions (a query on
`supernode_remediation_actions_total`); energy is shown in kWh; state
timelines aggregate per GPU or port so an NVL72 rack is 72 rows, not 1,300.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafanalib.core import (Annotations, Dashboard, GridPos, Stat, StateTimeline, Table, Target, Template, Templating,
                             Time, TimeSeries)
from grafanalib._gen import DashboardEncoder

OUT_DIR = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
RACK = 'rack=~"$rack"'
NODE = 'rack=~"$rack", node=~"$node"'
RATE = "$__rate_interval"
WIDTH, HEIGHT = 12, 8
SCHEMA_VERSION = 39  # Grafana 10.4 / 11
GREEN, ORANGE, RED = "green", "orange", "red"


def _targets(queries: list[tuple[str, str]]) -> list[Target]:
    return [Target(expr=expr, legendFormat=legend, refId=chr(ord("A") + i), datasource=DS)
            for i, (expr, legend) in enumerate(queries)]


def ts(title: str, unit: str, queries: list[tuple[str, str]], description: str = "") -> TimeSeries:
    """A time series panel: the default for anything that changes over time."""
    return TimeSeries(title=title, dataSource=DS, targets=_targets(queries), unit=unit,
                      description=description or None)


def stat(title: str, unit: str, queries: list[tuple[str, str]], steps: list[tuple[str, float | None]],
         description: str = "") -> Stat:
    """A single-value panel for counts an operator must see at a glance, coloured by explicit threshold steps.

    steps: (colour, from value), the first from None (the base); Grafana's default is one green step,
    which paints an open breaker green.
    """
    return Stat(title=title, dataSource=DS, targets=_targets(queries), format=unit, reduceCalc="lastNotNull",
                description=description or None, colorMode="background",
                thresholds=_steps(steps))


UP_STEPS = [(RED, None), (GREEN, 1)]     # 1 = up / running: green; 0: red
ALARM_STEPS = [(GREEN, None), (RED, 1)]  # 1 = wet / open: red
AVAILABILITY_STEPS = [(RED, None), (ORANGE, 0.9), (GREEN, 0.97)]  # 97 %: ByteRobust's effective training time
HEALTH_STEPS = [(GREEN, None), (ORANGE, 1), (RED, 2)]  # Redfish Health / DetectorState: OK, Warning, Critical


def _steps(steps: list[tuple[str, float | None]]) -> list[dict]:
    return [{"color": color, "value": value} for color, value in steps]


def states(title: str, unit: str, queries: list[tuple[str, str]], description: str = "",
           steps: list[tuple[str, float | None]] = UP_STEPS) -> StateTimeline:
    """A state timeline (link/pump/leak matrices), coloured by its steps; grafanalib has no unit field here."""
    return StateTimeline(title=title, dataSource=DS, targets=_targets(queries), description=description or None,
                         thresholds=_steps(steps), extraJson={"fieldConfig": {"defaults": {"unit": unit}}})


def table(title: str, unit: str, queries: list[tuple[str, str]], description: str = "") -> Table:
    """An instant table (open incidents)."""
    targets = [Target(expr=expr, legendFormat=legend, refId=chr(ord("A") + i), datasource=DS, instant=True,
                      format="table") for i, (expr, legend) in enumerate(queries)]
    return Table(title=title, dataSource=DS, targets=targets, unit=unit, description=description or None)


def _layout(panels: list) -> list:
    """Two panels per row, in the order given."""
    for i, panel in enumerate(panels):
        panel.gridPos = GridPos(h=HEIGHT, w=WIDTH, x=(i % 2) * WIDTH, y=(i // 2) * HEIGHT)
    return panels


def _templating() -> Templating:
    return Templating(list=[
        Template(name="datasource", label="Data source", type="datasource", query="prometheus"),
        Template(name="rack", label="Rack", dataSource=DS, query="label_values(supernode_agent_info, rack)",
                 includeAll=True, multi=True, default="$__all", allValue=".*", refresh=2),
        Template(name="node", label="Node", dataSource=DS,
                 query='label_values(supernode_agent_info{rack=~"$rack"}, node)',
                 includeAll=True, multi=True, default="$__all", allValue=".*", refresh=2),
    ])


def action_annotations() -> Annotations:
    """The agent's actions on the time line of every dashboard: where the remediation counters moved."""
    return Annotations(list=[{
        "datasource": DS, "enable": True, "hide": False, "iconColor": "orange", "name": "Agent actions",
        "expr": (f"sum by (rack, node, playbook, action, result) "
                 f"(increase(supernode_remediation_actions_total{{{NODE}}}[{RATE}])) > 0"),
        "step": "30s", "titleFormat": "{{action}} {{result}}", "textFormat": "{{node}}: playbook {{playbook}}",
        "tagKeys": "node,playbook,action,result", "useValueForTime": False,
    }])


def dashboard(uid: str, title: str, panels: list) -> Dashboard:
    return Dashboard(title=title, uid=uid, tags=["supernode"], templating=_templating(), panels=_layout(panels),
                     annotations=action_annotations(), schemaVersion=SCHEMA_VERSION,
                     time=Time("now-6h", "now"), refresh="30s", timezone="browser").auto_panel_ids()


def rack_overview() -> Dashboard:
    return dashboard("supernode-rack", "Supernode / Rack overview", [
        ts("Rack power (agent's rack total) vs budget", "watt", [
            (f"rack:supernode_rack_power_watts:max{{{RACK}}}", "{{rack}} power"),
            (f"rack:supernode_rack_power_budget_watts:max{{{RACK}}}", "{{rack}} budget")]),
        ts("Heat removed vs power", "watt", [
            (f"rack:supernode_cdu_heat_removed_watts:sum{{{RACK}}}", "{{rack}} heat removed"),
            (f"rack:supernode_rack_power_watts:max{{{RACK}}}", "{{rack}} electrical power")],
           "Heat carried away by the CDU(s) next to the rack's electrical power; a growing gap is heat going to the room."),
        ts("Coolant temperatures", "celsius", [
            (f"max by (rack, cdu, loop, point) (supernode_cdu_temperature_celsius{{{RACK}}})",
             "{{cdu}} {{loop}} {{point}}")]),
        ts("Coolant flow", "flowlpm", [
            (f"max by (rack, cdu, loop) (supernode_cdu_flow_cubic_meters_per_second{{{RACK}}}) * 60000",
             "{{cdu}} {{loop}}")], "Exported in m³/s, shown in L/min (× 60000)."),
        states("Leak map by zone", "bool_yes_no", [
            (f"rack:supernode_leak_detected:max{{{RACK}}}", "{{rack}} {{zone}}"),
            (f'max by (rack, zone) (supernode_leak_sensor_fault{{fault="source_down", {RACK}}})',
             "{{rack}} {{zone}} unreadable")],
               "Yes = a sensor in the zone is wet. 'unreadable' Yes = the agent cannot read the zone's leak source: "
               "its state is unknown.", ALARM_STEPS),
        table("Open incidents by rack", "short", [
            (f"sum by (rack, detector, severity) (supernode_incident_open{{{RACK}}}) > 0", "")]),
        states("Sources up", "bool_yes_no", [
            (f"supernode_source_up{{{NODE}}}", "{{node}} {{source}} {{device}}")]),
        ts("Seconds since last successful poll", "s", [
            (f"time() - supernode_source_last_success_timestamp_seconds{{{NODE}}}", "{{node}} {{source}} {{device}}")]),
        # Goodput (issue 36): what the customer pays for. Rack-level rules sum the agents (each exports its own
        # node); `supernode-agent report` prints the same from the journals, per incident with the jobs it hit.
        stat("Availability (30 days)", "percentunit", [
            (f"rack:supernode_node_availability:ratio30d{{{RACK}}}", "{{rack}}")], AVAILABILITY_STEPS,
             "1 - out-of-service node time / observed node time over 30 days. Out of service: drained or "
             "rebooting by the agent, or in maintenance; overlaps counted once (README, Goodput)."),
        ts("GPU-hours lost by cause (30 days)", "short", [
            (f"rack_cause:supernode_gpu_out_of_service_seconds:increase30d{{{RACK}}} / 3600", "{{rack}} {{cause}}")],
           "Each node's out-of-service time x its GPUs, by the cause that took it out, over the trailing 30 days; "
           "the rule records GPU-seconds (base unit), shown here in GPU-hours (/ 3600)."),
        table("Availability by node (30 days)", "percentunit", [
            (f"node:supernode_node_availability:ratio30d{{{NODE}}}", "")]),
        stat("Nodes out of service now", "short", [
            (f"sum by (rack) (1 - supernode_node_in_service{{{RACK}}})", "{{rack}}")], [(GREEN, None), (ORANGE, 1)],
             "Nodes with an outage open now (drained or rebooting by the agent, or in maintenance)."),
    ])


def gpus() -> Dashboard:
    gpu = "{{node}} gpu{{gpu}}"
    return dashboard("supernode-gpus", "Supernode / GPUs", [
        ts("GPU temperature", "celsius", [
            (f'supernode_gpu_temperature_celsius{{{NODE}, sensor="gpu"}}', gpu),
            (f'supernode_gpu_temperature_threshold_celsius{{{NODE}, threshold="slowdown"}}', gpu + " slowdown")]),
        ts("Memory temperature", "celsius", [
            (f'supernode_gpu_temperature_celsius{{{NODE}, sensor="memory"}}', gpu)]),
        ts("GPU power and caps", "watt", [
            (f"supernode_gpu_power_watts{{{NODE}}}", gpu),
            (f'supernode_gpu_power_limit_watts{{{NODE}, limit="enforced"}}', gpu + " cap")]),
        ts("GPUs with a clock-event reason active", "short", [
            # only the reasons that read 1 are exported (series budget, gpu_state_sets): 0 while GPUs are read
            # and none holds, no data when no GPU is read at all
            (f"count by (reason) (supernode_gpu_clock_event_active{{{NODE}}} == 1) "
             f"or on () (0 * count(supernode_gpu_up{{{NODE}}}))", "{{reason}}")],
           "Number of GPUs whose clocks are held down, by NVML reason (0: GPUs read, none held)."),
        ts("ECC errors", "cps", [
            (f'sum by (node, gpu, type) (rate(supernode_gpu_ecc_errors_total{{{NODE}, scope="volatile"}}[{RATE}]))',
             gpu + " {{type}}")]),
        ts("Remapped rows", "short", [
            (f"supernode_gpu_remapped_rows{{{NODE}}}", gpu + " {{kind}}"),
            (f"supernode_gpu_remapped_rows_pending{{{NODE}}}", gpu + " pending")]),
        ts("XID errors (per hour)", "short", [
            (f"sum by (node, gpu, xid) (increase(supernode_gpu_xid_errors_total{{{NODE}}}[1h]))", gpu + " XID {{xid}}")]),
        ts("GPU utilization", "percentunit", [
            (f'supernode_gpu_utilization_ratio{{{NODE}, engine="gpu"}}', gpu)]),
        ts("SM clock", "hertz", [
            (f'supernode_gpu_clock_hertz{{{NODE}, clock="sm"}}', gpu)]),
        ts("GPU memory used", "bytes", [
            (f"supernode_gpu_memory_used_bytes{{{NODE}}}", gpu)]),
        stat("GPUs not up", "short", [
            (f"sum(1 - supernode_gpu_up{{{NODE}}})", "not up")], ALARM_STEPS,
             "GPUs the agent sees but cannot read: off the bus or missing raises SupernodeGpuLost at once, "
             "hung (its NVML reads overrun their budget) SupernodeGpuHung once it stays hung."),
        ts("PCIe replays", "cps", [
            (f"rate(supernode_gpu_pcie_replays_total{{{NODE}}}[{RATE}])", gpu)]),
    ])


def nvlink_domain_matrix() -> Table:
    """The NVLink domain as one matrix: a row per compute tray, a column per NVSwitch chip (NVLink index k of every
    GPU reaches chip k on GB200 NVL72), each cell the worst link of that index over the tray's GPUs (min of
    supernode_nvlink_up: 0 when any GPU's link k is down). A red column is one switch chip (or its tray, chips 2j and
    2j+1); a red row is one compute tray. Columns are named `chip NN` (zero-padded, so they sort as numbers)."""
    chip = ('label_replace(label_replace(min by (rack, node, link) (supernode_nvlink_up{%s}), '
            '"chip", "chip 0$1", "link", "([0-9])"), "chip", "chip $1", "link", "([0-9]{2,})")' % NODE)
    panel = Table(
        title="NVLink domain: trays x switch chips (worst link per tray)", dataSource=DS, unit="bool_on_off",
        targets=[Target(expr=f"max by (rack, node, chip) ({chip})", legendFormat="{{node}} {{chip}}", refId="A",
                        datasource=DS, instant=True, format="table")],
        description=("A row per compute tray, a column per NVSwitch chip (= NVLink index): Off when any GPU of the "
                     "tray has that link down. A column of Off is a switch chip (chips 2j, 2j+1: switch tray j+1), "
                     "not the trays; a row of Off is the tray."),
        displayMode="color-background", thresholds=_steps([(RED, None), (GREEN, 1)]),
        transformations=[{"id": "groupingToMatrix",
                          "options": {"rowField": "node", "columnField": "chip", "valueField": "Value"}}])
    panel.extraJson = {"fieldConfig": {"defaults": {"custom": {"cellOptions": {"type": "color-background"}}}}}
    return panel


def links() -> Dashboard:
    lnk = "{{node}} gpu{{gpu}} link{{link}}"
    return dashboard("supernode-links", "Supernode / NVLink and network", [
        nvlink_domain_matrix(),
        states("NVLink state per GPU (On = all its links up)", "bool_on_off", [
            (f"min by (rack, node, gpu) (supernode_nvlink_up{{{NODE}}})", "{{node}} gpu{{gpu}}")],
            "One row per GPU (72 on an NVL72 rack); which link is down: the NVLinks-down panel and its labels."),
        ts("NVLinks down by GPU", "short", [
            (f"sum by (node, gpu) (1 - supernode_nvlink_up{{{NODE}}})", "{{node}} gpu{{gpu}}")]),
        # Per GPU always (the roll-ups); per link the links that have shown errors (the series budget).
        ts("NVLink error rate", "cps", [
            (f"sum by (node, gpu, type) (rate(supernode_gpu_nvlink_errors_total{{{NODE}}}[{RATE}]))",
             "{{node}} gpu{{gpu}} {{type}}"),
            (f"sum by (node, gpu, link, type) (rate(supernode_nvlink_errors_total{{{NODE}}}[{RATE}]))",
             lnk + " {{type}}")]),
        ts("NVLink bit error rate", "sci", [
            (f"supernode_gpu_nvlink_bit_error_rate_max{{{NODE}}}", "{{node}} gpu{{gpu}} worst link {{kind}}")],
           "Which link: supernode_nvlink_bit_error_rate, exported for the links whose BER has been above 0."),
        ts("NVLink throughput", "Bps", [
            (f"sum by (node, gpu) (rate(supernode_gpu_nvlink_transmit_bytes_total{{{NODE}}}[{RATE}]))",
             "{{node}} gpu{{gpu}} tx"),
            (f"sum by (node, gpu) (rate(supernode_gpu_nvlink_receive_bytes_total{{{NODE}}}[{RATE}]))",
             "{{node}} gpu{{gpu}} rx")]),
        states("Network link state", "bool_on_off", [(f"supernode_link_up{{{NODE}}}", "{{node}} {{port}}")]),
        ts("Network link error rate", "cps", [
            (f"sum by (node, port, counter) (rate(supernode_link_errors_total{{{NODE}}}[{RATE}]))",
             "{{node}} {{port}} {{counter}}")]),
        ts("Optic rx power vs thresholds", "dBm", [
            (f"supernode_optic_rx_power_dbm{{{NODE}}}", "{{node}} {{port}} lane{{lane}}"),
            (f'supernode_optic_threshold_dbm{{{NODE}, kind=~"rx_low_warning|rx_low_alarm"}}',
             "{{node}} {{port}} {{kind}}")]),
        ts("Link flaps (per hour)", "short", [
            (f"increase(supernode_link_flaps_total{{{NODE}}}[1h])", "{{node}} {{port}}")]),
        ts("Optic temperature", "celsius", [(f"supernode_optic_temperature_celsius{{{NODE}}}", "{{node}} {{port}}")]),
        ts("Optic tx bias", "amp", [(f"supernode_optic_tx_bias_amperes{{{NODE}}}", "{{node}} {{port}} lane{{lane}}")]),
    ])


def cooling() -> Dashboard:
    cdu = "{{rack}} {{cdu}}"
    conn = "{{rack}} {{bmc}} {{loop}} {{connector}}"
    return dashboard("supernode-cooling", "Supernode / Cooling", [
        ts("Supply and return", "celsius", [
            (f"max by (rack, cdu, loop, point) (supernode_cdu_temperature_celsius{{{RACK}}})",
             cdu + " {{loop}} {{point}}")]),
        ts("ΔT (return − supply)", "celsius", [
            (f"cdu:supernode_cdu_temperature_delta_celsius:return_minus_supply{{{RACK}}}", cdu + " {{loop}}")]),
        ts("Flow", "flowlpm", [
            (f"cdu:supernode_cdu_flow_cubic_meters_per_second:max{{{RACK}}} * 60000", cdu + " {{loop}}")],
           "Exported in m³/s, shown in L/min (× 60000)."),
        ts("Secondary flow per kW of heat", "suffix:L/min/kW", [
            (f'cdu:supernode_cdu_flow_cubic_meters_per_second:max{{{RACK}, loop="secondary"}} * 60000'
             f" / on (rack, cdu) (max by (rack, cdu) (supernode_cdu_heat_removed_watts{{{RACK}}}) / 1000)", cdu)],
           "L/min of secondary coolant per kW removed; falling values mean the loop runs hotter for the same load."),
        ts("Pressures", "pressurepa", [
            (f"max by (rack, cdu, loop, point) (supernode_cdu_pressure_pascals{{{RACK}}})", cdu + " {{loop}} {{point}}")]),
        # Cold plates (issue 35): each loaded GPU's R = (T_gpu - T_supply) / P against its references.
        ts("Cold-plate thermal resistance", "suffix:K/W", [
            (f"max by (rack, node, gpu) (supernode_gpu_thermal_resistance_kelvin_per_watt{{{NODE}}})",
             "{{node}} gpu {{gpu}}"),
            (f"max by (rack, node, gpu) (supernode_gpu_thermal_resistance_baseline_kelvin_per_watt{{{NODE}}})",
             "{{node}} gpu {{gpu}} baseline"),
            (f"max by (rack, node) (supernode_gpu_thermal_resistance_rack_median_kelvin_per_watt{{{NODE}}})",
             "{{node}} rack reference")],
           "R of each GPU under load (absent below the load gate), its own learnt baseline at the loop's flow, and "
           "the median R of the other trays' loaded GPUs. A plate that fouls climbs away from both; "
           "cold_plate_degraded warns at +15 %."),
        ts("Cold-plate R over its references", "percentunit", [
            (f"max by (rack, node, gpu) (supernode_gpu_thermal_resistance_kelvin_per_watt{{{NODE}}})"
             f" / on (rack, node, gpu) max by (rack, node, gpu) "
             f"(supernode_gpu_thermal_resistance_baseline_kelvin_per_watt{{{NODE}}}) - 1",
             "{{node}} gpu {{gpu}} over baseline"),
            (f"max by (rack, node, gpu) (supernode_gpu_thermal_resistance_kelvin_per_watt{{{NODE}}})"
             f" / on (rack, node) group_left max by (rack, node) "
             f"(supernode_gpu_thermal_resistance_rack_median_kelvin_per_watt{{{NODE}}}) - 1",
             "{{node}} gpu {{gpu}} over the rack")],
           "How far each GPU's R sits above its baseline and above the rack's reference "
           "(remediation.detectors.cold_plate_degraded_ratio, 0.15 by default, fires after its hold)."),
        states("Pumps running", "bool_on_off", [
            (f"max by (rack, cdu, pump) (supernode_cdu_pump_running{{{RACK}}})", cdu + " {{pump}}")]),
        ts("Pump speed", "percentunit", [
            (f"max by (rack, cdu, pump) (supernode_cdu_pump_speed_ratio{{{RACK}}})", cdu + " {{pump}}")]),
        ts("Dew-point margin", "celsius", [
            (f"min by (rack, cdu) (supernode_cdu_dew_point_margin_celsius{{{RACK}}})", cdu + " margin"),
            (f"max by (rack, cdu) (supernode_cdu_dew_point_celsius{{{RACK}}})", cdu + " dew point")],
           "Secondary supply minus dew point; condensation risk below 2 °C."),
        ts("Reservoir level", "percentunit", [
            (f"max by (rack, cdu) (supernode_cdu_reservoir_level_ratio{{{RACK}}})", cdu)]),
        ts("Heat removed", "watt", [
            (f"max by (rack, cdu) (supernode_cdu_heat_removed_watts{{{RACK}}})", cdu)]),
        # Redfish services (a CDU's CoolingUnit, a tray's ThermalSubsystem): their own connectors, pumps, detectors.
        ts("Redfish coolant connectors: supply and return", "celsius", [
            (f"max by (rack, bmc, connector, loop, point) (supernode_coolant_connector_temperature_celsius{{{RACK}}})",
             conn + " {{point}}")]),
        ts("Redfish coolant connectors: flow", "flowlpm", [
            (f"max by (rack, bmc, connector, loop) "
             f"(supernode_coolant_connector_flow_cubic_meters_per_second{{{RACK}}}) * 60000", conn)],
           "Exported in m³/s, shown in L/min (× 60000)."),
        ts("Redfish coolant connectors: pressures", "pressurepa", [
            (f"max by (rack, bmc, connector, loop, point) (supernode_coolant_connector_pressure_pascals{{{RACK}}})",
             conn + " {{point}}")]),
        ts("Redfish coolant connectors: heat removed", "watt", [
            (f"max by (rack, bmc, connector, loop) (supernode_coolant_connector_heat_removed_watts{{{RACK}}})", conn)]),
        ts("Redfish pump speed", "percentunit", [
            (f"max by (rack, bmc, equipment, pump) (supernode_coolant_pump_speed_ratio{{{RACK}}})",
             "{{rack}} {{bmc}} {{equipment}} pump {{pump}}")]),
        states("Redfish component health", "short", [
            (f"max by (rack, bmc, kind, resource) (supernode_redfish_health{{{RACK}, kind!=\"leak_detector\"}})",
             "{{rack}} {{bmc}} {{kind}} {{resource}}")],
               "0 OK, 1 Warning, 2 Critical (Status.Health of pumps, filters, connectors, reservoirs).", HEALTH_STEPS),
        states("Tray and CDU leak detectors (Redfish)", "short", [
            (f"max by (rack, bmc, detector) (supernode_leak_detector_state{{{RACK}}})",
             "{{rack}} {{bmc}} {{detector}}")],
               "DetectorState: 0 OK (dry), 1 Warning, 2 Critical (a leak). A tray leak drains and caps its node at "
               "once; more than two leaking trays in a rack ask for rack isolation.", HEALTH_STEPS),
        states("Redfish event stream", "bool_yes_no", [
            (f"max by (rack, node, bmc) (supernode_redfish_event_stream_up{{{NODE}}})", "{{node}} {{bmc}}")],
               "Yes = events (SSE or push) arrive: a tray leak is read at once. No = polling alone carries the "
               "detectors (one poll interval later)."),
    ])


def power() -> Dashboard:
    inlet = "{{rack}} {{pdu}} {{inlet}}"
    return dashboard("supernode-power", "Supernode / Power", [
        ts("PDU inlet power (sum) vs budget", "watt", [
            (f"rack:supernode_pdu_inlet_power_watts:sum{{{RACK}}}", "{{rack}} inlets"),
            (f"rack:supernode_rack_power_budget_watts:max{{{RACK}}}", "{{rack}} budget")]),
        ts("Inlet power", "watt", [
            (f"max by (rack, pdu, inlet) (supernode_pdu_inlet_power_watts{{{RACK}}})", inlet)]),
        ts("Inlet apparent power", "voltamp", [
            (f"max by (rack, pdu, inlet) (supernode_pdu_inlet_apparent_power_volt_amperes{{{RACK}}})", inlet)]),
        ts("Phase current vs breaker limit", "amp", [
            (f"max by (rack, pdu, inlet, phase) (supernode_pdu_phase_current_amperes{{{RACK}}})", inlet + " {{phase}}"),
            (f"max by (rack, pdu, inlet, phase) (supernode_pdu_phase_current_limit_amperes{{{RACK}}})",
             inlet + " {{phase}} limit")]),
        ts("Phase load (fraction of breaker)", "percentunit", [
            (f"max by (rack, pdu, inlet, phase) (supernode_pdu_phase_current_amperes{{{RACK}}})"
             f" / max by (rack, pdu, inlet, phase) (supernode_pdu_phase_current_limit_amperes{{{RACK}}})",
             inlet + " {{phase}}")]),
        ts("Phase voltage", "volt", [
            (f"max by (rack, pdu, inlet, phase) (supernode_pdu_phase_voltage_volts{{{RACK}}})", inlet + " {{phase}}")]),
        ts("Outlet power by node", "watt", [
            (f"max by (rack, pdu, outlet) (supernode_pdu_outlet_power_watts{{{RACK}}})"
             f" * on (rack, pdu, outlet) group_left (feeds)"
             f" max by (rack, pdu, outlet, feeds) (supernode_pdu_outlet_info{{{RACK}}})",
             "{{feeds}} ({{pdu}}/{{outlet}})")]),
        ts("GPU power by node", "watt", [(f"node:supernode_gpu_power_watts:sum{{{NODE}}}", "{{node}}")]),
        ts("Energy used per hour (kWh)", "kwatth", [
            (f"sum by (rack) (max by (rack, pdu, inlet) (increase(supernode_pdu_inlet_energy_joules_total{{{RACK}}}[1h])))"
             " / 3.6e6", "{{rack}}")],
           "Exported in joules, shown in kWh (÷ 3.6e6)."),
    ])


def remediation() -> Dashboard:
    return dashboard("supernode-remediation", "Supernode / Remediation", [
        ts("Actions by result (per hour)", "short", [
            (f"sum by (result) (increase(supernode_remediation_actions_total{{{NODE}}}[1h]))", "{{result}}")]),
        ts("Blocked by guardrail (per hour)", "short", [
            (f"sum by (guardrail) (increase(supernode_remediation_blocked_total{{{NODE}}}[1h]))", "{{guardrail}}")]),
        ts("MTTR by detector", "s", [
            (f"sum by (detector) (increase(supernode_incident_duration_seconds_sum{{{NODE}}}[6h]))"
             f" / sum by (detector) (increase(supernode_incident_duration_seconds_count{{{NODE}}}[6h]))", "{{detector}}")],
           "Mean time from incident open to resolved over the last 6 hours."),
        stat("Approvals pending", "short", [
            (f"sum(supernode_remediation_pending_approvals{{{NODE}}})", "pending")], [(GREEN, None), (ORANGE, 1)],
             "Destructive steps waiting for `supernode-agent approve`."),
        stat("Circuit breaker open", "bool_yes_no", [
            (f"max(supernode_remediation_circuit_breaker_open{{{NODE}}})", "open")], ALARM_STEPS,
             "Yes = the agent stopped acting after too many actions; see the SupernodeRemediationCircuitBreakerOpen runbook."),
        ts("Incidents opened by detector (per hour)", "short", [
            (f"sum by (detector) (increase(supernode_incidents_total{{{NODE}}}[1h]))", "{{detector}}")]),
        ts("Webhook requests", "reqps", [
            (f"sum by (result) (rate(supernode_webhook_requests_total{{{NODE}}}[{RATE}]))", "{{result}}")]),
        # One row per node, 0 on a quiet rack (the per-detector breakdown is the "Incidents opened" panel).
        table("Open incidents by node", "short", [
            (f"sum by (rack, node) (supernode_incident_open{{{NODE}}})", "")]),
        # Rack-level (the recording rules collapse agents), so only the rack variable applies.
        table("MTBF and MTTR by component class (30 days)", "s", [
            (f"rack_class:supernode_component_mtbf_seconds:30d{{{RACK}}}", "MTBF {{class}}"),
            (f"rack_class:supernode_component_mttr_seconds:30d{{{RACK}}}", "MTTR {{class}}")],
              "MTBF: observed component-time / failures (Infinity: no failure in the window); MTTR: mean time "
              "from a failure's incident opening to its resolution. Classes and how each is counted: "
              "README, Reliability; `supernode-agent report` prints the same per agent with the worst offenders."),
    ])


DASHBOARDS = {
    "rack-overview": rack_overview,
    "gpus": gpus,
    "nvlink-network": links,
    "cooling": cooling,
    "power": power,
    "remediation": remediation,
}


def render(name: str) -> str:
    """The JSON text of one dashboard, byte-stable (sorted keys) so the committed file can be compared."""
    data = json.loads(json.dumps(DASHBOARDS[name]().to_json_data(), cls=DashboardEncoder))
    for panel in data["panels"]:
        # grafanalib caps every panel at 100 points: a short leak vanishes from a 6-hour view. Grafana's own
        # default (one point per pixel of width) applies when the key is absent.
        panel.pop("maxDataPoints", None)
    return json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def path_of(name: str) -> Path:
    return OUT_DIR / f"{name}.json"


def main(argv: list[str] | None = None) -> int:
    """Write every dashboard; `--check` only reports files that are out of date (exit 1)."""
    args = sys.argv[1:] if argv is None else argv
    stale = []
    for name in DASHBOARDS:
        text, path = render(name), path_of(name)
        if "--check" in args:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("out of date (run `make dashboards`): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
