"""Dashboards: committed JSON is current, units and template variables, every query valid and answering.

Queries are parsed by the real promtool (as recording rules) and run against
a real Prometheus scraping a small synthetic two-node rack served here; the
check against the simulated demo rack belongs to the end-to-end test.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

from dashboards import build
from tests.helpers import REPO, free_port, require_binary, wait_for
from tests.metric_names import catalogue, metric_names
from tests.peers import prometheus_server

# Grafana unit ids used on purpose; anything else (or none) is a mistake.
UNITS = {"watt", "voltamp", "amp", "volt", "joule", "celsius", "flowlpm", "pressurepa", "percentunit", "bytes",
         "Bps", "hertz", "dBm", "s", "short", "cps", "reqps", "sci", "bool_on_off", "bool_yes_no",
         "suffix:L/min/kW", "kwatth", "suffix:K/W"}
# Labels with one value per NVLink or optic lane: a state timeline keeping them is a row per link.
PER_LINK_LABELS = ("link", "lane")


def _dashboards() -> dict[str, dict]:
    return {name: json.loads(build.path_of(name).read_text()) for name in build.DASHBOARDS}


def _queries() -> list[tuple[str, str, str]]:
    """Every panel query and every annotation query, as (dashboard, title, expr)."""
    panels = [(name, p["title"], t["expr"]) for name, d in _dashboards().items() for p in d["panels"]
              for t in p["targets"]]
    notes = [(name, f"annotation {a['name']}", a["expr"]) for name, d in _dashboards().items()
             for a in d["annotations"]["list"]]
    return panels + notes


def _concrete(expr: str) -> str:
    """Template variables as Grafana would expand them for one rack and all nodes."""
    return expr.replace("$__rate_interval", "10s").replace("$rack", "r01").replace("$node", ".*")


def test_committed_json_is_up_to_date():
    assert build.main(["--check"]) == 0, "run `make dashboards` and commit the JSON"
    d = json.loads(build.render("power"))
    d["title"] = "changed"
    assert json.dumps(d, sort_keys=True, indent=2, ensure_ascii=False) + "\n" != build.path_of("power").read_text()


def test_expected_dashboards_exist():
    titles = {d["title"] for d in _dashboards().values()}
    assert titles == {"Supernode / Rack overview", "Supernode / GPUs", "Supernode / NVLink and network",
                      "Supernode / Cooling", "Supernode / Power", "Supernode / Remediation"}


def test_every_panel_has_a_unit_and_the_datasource_variable():
    for name, d in _dashboards().items():
        assert d["panels"], name
        for p in d["panels"]:
            unit = p["fieldConfig"]["defaults"].get("unit")
            assert unit in UNITS, f"{name}/{p['title']}: unit {unit!r}"
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, f"{name}/{p['title']}"
            assert p["targets"], f"{name}/{p['title']} has no query"


def test_current_grafana_schema_and_no_point_cap():
    for name, d in _dashboards().items():
        assert 38 <= d["schemaVersion"] <= 39, f"{name}: schemaVersion {d['schemaVersion']}"
        for p in d["panels"]:
            # A cap of 100 points over 6 h is one point per 3.6 min: a 30-second leak disappears.
            assert "maxDataPoints" not in p, f"{name}/{p['title']}: maxDataPoints {p['maxDataPoints']}"


def test_every_stat_and_state_timeline_has_real_threshold_steps():
    seen = 0
    for name, d in _dashboards().items():
        for p in d["panels"]:
            if p["type"] not in ("stat", "state-timeline"):
                continue
            seen += 1
            steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
            where = f"{name}/{p['title']}"
            assert isinstance(steps, list) and len(steps) >= 2, f"{where}: steps {steps!r}"
            assert steps[0]["value"] is None, f"{where}: no base step"
            values = [s["value"] for s in steps[1:]]
            assert values == sorted(values), where
            assert len({s["color"] for s in steps}) == len(steps), f"{where}: steps of one colour show nothing"
    assert seen >= 5
    breaker = next(p for p in _dashboards()["remediation"]["panels"] if p["title"] == "Circuit breaker open")
    assert breaker["fieldConfig"]["defaults"]["thresholds"]["steps"][-1] == {"color": "red", "value": 1}


def test_every_dashboard_annotates_the_agents_actions():
    for name, d in _dashboards().items():
        notes = d["annotations"]["list"]
        assert any("supernode_remediation_actions_total" in a["expr"] and a["enable"] for a in notes), name
        for a in notes:
            assert a["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, name
            assert "$node" in a["expr"] and a["titleFormat"], name


def test_titles_are_unambiguous_and_energy_is_in_kwh():
    titles = [p["title"] for d in _dashboards().values() for p in d["panels"]]
    dupes = {t for t in titles if titles.count(t) > 1}
    assert not dupes, f"panels on different queries share a title: {dupes}"
    for name, d in _dashboards().items():
        for p in d["panels"]:
            unit = p["fieldConfig"]["defaults"]["unit"]
            if any("_joules_total" in t["expr"] for t in p["targets"]):
                assert unit == "kwatth" and "/ 3.6e6" in p["targets"][0]["expr"], f"{name}/{p['title']}"
            assert unit != "joule", f"{name}/{p['title']}: energy in joules"


def test_state_timelines_stay_small_on_a_big_rack():
    """A row per NVLink is ~1,300 rows on an NVL72 rack: timelines aggregate links and lanes away."""
    for name, d in _dashboards().items():
        for p in d["panels"]:
            if p["type"] != "state-timeline":
                continue
            for t in p["targets"]:
                for label in PER_LINK_LABELS:
                    assert "{{" + label + "}}" not in t["legendFormat"], f"{name}/{p['title']}: a row per {label}"
                if "supernode_nvlink_" in t["expr"]:
                    assert re.match(r"(min|max|sum) by \(rack, node, gpu\)", t["expr"]), f"{name}/{p['title']}"


def test_template_variables():
    for name, d in _dashboards().items():
        variables = {v["name"]: v for v in d["templating"]["list"]}
        assert list(variables) == ["datasource", "rack", "node"], name
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        assert "rack" in variables["rack"]["query"] and "$rack" in variables["node"]["query"]
        assert variables["node"]["includeAll"] and variables["rack"]["multi"]


def test_queries_filter_on_rack_and_use_catalogue_names():
    known = catalogue()
    for name, title, expr in _queries():
        assert '"$rack"' in expr, f"{name}/{title} ignores the rack variable: {expr}"
        assert metric_names(expr) - known == set(), f"{name}/{title}"


def test_every_query_parses_with_promtool(tmp_path):
    promtool = require_binary("promtool")
    rules = [{"record": f"check:q{i}:x", "expr": _concrete(expr)} for i, (_, _, expr) in enumerate(_queries())]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    res = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"SUCCESS: {len(rules)} rules found" in res.stdout


# --- a synthetic rack: every metric the dashboards read, counters growing ---

GPU = {"gpu": "0", "uuid": "GPU-0"}
RF_CONN = {"bmc": "cdu-r", "equipment": "CDUs/1", "connector": "1", "loop": "secondary"}
SERIES: list[tuple[str, dict, float, float]] = [
    # (name, labels, value at start, growth per second: counters grow)
    ("supernode_agent_info", {"role": "node", "version": "0.1.0", "mode": "observe"}, 1, 0),
    ("supernode_source_up", {"source": "nvml", "device": "nvml"}, 1, 0),
    ("supernode_source_last_success_timestamp_seconds", {"source": "nvml", "device": "nvml"}, time.time(), 1),
    ("supernode_rack_power_watts", {}, 98000, 0),
    ("supernode_rack_power_budget_watts", {}, 120000, 0),
    ("supernode_cdu_heat_removed_watts", {"cdu": "cdu1"}, 95000, 0),
    ("supernode_cdu_temperature_celsius", {"cdu": "cdu1", "loop": "secondary", "point": "supply"}, 30, 0),
    ("supernode_cdu_temperature_celsius", {"cdu": "cdu1", "loop": "secondary", "point": "return"}, 40, 0),
    ("supernode_cdu_flow_cubic_meters_per_second", {"cdu": "cdu1", "loop": "secondary"}, 0.0023, 0),
    ("supernode_cdu_pressure_pascals", {"cdu": "cdu1", "loop": "secondary", "point": "supply"}, 250000, 0),
    ("supernode_cdu_pump_running", {"cdu": "cdu1", "pump": "p1"}, 1, 0),
    ("supernode_cdu_pump_speed_ratio", {"cdu": "cdu1", "pump": "p1"}, 0.6, 0),
    ("supernode_cdu_dew_point_margin_celsius", {"cdu": "cdu1"}, 12, 0),
    ("supernode_cdu_dew_point_celsius", {"cdu": "cdu1"}, 18, 0),
    ("supernode_cdu_reservoir_level_ratio", {"cdu": "cdu1"}, 0.8, 0),
    ("supernode_leak_detected", {"zone": "z1", "sensor": "rope1"}, 0, 0),
    ("supernode_leak_sensor_fault", {"zone": "z1", "sensor": "rope1", "fault": "source_down"}, 0, 0),
    ("supernode_incident_open", {"detector": "gpu_thermal", "severity": "warning"}, 1, 0),
    ("supernode_incidents_total", {"detector": "gpu_thermal", "severity": "warning"}, 1, 0.01),
    ("supernode_incident_duration_seconds_sum", {"detector": "gpu_thermal"}, 30, 1),
    ("supernode_incident_duration_seconds_count", {"detector": "gpu_thermal"}, 1, 0.05),
    ("supernode_gpu_up", GPU, 1, 0),
    ("supernode_gpu_temperature_celsius", {**GPU, "sensor": "gpu"}, 65, 0),
    ("supernode_gpu_temperature_celsius", {**GPU, "sensor": "memory"}, 70, 0),
    ("supernode_gpu_temperature_threshold_celsius", {**GPU, "threshold": "slowdown"}, 87, 0),
    ("supernode_gpu_power_watts", GPU, 900, 0),
    ("supernode_gpu_thermal_resistance_kelvin_per_watt", GPU, 0.041, 0),
    ("supernode_gpu_thermal_resistance_baseline_kelvin_per_watt", GPU, 0.035, 0),
    ("supernode_gpu_thermal_resistance_rack_median_kelvin_per_watt", {}, 0.035, 0),
    ("supernode_gpu_power_limit_watts", {**GPU, "limit": "enforced"}, 1200, 0),
    ("supernode_gpu_clock_event_active", {**GPU, "reason": "sw_power_cap"}, 0, 0),
    ("supernode_gpu_ecc_errors_total", {**GPU, "type": "corrected", "scope": "volatile"}, 3, 0.1),
    ("supernode_gpu_remapped_rows", {**GPU, "kind": "correctable"}, 1, 0),
    ("supernode_gpu_remapped_rows_pending", GPU, 0, 0),
    ("supernode_gpu_xid_errors_total", {**GPU, "xid": "13", "action": "RESTART_APP"}, 1, 0.1),
    ("supernode_gpu_utilization_ratio", {**GPU, "engine": "gpu"}, 0.9, 0),
    ("supernode_gpu_clock_hertz", {**GPU, "clock": "sm"}, 1.9e9, 0),
    ("supernode_gpu_memory_used_bytes", GPU, 80e9, 0),
    ("supernode_gpu_pcie_replays_total", GPU, 0, 0.1),
    ("supernode_nvlink_up", {**GPU, "link": "0"}, 1, 0),
    ("supernode_nvlink_errors_total", {**GPU, "link": "0", "type": "crc_flit"}, 0, 0.5),
    ("supernode_nvlink_bit_error_rate", {**GPU, "link": "0", "kind": "effective"}, 1e-15, 0),
    ("supernode_gpu_nvlink_errors_total", {**GPU, "type": "crc_flit"}, 0, 0.5),
    ("supernode_gpu_nvlink_bit_error_rate_max", {**GPU, "kind": "effective"}, 1e-15, 0),
    ("supernode_gpu_nvlink_transmit_bytes_total", GPU, 0, 1e9),
    ("supernode_gpu_nvlink_receive_bytes_total", GPU, 0, 1e9),
    ("supernode_link_up", {"port": "ib0", "kind": "ib"}, 1, 0),
    ("supernode_link_errors_total", {"port": "ib0", "counter": "symbol_error"}, 0, 0.1),
    ("supernode_link_flaps_total", {"port": "ib0"}, 0, 0.01),
    ("supernode_optic_rx_power_dbm", {"port": "ib0", "lane": "0"}, -2.5, 0),
    ("supernode_optic_threshold_dbm", {"port": "ib0", "kind": "rx_low_warning"}, -8, 0),
    ("supernode_optic_temperature_celsius", {"port": "ib0"}, 45, 0),
    ("supernode_optic_tx_bias_amperes", {"port": "ib0", "lane": "0"}, 0.008, 0),
    ("supernode_pdu_inlet_power_watts", {"pdu": "pdu-a", "inlet": "I1"}, 49000, 0),
    ("supernode_pdu_inlet_apparent_power_volt_amperes", {"pdu": "pdu-a", "inlet": "I1"}, 50000, 0),
    ("supernode_pdu_inlet_energy_joules_total", {"pdu": "pdu-a", "inlet": "I1"}, 1e9, 49000),
    ("supernode_pdu_phase_current_amperes", {"pdu": "pdu-a", "inlet": "I1", "phase": "L1"}, 40, 0),
    ("supernode_pdu_phase_current_limit_amperes", {"pdu": "pdu-a", "inlet": "I1", "phase": "L1"}, 63, 0),
    ("supernode_pdu_phase_voltage_volts", {"pdu": "pdu-a", "inlet": "I1", "phase": "L1"}, 230, 0),
    ("supernode_pdu_outlet_power_watts", {"pdu": "pdu-a", "outlet": "1"}, 6000, 0),
    ("supernode_pdu_outlet_info", {"pdu": "pdu-a", "outlet": "1", "feeds": "n01"}, 1, 0),
    ("supernode_remediation_actions_total", {"playbook": "gpu-thermal", "action": "gpu_power_cap", "result": "done"}, 1, 0.05),
    ("supernode_remediation_blocked_total", {"playbook": "gpu-thermal", "guardrail": "cooldown"}, 1, 0.05),
    ("supernode_remediation_pending_approvals", {}, 1, 0),
    ("supernode_remediation_circuit_breaker_open", {}, 0, 0),
    ("supernode_webhook_requests_total", {"result": "accepted"}, 0, 0.2),
    ("supernode_component_failures_total", {"class": "gpu"}, 0, 0.1),
    ("supernode_component_observed_seconds_total", {"class": "gpu"}, 0, 4),
    ("supernode_component_repair_duration_seconds_sum", {"class": "gpu"}, 0, 6),
    ("supernode_component_repair_duration_seconds_count", {"class": "gpu"}, 0, 0.1),
    ("supernode_component_observed_seconds_total", {"class": "node"}, 0, 1),
    ("supernode_components", {"class": "gpu"}, 4, 0),
    ("supernode_node_out_of_service_seconds_total", {"cause": "leak"}, 0, 0.1),
    ("supernode_node_in_service", {}, 1, 0),
    ("supernode_coolant_connector_temperature_celsius", {**RF_CONN, "point": "supply"}, 30, 0),
    ("supernode_coolant_connector_flow_cubic_meters_per_second", RF_CONN, 0.0007, 0),
    ("supernode_coolant_connector_pressure_pascals", {**RF_CONN, "point": "supply"}, 827000, 0),
    ("supernode_coolant_connector_heat_removed_watts", RF_CONN, 25480, 0),
    ("supernode_coolant_pump_speed_ratio", {"bmc": "cdu-r", "equipment": "CDUs/1", "pump": "1"}, 0.385, 0),
    ("supernode_redfish_health", {"bmc": "cdu-r", "equipment": "CDUs/1", "kind": "pump", "resource": "1"}, 0, 0),
    ("supernode_leak_detector_state", {"bmc": "n01-bmc", "chassis": "Chassis_0", "detector": "LD_0",
                                       "type": "Moisture"}, 0, 0),
    ("supernode_redfish_event_stream_up", {"bmc": "n01-bmc", "transport": "sse"}, 1, 0),
]


def _exposition(start: float) -> bytes:
    now = time.time() - start
    lines = []
    for name, labels, value, growth in SERIES:
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        lines.append(f"{name}{{{text}}} {value + growth * now:.17g}")
    return ("\n".join(lines) + "\n").encode()


class _Handler(BaseHTTPRequestHandler):
    """Serves `body()` as Prometheus text at every path."""

    start = time.time()

    def body(self) -> bytes:
        return _exposition(self.start)

    def do_GET(self):  # noqa: N802 (http.server naming)
        body = self.body()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_every_query_returns_data_from_a_live_prometheus(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    target = f"127.0.0.1:{server.server_address[1]}"
    # Two nodes of rack r01 (the same synthetic payload); rack/node are target labels as in production.
    scrape = [{"job_name": "supernode-agent", "static_configs": [
        {"targets": [target], "labels": {"rack": "r01", "node": "n01"}}]},
        {"job_name": "supernode-agent-2", "static_configs": [
            {"targets": [target], "labels": {"rack": "r01", "node": "n02"}}]}]
    try:
        with prometheus_server(tmp_path / "prom", scrape, rule_files=[REPO / "alerts" / "recording.rules.yml"]) as prom:
            # Rates need two samples per series, recording rules one evaluation after that.
            # (each rule group evaluates on its own schedule: wait for the first and the last group)
            wait_for(lambda: prom.query("rate(supernode_nvlink_errors_total[10s]) > 0")
                     and prom.query("rack:supernode_rack_power_budget:ratio")
                     and prom.query("rack_class:supernode_component_mttr_seconds:30d")
                     and prom.query("rack:supernode_gpu_out_of_service_seconds:increase30d"),
                     timeout=20, interval=0.2, what="two scrapes and a rule evaluation")
            empty = [f"{name}/{title}: {expr}" for name, title, expr in _queries()
                     if not prom.query(_concrete(expr))]
            assert empty == [], "queries without data:\n" + "\n".join(empty)
            # The check bites: a query on a metric no one exports comes back empty.
            assert prom.query('supernode_no_such_metric{rack=~"r01"}') == []
    finally:
        server.shutdown()
        server.server_close()


class _TrayHandler(_Handler):
    """Three compute trays of 2 GPUs x 18 NVLinks, one per path: link 7 down on one GPU of every tray (switch chip 7),
    link 12 down on node n02's GPU 0 only (a tray-side fault)."""

    def body(self) -> bytes:
        tray = self.path.strip("/")
        lines = []
        for gpu in ("0", "1"):
            for link in range(18):
                down = (link == 7 and gpu == "1") or (tray == "n02" and gpu == "0" and link == 12)
                lines.append(f'supernode_nvlink_up{{gpu="{gpu}",link="{link}"}} {0 if down else 1}')
        return ("\n".join(lines) + "\n").encode()


def test_the_nvlink_domain_matrix_shows_a_switch_chip_as_a_column(tmp_path):
    """The matrix panel: a row per tray (groupingToMatrix rows = node), a column per switch chip (columns = chip,
    zero-padded), each cell the worst link of that index over the tray's GPUs: chip 07 Off on every tray,
    chip 12 Off on n02 only, every other cell On."""
    panel = next(p for p in _dashboards()["nvlink-network"]["panels"] if p["title"].startswith("NVLink domain"))
    assert panel["type"] == "table" and panel["fieldConfig"]["defaults"]["unit"] == "bool_on_off"
    [matrix] = [t["options"] for t in panel["transformations"] if t["id"] == "groupingToMatrix"]
    assert (matrix["rowField"], matrix["columnField"], matrix["valueField"]) == ("node", "chip", "Value")
    assert [s["color"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]] == ["red", "green"]
    [target] = panel["targets"]
    assert target["instant"] and target["format"] == "table"
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _TrayHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    target_addr = f"127.0.0.1:{server.server_address[1]}"
    scrape = [{"job_name": f"tray-{n}", "metrics_path": f"/{n}", "static_configs": [
        {"targets": [target_addr], "labels": {"rack": "r01", "node": n}}]} for n in ("n01", "n02", "n03")]
    try:
        with prometheus_server(tmp_path / "prom", scrape) as prom:
            expr = _concrete(target["expr"])
            wait_for(lambda: len(prom.query(expr)) == 3 * 18, timeout=20, interval=0.2, what="every tray scraped")
            cells = {(r["metric"]["node"], r["metric"]["chip"]): float(r["value"][1]) for r in prom.query(expr)}
            off = sorted(k for k, v in cells.items() if v == 0)
            assert off == [("n01", "chip 07"), ("n02", "chip 07"), ("n02", "chip 12"), ("n03", "chip 07")]
            assert sorted({c for _, c in cells}) == [f"chip {k:02d}" for k in range(18)]
    finally:
        server.shutdown()
        server.server_close()
